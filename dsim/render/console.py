"""The terminal's prose: wrapped where a reader expects, never inside "18.0 %", and piped clean.

rich wraps at any space, so "effective delay 18.0 % → 0.0 %" could end a line
with "18.0" and start the next with "%", and "GPU 2 27 %" could lose its
number. ``wrap_prose`` keeps a number with its unit, an arrow with both its
sides and a "GPU"/"worker"/"rank" with its number and the share after it. Piped output (stdout not a
terminal) goes through ``StripTrailing``: rich pads lines with spaces to the
width, which a terminal hides and a file or ``grep`` keeps.
"""

from __future__ import annotations

import re
import sys
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

#: A token that belongs to the token before it: a unit or a percent sign (with the
#: punctuation that may follow it), or the right side of an arrow.
_UNIT = re.compile(r"^(%|×|ms|µs|s|min|h|pp|MB|GB|MiB|GiB|KiB)(?![\w])[^\w\s]*$")
#: Words whose number follows them: "GPU 3", "worker 0", "rank 2".
_NAMED = {"GPU", "worker", "rank", "epoch"}
_ARROWS = {"→", "->"}
#: "GPU 2" then "27 %": the share a rank's number is followed by stays with it.
_NAMED_NUMBER = re.compile(r"^(GPU|worker|rank) \d+$")
_NUMBER = re.compile(r"^[−-]?\d+(\.\d+)?$")
#: Signs whose number follows them: "> 0.03 s", "≈ 3.24 s".
_SIGNS = {">", "<", "≥", "≤", "=", "≈", "±"}


def _glued(tokens: list[str]) -> list[str]:
    """Tokens joined into the pieces a line may not break inside."""
    pieces: list[str] = []
    glue_next = False
    for token in tokens:
        share = _NUMBER.match(token) is not None and _NAMED_NUMBER.match(
            pieces[-1] if pieces else ""
        )
        joins = pieces and (
            glue_next or share or token in _ARROWS or _UNIT.match(token) is not None
        )
        if joins:
            pieces[-1] += " " + token
        else:
            pieces.append(token)
        glue_next = token in _ARROWS or token in _NAMED or token in _SIGNS
    return pieces


def wrap_prose(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` characters (each starting with ``indent``),
    broken at spaces but never between a number and its unit, around an arrow, or after
    "GPU"/"worker"/"rank"/"epoch". A piece longer than the line stays whole."""
    room = max(width - len(indent), 1)
    lines: list[str] = []
    for paragraph in text.split("\n"):  # a line break the text has is kept
        current = ""
        for piece in _glued(paragraph.split()):
            if current and len(current) + 1 + len(piece) > room:
                lines.append(indent + current)
                current = piece
            else:
                current = f"{current} {piece}" if current else piece
        lines.append(indent + current)
    return lines


class StripTrailing:
    """A text stream that writes whole lines without their trailing spaces.

    What is not yet a whole line waits for its newline (rich ends every print
    with one); ``flush`` passes on only what was written.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        *whole, self._pending = (self._pending + text).split("\n")
        if whole:
            self._stream.write("".join(line.rstrip() + "\n" for line in whole))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8")


def stdout_console() -> Console:
    """The console for a command's answer: rich's own on a terminal; piped or redirected,
    lines without trailing padding."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(file=StripTrailing(sys.stdout))
