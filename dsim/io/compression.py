"""Compressed logs read as the text they hold: gzip, bzip2, xz and zstd, streamed.

A compressed file is recognised by its first bytes (its magic number), never
by its name, so ``rank0.log`` that is really gzip, or ``output.log.gz`` that
is really text, are both read for what they are. The decompressed text is
handed to the same block reader as a plain file (``dsim.sources.rawlog.logfile``), in blocks
of the same size, so the tables and the line numbers of rejects are those of
the plain text, and memory stays bounded by the block size: no file is ever
decompressed whole.

What the readers hash and count is the file as stored (its compressed
bytes): ``run.json`` then lists each source with the size and sha256 a user
gets from ``ls -l`` and ``sha256sum``.

gzip, bzip2 and xz come with Python. zstd needs the ``zstandard`` package
(a dependency of dsim; the standard library has ``compression.zstd`` only
from Python 3.14), imported only when a zstd file is met.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO


@dataclass(frozen=True)
class Format:
    """A compression format: its name, its magic number and its usual file suffix."""

    name: str
    magic: bytes
    suffix: str


FORMATS = (
    Format("gzip", b"\x1f\x8b", ".gz"),
    Format("bzip2", b"BZh", ".bz2"),
    Format("xz", b"\xfd7zXZ\x00", ".xz"),
    Format("zstd", b"\x28\xb5\x2f\xfd", ".zst"),
)
SUFFIXES = tuple(f.suffix for f in FORMATS)
MAGIC_BYTES = max(len(f.magic) for f in FORMATS)
KNOWN = "gzip, bzip2, xz or zstd"

# Binary formats that are not a log and not a compression dsim reads: named, so the
# user learns what the file is rather than that it is not text.
_OTHER_BINARY = (
    (b"PK\x03\x04", "a zip archive, not a text log (unpack it first)"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive, not a text log (unpack it first)"),
    (b"\x04\x22\x4d\x18", "lz4-compressed, which dsim does not read (`lz4 -d` it first)"),
    (b"\x89\x4c\x5a\x4f", "lzop-compressed, which dsim does not read (`lzop -d` it first)"),
    (b"PAR1", "a Parquet file, not a raw log (dsim run reads parsed runs)"),
)

INPUT_BYTES = 32 << 10  # compressed bytes read at once
STEP_BYTES = 1 << 20  # text one bzip2 or xz step may give: bounds memory whatever the ratio
ZSTD_SLICE = 1 << 10  # zstd input fed at once (its decoder has no output bound): <= 32 MiB out
GZIP_SLICE = 8 << 10  # gzip input fed at once: deflate gives <= 1032 bytes a byte, 8 MiB
MAX_RATIO = 1000  # text per stored byte beyond which a file is taken for a decompression bomb
RATIO_FLOOR = 16 << 20  # ... once this much text came out (small files may expand more)


class StreamError(Exception):
    """The compressed data ends early or is corrupt (the caller names the file)."""


def detect(head: bytes) -> Format | None:
    """The compression of a file whose first bytes are ``head``, or ``None`` for anything else."""
    for fmt in FORMATS:
        if head.startswith(fmt.magic):
            return fmt
    return None


def describe_binary(head: bytes, inside: Format | None = None) -> str:
    """What a file whose text starts with ``head`` is, when it holds no log, if dsim knows.

    ``inside``: the compression the text came out of, if any.
    """
    shown = " ".join(f"{b:02x}" for b in head[:8])
    if inside is not None:
        return f"{inside.name}-compressed, but binary inside, not a text log ({shown})"
    for magic, what in _OTHER_BINARY:
        if head.startswith(magic):
            return what
    return f"a binary file, not a text log nor {KNOWN}-compressed (first bytes: {shown})"


def looks_binary(head: bytes) -> bool:
    """Whether a file's first bytes are not text: a NUL byte, or not UTF-8.

    A multi-byte character cut by the end of ``head`` is still text.
    """
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 3 or exc.reason != "unexpected end of data"
    return False


class _Stored(io.RawIOBase):
    """The file as stored: ``head`` (already read) then the rest; hashed and counted as read."""

    def __init__(self, raw: BinaryIO, head: bytes, seen: Callable[[memoryview], None]):
        self.raw = raw
        self.head = head
        self.seen = seen

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.head:
            n = min(len(self.head), len(view))
            view[:n] = self.head[:n]
            self.head = self.head[n:]
        else:
            n = self.raw.readinto(view) or 0
        if n:
            self.seen(view[:n])
        return n


class _Streams(io.RawIOBase):
    """Complete streams (gzip members, bzip2/xz streams, zstd frames), one after another.

    Each stream gets a fresh decompression object, fed ``INPUT_BYTES`` of the
    stored file at a time. One step's text is bounded whatever the ratio:
    bzip2 and xz decoders are asked for at most ``STEP_BYTES``; zstd's take
    no such bound and are fed ``ZSTD_SLICE`` bytes at a time (<= 32 MiB);
    gzip's are fed ``GZIP_SLICE`` (deflate gives at most 1032 bytes a byte:
    <= 8 MiB). A file whose text outgrows ``MAX_RATIO`` times its stored
    bytes read so far (past ``RATIO_FLOOR``) is refused as a decompression
    bomb, so time stops growing with the text long before 10 GB of NULs or
    newlines are read. What follows a finished stream (``unused_data``)
    must be the next stream. The standard library's file readers
    (``BZ2File``, ``LZMAFile``) stop silently at data after a good stream
    that does not decode -- a damaged second stream would lose its records
    without a word -- and ``zstandard``'s stream reader takes a file cut
    short for a complete one; here both are errors. NUL bytes between and
    after gzip members and xz streams are padding, as ``gzip -d`` and ``xz
    -d`` read them.
    """

    def __init__(self, stored: io.RawIOBase, fmt: Format):
        self.stored = stored
        self.fmt = fmt
        self.new, self.errors = _decoder(fmt)
        self.decoder: Any = None
        self.in_stream = False  # bytes of an unfinished stream were fed
        self.data = b""  # stored bytes read and not yet given to a decoder
        self.pending = b""
        self.given = 0  # bytes of ``pending`` already handed out
        self.done = False
        self.fed = 0  # stored bytes given to decoders
        self.out = 0  # text bytes they gave

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while self.given == len(self.pending) and not self.done:
            self.pending, self.given = b"", 0  # a step may give nothing (padding, the end)
            self._step()
        n = min(len(self.pending) - self.given, len(view))
        view[:n] = memoryview(self.pending)[self.given : self.given + n]  # no copy of the rest
        self.given += n
        return n

    def _step(self) -> None:
        """The text of the next step into ``pending``: <= ``STEP_BYTES`` (gzip 8, zstd 32 MiB).

        Bounded output per step: one step of a decompression bomb cannot exhaust memory.
        """
        if not self.data and not self._buffered():
            self.data = self.stored.read(INPUT_BYTES)
            if not self.data:
                if self.in_stream:
                    if self.fmt.name == "zstd":
                        raise StreamError(
                            "zstd data ends in the middle of a frame (file cut short?)"
                        )
                    raise StreamError(f"{self.fmt.name} data ends early (file cut short?)")
                self.done = True
                return
        if not self.in_stream:
            if self.fmt.name in _PADDED:
                self.data = self.data.lstrip(b"\x00")
                if not self.data:
                    return
            self.decoder = self.new()
        try:
            self.pending = self._decompress()
        except self.errors as exc:
            raise StreamError(f"corrupt {self.fmt.name} data ({exc})") from None
        self.in_stream = not self.decoder.eof
        if not self.in_stream:
            self.fed -= len(self.decoder.unused_data)  # fed again to the next stream's decoder
            self.data = self.decoder.unused_data + self.data  # the next stream starts here
        self._check_ratio()

    def _buffered(self) -> bool:
        """Whether the decoder holds input it has not turned into text yet (output was bounded)."""
        d = self.decoder
        if d is None or not self.in_stream:
            return False
        if self.fmt.name in ("bzip2", "xz"):
            return not d.needs_input
        return False

    def _decompress(self) -> bytes:
        """Feed the decoder; what it gives (bounded as ``_step`` says)."""
        d, name = self.decoder, self.fmt.name
        if name in ("bzip2", "xz"):
            data, self.data = (b"", self.data) if not d.needs_input else (self.data, b"")
            self.fed += len(data)
            return d.decompress(data, max_length=STEP_BYTES)
        # gzip: deflate gives at most 1032 bytes a byte, so GZIP_SLICE bounds its step;
        # max_length would halve the speed of ordinary files (measured), so it is not asked.
        size = ZSTD_SLICE if name == "zstd" else GZIP_SLICE
        data, self.data = self.data[:size], self.data[size:]
        self.fed += len(data)
        return d.decompress(data)

    def _check_ratio(self) -> None:
        self.out += len(self.pending)
        if self.out > RATIO_FLOOR and self.out > MAX_RATIO * max(self.fed, 1):
            raise StreamError(
                f"{self.fmt.name} data expands over {MAX_RATIO} times "
                f"({self.fed} bytes to over {self.out}): a decompression bomb? "
                "(if it is a real log, decompress it first)"
            )


_PADDED = ("gzip", "xz")


def _decoder(fmt: Format) -> tuple[Callable[[], Any], tuple[type[Exception], ...]]:
    """A factory of one-stream decompression objects for ``fmt``, and the errors they raise."""
    if fmt.name == "gzip":
        return (lambda: zlib.decompressobj(wbits=31)), (zlib.error,)
    if fmt.name == "bzip2":
        return bz2.BZ2Decompressor, (OSError, ValueError, EOFError)
    if fmt.name == "xz":
        return lzma.LZMADecompressor, (lzma.LZMAError, EOFError)
    import zstandard

    return (lambda: zstandard.ZstdDecompressor().decompressobj()), (zstandard.ZstdError,)


class _Checked(io.RawIOBase):
    """A decompressing reader whose errors become ``StreamError``; reads fill the buffer."""

    def __init__(self, reader: Any, fmt: Format):
        self.reader = reader
        self.fmt = fmt

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):  # blocks as large as the plain path's, not the codec's
            try:
                n = self.reader.readinto(view[filled:])
            except StreamError:
                raise
            except EOFError:
                raise StreamError(f"{self.fmt.name} data ends early (file cut short?)") from None
            except (OSError, lzma.LZMAError, zlib.error, ValueError) as exc:
                raise StreamError(f"corrupt {self.fmt.name} data ({exc})") from None
            if not n:
                break
            filled += n
        return filled


def open_stored(
    raw: BinaryIO, head: bytes, fmt: Format, seen: Callable[[memoryview], None]
) -> io.RawIOBase:
    """The text of a compressed file, from its raw handle and the ``head`` already read from it.

    ``seen`` gets every stored (compressed) byte as it is read: to hash it
    and to report progress. Works on pipes (nothing is read twice).
    """
    return _Checked(_Streams(_Stored(raw, head, seen), fmt), fmt)


def open_text(path: Any) -> BinaryIO:
    """A binary handle on the text of ``path``, decompressed when it is compressed.

    For reading a file a second time (the texts of rejected lines).
    """
    raw = open(path, "rb", buffering=0)  # noqa: SIM115 - the returned reader owns it
    head = b""
    while len(head) < MAGIC_BYTES:
        chunk = raw.read(MAGIC_BYTES - len(head))
        if not chunk:
            break
        head += chunk
    fmt = detect(head)
    if fmt is None:
        raw.seek(0)
        return io.BufferedReader(raw)  # type: ignore[arg-type]
    return _Owning(open_stored(raw, head, fmt, lambda _: None), raw)


def identify(path: Any) -> dict[str, Any]:
    """``size`` and ``sha256`` of a file as stored, and its ``compression`` if any: what
    ``run.json`` lists for a source that was read through ``open_text`` (one more read)."""
    digest, size, head = hashlib.sha256(), 0, b""
    with open(path, "rb") as raw:
        for block in iter(lambda: raw.read(1 << 20), b""):
            if len(head) < MAGIC_BYTES:
                head += block[: MAGIC_BYTES - len(head)]
            digest.update(block)
            size += len(block)
    out: dict[str, Any] = {"size": size, "sha256": digest.hexdigest()}
    fmt = detect(head)
    if fmt is not None:
        out["compression"] = fmt.name
    return out


class _Owning(io.BufferedReader):
    """A buffered reader that also closes the file under its decompressor."""

    def __init__(self, reader: io.RawIOBase, raw: BinaryIO):
        super().__init__(reader)
        self._file = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._file.close()


__all__ = [
    "FORMATS",
    "KNOWN",
    "MAGIC_BYTES",
    "SUFFIXES",
    "Format",
    "StreamError",
    "describe_binary",
    "detect",
    "identify",
    "looks_binary",
    "open_stored",
    "open_text",
]
