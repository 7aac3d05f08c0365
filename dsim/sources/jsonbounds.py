"""Nesting depth and string size of a JSON document, checked on its bytes before a parser sees them.

The streaming parser (``ijson``, yajl) has no bound of its own: it keeps every
open container's path, so memory grows with the square of the nesting depth
(a 40 KB trace nesting 20,000 empty arrays took 1.06 GB, a 200 KB one over
23 GB), and it holds a string whole however long it is (a gzipped trace
holding one 10 GB string never finished). ``BoundedReader`` sits between the
file and the parser and scans each chunk the parser asks for, with a few
vector operations per chunk (no loop over bytes in Python): brackets outside
strings give the depth, quotes not escaped by an odd run of backslashes give
the strings and their lengths. A chunk that goes past a bound raises
``JsonBoundError`` before the parser gets it, so memory stays one chunk plus
what the parser holds for at most ``max_depth`` levels and ``max_string``
bytes, and time stays linear in the input.

Only the bounds are checked here; whether the JSON is valid is the parser's
business (on invalid JSON the scan may count wrong, and the parser fails anyway).
"""

from __future__ import annotations

from typing import Any, BinaryIO

import numpy as np

MAX_DEPTH = 64  # Kineto traces nest 4-6 levels (document, traceEvents, event, args, ...)
MAX_STRING_BYTES = 1 << 20  # the longest JSON string (as stored, escapes included)

_QUOTE, _BACKSLASH = 34, 92
# One ``bytes.translate`` pass classes every byte; only the few that matter are looked at after.
_IS_QUOTE, _IS_OPEN, _IS_CLOSE, _IS_BACKSLASH = 1, 2, 3, 4
_CLASSES = bytes(
    {
        34: _IS_QUOTE,
        91: _IS_OPEN,
        123: _IS_OPEN,
        93: _IS_CLOSE,
        125: _IS_CLOSE,
        92: _IS_BACKSLASH,
    }.get(i, 0)
    for i in range(256)
)


class JsonBoundError(ValueError):
    """The document nests deeper, or holds a longer string, than the bounds allow."""


class BoundedReader:
    """A binary reader that passes a JSON document through, raising at the first exceeded bound.

    State carried from chunk to chunk: the depth, whether a string is open
    and how long it is so far, and the run of backslashes ending the chunk.
    """

    def __init__(
        self, handle: BinaryIO, max_depth: int = MAX_DEPTH, max_string: int = MAX_STRING_BYTES
    ):
        self.handle = handle
        self.max_depth = max_depth
        self.max_string = max_string
        self.offset = 0  # bytes scanned before the current chunk
        self.depth = 0
        self.in_string = False
        self.string_bytes = 0  # of the open string, before the current chunk
        self.backslashes = 0  # the run of backslashes that ended the previous chunk

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        if data:
            self.scan(data)
        return data

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> BoundedReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def scan(self, data: bytes) -> None:
        """Check one chunk and carry the state past it; ``JsonBoundError`` names the byte."""
        b = np.frombuffer(data, dtype=np.uint8)
        classes = np.frombuffer(data.translate(_CLASSES), dtype=np.uint8)
        marked = np.flatnonzero(classes != 0)  # quotes, brackets, backslashes (as bool: 4x faster)
        kinds = classes[marked]
        quotes = self._real_quotes(b, marked[kinds == _IS_QUOTE], (kinds == _IS_BACKSLASH).any())
        starts_inside = int(self.in_string)
        too_long = self._strings(quotes, len(b))
        brackets = kinds != _IS_QUOTE
        brackets &= kinds != _IS_BACKSLASH
        too_deep = self._depth(marked[brackets], kinds[brackets] == _IS_OPEN, quotes, starts_inside)
        if too_long is not None and (too_deep is None or too_long < too_deep):
            raise JsonBoundError(
                f"JSON string longer than {self.max_string} bytes "
                f"(at byte {self.offset + too_long})"
            )
        if too_deep is not None:
            raise JsonBoundError(
                f"JSON nested deeper than {self.max_depth} levels "
                f"(at byte {self.offset + too_deep})"
            )
        self.offset += len(b)

    def _real_quotes(self, b: np.ndarray, quotes: np.ndarray, backslash: bool) -> np.ndarray:
        """Of the ``quotes``, those not escaped (an even run of backslashes before them)."""
        carried, self.backslashes = self.backslashes, _trailing_backslashes(b, self.backslashes)
        if not carried and not backslash:
            return quotes  # no backslash: every quote is real (the common case)
        after = np.zeros(len(quotes), dtype=bool)  # quotes right after a backslash
        inner = quotes > 0
        after[inner] = b[quotes[inner] - 1] == _BACKSLASH
        after[~inner] = carried > 0
        if not after.any():
            return quotes
        plain = np.flatnonzero(b != _BACKSLASH)
        suspects = quotes[after]
        # the last byte before each suspect that is not a backslash (-1 - carried run: none)
        k = np.searchsorted(plain, suspects) - 1
        last = np.where(k >= 0, plain[np.maximum(k, 0)], -1 - carried)
        after[after] = (suspects - 1 - last) % 2 == 1  # an odd run escapes the quote
        return quotes[~after]

    def _strings(self, quotes: np.ndarray, size: int) -> int | None:
        """Carry the open string past the chunk; the byte where a string first
        grows past ``max_string``, or ``None``.

        Quote k of the chunk opens a string when an even number of real quotes
        (an open string at the chunk's start counting as one) come before it.
        """
        inside = int(self.in_string)
        if len(quotes) and self._short(quotes, size):
            self.in_string = (len(quotes) + inside) % 2 == 1
            self.string_bytes = size - int(quotes[-1]) - 1 if self.in_string else 0
            return None
        opens = (np.arange(len(quotes)) + inside) % 2 == 0
        firsts = quotes[opens] + 1  # each string's first byte
        if inside:  # the string carried in began string_bytes before the chunk
            firsts = np.concatenate(([-self.string_bytes], firsts))
        ends = np.append(quotes[~opens], size)[: len(firsts)]  # its closing quote, or the end
        over = np.flatnonzero(ends - firsts > self.max_string)
        self.in_string = (len(quotes) + inside) % 2 == 1
        self.string_bytes = size - int(firsts[-1]) if self.in_string else 0
        return int(firsts[over[0]] + self.max_string) if len(over) else None

    def _short(self, quotes: np.ndarray, size: int) -> bool:
        """Whether no run between quotes is long enough to hide a string too long (one pass)."""
        head = int(quotes[0]) + self.string_bytes if self.in_string else 0
        gaps = int(np.diff(quotes).max()) - 1 if len(quotes) > 1 else 0
        return max(head, gaps, size - int(quotes[-1]) - 1) <= self.max_string

    def _depth(
        self, brackets: np.ndarray, opens: np.ndarray, quotes: np.ndarray, starts_inside: int
    ) -> int | None:
        """Carry the depth past the chunk; the byte of the first bracket too deep, or ``None``."""
        if not len(brackets):
            return None
        outside = (np.searchsorted(quotes, brackets) + starts_inside) % 2 == 0
        brackets, opens = brackets[outside], opens[outside]
        if not len(brackets):
            return None
        depths = self.depth + np.cumsum(np.where(opens, 1, -1))
        self.depth = int(depths[-1])
        over = np.flatnonzero(depths > self.max_depth)
        return int(brackets[over[0]]) if len(over) else None


def _trailing_backslashes(b: np.ndarray, carried: int) -> int:
    """The run of backslashes that ends the chunk (with the one carried in, if the chunk is all)."""
    if not len(b) or b[-1] != _BACKSLASH:
        return 0
    plain = np.flatnonzero(b != _BACKSLASH)
    return len(b) - 1 - int(plain[-1]) if len(plain) else len(b) + carried


__all__ = ["MAX_DEPTH", "MAX_STRING_BYTES", "BoundedReader", "JsonBoundError"]
