"""``dsim.sets`` against ``np.unique`` on random integer arrays (property tests)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays, integer_dtypes, unsigned_integer_dtypes

from dsim.sets import distinct, distinct_inverse

INTEGERS = st.one_of(integer_dtypes(endianness="="), unsigned_integer_dtypes(endianness="="))


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@settings(max_examples=300, deadline=None)
@given(arrays(INTEGERS, st.integers(0, 300)))
def test_distinct_is_np_unique(values: np.ndarray) -> None:
    _same(distinct(values), np.unique(values))


@settings(max_examples=300, deadline=None)
@given(arrays(INTEGERS, st.integers(0, 300)))
def test_distinct_inverse_is_np_unique_with_inverse(values: np.ndarray) -> None:
    ids, inverse = distinct_inverse(values)
    want_ids, want_inverse = np.unique(values, return_inverse=True)
    _same(ids, want_ids)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))
    np.testing.assert_array_equal(ids[inverse], values)


def test_both_paths_are_taken() -> None:
    """A small span is counted, a wide one sorted (keys of several epochs: epoch << 32):
    both give ``np.unique``'s answer, so neither path is left untested."""
    keys = np.repeat(np.arange(5, dtype=np.int64), 3)
    wide = np.concatenate([keys, keys + (7 << 32)])[::-1].copy()
    for values in (keys[::-1].copy(), wide):
        _same(distinct(values), np.unique(values))
        ids, inverse = distinct_inverse(values)
        _same(ids, np.unique(values))
        np.testing.assert_array_equal(ids[inverse], values)


def test_the_ends_of_each_integer_type() -> None:
    """Values at a dtype's ends, where ``value - min`` overflows a narrow signed dtype and
    the minimum of a ``uint64`` does not fit an ``int64``."""
    for dtype in (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.uint64):
        info = np.iinfo(dtype)
        for values in ([info.min, info.min + 3, info.min], [info.max, info.max - 2, info.max]):
            array = np.array(values, dtype)
            _same(distinct(array), np.unique(array))
            ids, inverse = distinct_inverse(array)
            _same(ids, np.unique(array))
            np.testing.assert_array_equal(ids[inverse], array)
        full = np.array([info.max, info.min, 0], dtype)  # a span too wide to count, or not
        _same(distinct(full), np.unique(full))
