"""Lines of text built column by column in a byte matrix, not line by line.

Synthetic runs have hundreds of millions of lines; formatting each with
Python string operations would dominate the run time. Here every field of n
lines is converted at once, four digits per table look-up (see ``Lines``).
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from dsim.synth.params import UNIX_EPOCH, US_PER_DAY, US_PER_S

# Four ASCII digits per table entry, read back as one uint32: converting a number
# costs one division per four digits instead of one per digit.
_DIGITS4 = np.array([f"{i:04d}".encode() for i in range(10_000)], dtype="S4").view(np.uint32)


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """[n] non-negative ints -> [n, width] ASCII digits, zero-padded on the left."""
    groups = -(-width // 4)
    quads = np.empty((values.shape[0], groups), dtype=np.uint32)
    v = values.astype(np.int64, copy=True)
    for group in range(groups - 1, -1, -1):
        quads[:, group] = _DIGITS4[v % 10_000]
        v //= 10_000
    return quads.view(np.uint8).reshape(values.shape[0], 4 * groups)[:, 4 * groups - width :]


def _width(values: np.ndarray) -> int:
    top = int(values.max()) if values.size else 0
    return max(1, len(str(top)))


class Lines:
    """Builds n lines column by column as a byte matrix plus a mask of the bytes to keep.

    Compressing ``matrix[mask]`` in row-major order concatenates the lines, so
    variable-width fields cost no per-line Python. Constant text is written
    once into a template row; only the number columns are written per line.
    """

    def __init__(self, n: int):
        self.n = n
        self.width = 0
        self.template: list[bytes] = []
        # (first column, digits [n, w], shown [n, w] or None)
        self.fields: list[tuple[int, np.ndarray, np.ndarray | None]] = []

    def text(self, text: str) -> None:
        raw = text.encode("ascii")
        self.template.append(raw)
        self.width += len(raw)

    def _put(self, digits: np.ndarray, shown: np.ndarray | None) -> None:
        self.fields.append((self.width, digits, shown))
        self.template.append(b"\0" * digits.shape[1])
        self.width += digits.shape[1]

    def uint(self, values: np.ndarray, pad_to: int | None = None) -> None:
        """Decimal integer; with ``pad_to``, right-aligned in that many columns with spaces."""
        width = max(_width(values), pad_to or 1)
        self._integer(values, _digits(values, width), pad_to is not None)

    def _integer(self, values: np.ndarray, digits: np.ndarray, pad: bool) -> None:
        """Put ``digits`` of ``values`` without their leading zeros (dropped or blanked)."""
        width = digits.shape[1]
        if width == 1:
            self._put(digits, None)
            return
        powers = 10 ** np.arange(width - 1, 0, -1, dtype=np.int64)
        hidden = np.zeros((self.n, width), dtype=bool)
        hidden[:, :-1] = values[:, None] < powers
        if pad:
            digits = digits.copy()
            digits[hidden] = ord(" ")
            self._put(digits, None)
        else:
            self._put(digits, ~hidden)

    def fixed(self, values: np.ndarray, decimals: int) -> None:
        """Fixed-point number given as integer units of 10**-decimals."""
        whole = values // 10**decimals
        width = _width(whole)
        digits = _digits(values, width + decimals)  # one conversion for both parts
        self._integer(whole, digits[:, :width], pad=False)
        self.text(".")
        self._put(digits[:, width:], None)

    def timestamp(self, us: np.ndarray) -> None:
        """``YYYY-mm-dd HH:MM:SS.ffffff`` from µs since 1970; dates come from a per-day table."""
        days = us // US_PER_DAY
        first = int(days.min())
        table = np.array(
            [
                (UNIX_EPOCH + dt.timedelta(days=first + d)).strftime("%Y-%m-%d ").encode()
                for d in range(int(days.max()) - first + 1)
            ]
        )
        self._put(table.view(np.uint8).reshape(-1, 11)[days - first], None)
        tod = us - days * US_PER_DAY
        seconds = tod // US_PER_S
        hhmmss = seconds // 3600 * 10_000 + seconds // 60 % 60 * 100 + seconds % 60
        clock = _digits(hhmmss * US_PER_S + tod % US_PER_S, 12)
        self._put(clock[:, :2], None)
        self.text(":")
        self._put(clock[:, 2:4], None)
        self.text(":")
        self._put(clock[:, 4:6], None)
        self.text(".")
        self._put(clock[:, 6:], None)

    def build(self, matrix: np.ndarray, mask: np.ndarray) -> None:
        """Fill ``matrix`` and ``mask`` [n, >= width]; columns past this width are dropped."""
        template = np.frombuffer(b"".join(self.template), dtype=np.uint8)
        matrix[:, : self.width] = template
        mask[:, : self.width] = True
        mask[:, self.width :] = False
        for col, digits, shown in self.fields:
            span = digits.shape[1]
            matrix[:, col : col + span] = digits
            if shown is not None:
                mask[:, col : col + span] = shown
