"""Allow ``python -m dsim``."""

from dsim.cli import main

main()
