"""The byte-level JSON bounds scan against a byte-at-a-time reference, chunked every way."""

from __future__ import annotations

import io
import random

import pytest

from dsim.sources.jsonbounds import BoundedReader, JsonBoundError


def _reference(data: bytes, max_depth: int, max_string: int) -> str | None:
    """The first bound crossed, reading one byte at a time: "string", "depth" or None.

    Backslashes escape the next byte everywhere (outside strings JSON has none), as the
    scan counts them.
    """
    depth, inside, escaped, length = 0, False, False, 0
    for c in data:
        if c == 92:
            escaped = not escaped
            if inside:
                length += 1
                if length > max_string:
                    return "string"
            continue
        was, escaped = escaped, False
        if inside:
            if c == 34 and not was:
                inside = False
            else:
                length += 1
                if length > max_string:
                    return "string"
        elif c == 34 and not was:
            inside, length = True, 0
        elif c in (91, 123):
            depth += 1
            if depth > max_depth:
                return "depth"
        elif c in (93, 125):
            depth -= 1
    return None


def _scanned(data: bytes, max_depth: int, max_string: int, chunk: int) -> str | None:
    reader = BoundedReader(io.BytesIO(data), max_depth, max_string)
    try:
        while reader.read(chunk):
            pass
    except JsonBoundError as exc:
        return "string" if "string" in str(exc) else "depth"
    return None


def test_the_scan_finds_the_first_bound_crossed_wherever_the_chunks_end():
    rng = random.Random(1)
    alphabet = b'[]{}"\\\\ab,:'
    for case in range(1500):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        max_depth, max_string = rng.randint(1, 5), rng.randint(0, 8)
        want = _reference(data, max_depth, max_string)
        for chunk in (1, 2, 3, 7, 100):
            got = _scanned(data, max_depth, max_string, chunk)
            assert got == want, (case, data, max_depth, max_string, chunk)


def test_errors_name_the_byte_and_the_bound():
    deep = b"[" * 5
    with pytest.raises(JsonBoundError, match=r"JSON nested deeper than 4 levels \(at byte 4\)"):
        BoundedReader(io.BytesIO(deep), 4, 10).read()
    long = b'["' + b"a" * 11 + b'"]'
    with pytest.raises(JsonBoundError, match=r"JSON string longer than 10 bytes \(at byte 12\)"):
        BoundedReader(io.BytesIO(long), 4, 10).read()
    escaped = b'["' + b'\\"' * 5 + b'"]'  # 10 bytes as stored: at the bound, not past it
    assert BoundedReader(io.BytesIO(escaped), 4, 10).read() == escaped
