"""Wall-clock timestamps ``YYYY-mm-dd HH:MM:SS`` to seconds since 1970, validated.

Log timestamps carry no time zone; dsim keeps them as naive wall-clock
nanoseconds. A date that does not exist (February 30, hour 24) is invalid,
never rolled over to another day. The calendar is integer arithmetic over
whole arrays (proleptic Gregorian, days from civil), because a per-line
``strptime``/``strftime`` round trip costs more than the rest of the parse.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsim.io.arrowtables import array_of, flags_of, numpy_of

_TS_WIDTH = 19  # YYYY-mm-dd HH:MM:SS
_TS_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])
_DAYS_IN_MONTH = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
# Years whose times fit int64 nanoseconds (numpy's datetime64[ns] ends in April 2262), from
# the Unix epoch on: anything else is a corrupt year, and multiplied out to nanoseconds it
# would wrap around silently.
FIRST_YEAR, LAST_YEAR = 1970, 2261


def civil_seconds(text: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """Seconds since 1970 of ``YYYY-mm-dd HH:MM:SS`` texts and which ones are real times.

    Arrow's strftime, needed to catch dates that strptime rolls over, costs
    about 4 µs a line -- more than the rest of the grammar together. The
    pattern already puts a digit at each of 14 fixed places, so the fields are
    columns of a byte matrix and the calendar is integer arithmetic
    (proleptic Gregorian, days from civil). Returns ``None`` when the texts are
    not all such (then the slow path decides).
    """
    n = len(text)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    if text.null_count:
        return None
    text = text.cast(pa.large_string())
    _, offsets_buf, data_buf = text.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[text.offset : text.offset + n + 1]
    if not (np.diff(offsets) == _TS_WIDTH).all():
        return None
    raw = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(n, _TS_WIDTH)
    d = raw[:, _TS_DIGITS].astype(np.int64) - 48
    if ((d < 0) | (d > 9)).any():
        return None
    return civil_from_digits(d)


def civil_from_digits(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since 1970 from the 14 digits of ``YYYYmmddHHMMSS`` (int64 rows), and validity."""
    century, yy, month, day, hour, minute, second = (d[:, 0::2] * 10 + d[:, 1::2]).T
    return civil(century * 100 + yy, month, day, hour, minute, second)


def civil(year, month, day, hour, minute, second) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since 1970 of civil times given field by field (int64 arrays), and validity.

    Lines in a block nearly all share a date, so the calendar (the costly
    part) runs once per run of equal dates, not once per line.
    """
    n = len(year)
    date = (year * 100 + month) * 100 + day
    change = np.ones(n, dtype=bool)
    change[1:] = date[1:] != date[:-1]
    first = np.flatnonzero(change)
    if len(first) * 4 < n:
        days, ok = _days(year[first], month[first], day[first])
        which = np.cumsum(change) - 1
        days, ok = days[which], ok[which]
    else:
        days, ok = _days(year, month, day)
    ok &= (hour < 24) & (minute < 60) & (second < 60)
    ok &= (year >= FIRST_YEAR) & (year <= LAST_YEAR)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second
    return np.where(ok, seconds, 0), ok


def _days(year, month, day) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970 of real dates (proleptic Gregorian), and which dates are real."""
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    good_month = (month >= 1) & (month <= 12)
    days_in_month = _DAYS_IN_MONTH[np.where(good_month, month, 0)] + (leap & (month == 2))
    ok = good_month & (day >= 1) & (day <= days_in_month)
    # Days from civil (H. Hinnant): March-based years make February the last month.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468, ok


def civil_seconds_arrow(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The general path: strptime, and a strftime round trip against rolled-over dates."""
    fmt = "%Y-%m-%d %H:%M:%S"
    seconds = pc.strptime(text, format=fmt, unit="s", error_is_null=True)
    same = pc.equal(pc.strftime(seconds, format=fmt), text)
    ok = flags_of(same)  # a null (no such time): False
    cast = pc.cast(seconds, pa.int64())
    parsed = flags_of(pc.is_valid(cast))
    whole = np.zeros(len(text), np.int64)  # 0 where it did not parse, as fill_null(0)
    whole[parsed] = numpy_of(cast.filter(array_of(parsed)))
    ok &= (whole >= _FIRST_SECOND) & (whole < _AFTER_LAST_SECOND)
    return np.where(ok, whole, 0), ok


_FIRST_SECOND = 0  # 1970-01-01 00:00:00
_AFTER_LAST_SECOND = int(
    (np.datetime64(f"{LAST_YEAR + 1}-01-01", "s") - np.datetime64("1970-01-01", "s")).astype(int)
)
