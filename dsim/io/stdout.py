"""Writing a command's output to stdout whole, or failing as a closed pipe must.

Why: CPython's buffered stdout drops the rest of a large write without an error when
the reader goes away after reading part of it (`dsim report --out - | head -c 10`:
the kernel's write returns the bytes taken, the buffered layer loses the remainder
and the command exited 0). Written with ``os.write`` until every byte is taken, the
next write after the reader left raises ``BrokenPipeError``, which the CLI ends with
exit 141 (SPEC §9).
"""

from __future__ import annotations

import io
import os
import sys


def write_stdout(data: str | bytes) -> None:
    """``data`` to stdout, every byte or ``BrokenPipeError`` (str as stdout encodes it)."""
    stream = sys.stdout
    encoding = stream.encoding or "utf-8"
    if isinstance(data, str):
        data = data.encode(encoding, stream.errors or "strict")
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # captured, not a file
        if hasattr(stream, "buffer"):
            stream.buffer.write(data)
        else:
            stream.write(data.decode(encoding))
        stream.flush()
        return
    stream.flush()  # what was printed before goes first
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
