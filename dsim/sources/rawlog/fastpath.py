"""The canonical fast path of the raw-log grammar.

RE2 inside Arrow costs about 150 ns a line before it reads a byte, and the
general patterns (a lazy prefix, optional groups) about 1 µs. Nearly every
real line is spelled exactly as docs/SPEC.md §1 shows it: no prefix, single
separators. Such a line is a fixed sequence of literals and bounded runs of
digits, so it can be checked and cut by position over the whole block at
once, one field after the other, each step one vector operation over all
lines. A line is taken here only if every byte is where the canonical
spelling puts it and every value is valid; anything else (and any doubt)
goes to the general path, so the result is the same either way.

The work is column-wise: every step gathers one 8-byte word per line at that
line's current offset (an unaligned little-endian view of the buffer) and
answers its question for all 8 bytes at once with bit arithmetic (SWAR): is
this the literal, how long is the run of digits, what is its value.
Row-wise windows ([lines, width] bytes reduced along the short axis) cost
several times more.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsim.io.arrowtables import numpy_of
from dsim.sources.rawlog import bounds
from dsim.sources.rawlog.wallclock import civil

_REACH = 512  # no word of a canonical line is read further than this from its start
_U = np.uint64
_LOW7 = _U(0x7F7F7F7F7F7F7F7F)
_HIGH = _U(0x8080808080808080)
_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_POW10_U = _POW10.astype(np.uint64)
_POW10_F = 10.0 ** np.arange(23)  # exact doubles up to 10^22
_EXACT = 1 << 53  # integers below this are exact doubles
_STAGE_KEYS = ("read_s", "read_cpu_s", "collate_s", "collate_cpu_s")  # as the general path
_STAGE_LABELS = (b" read ", b" read_cpu ", b" collate ", b" collate_cpu ")
_FETCH_KEYS = (
    *("gpu", "worker", "idx", "end", "end_digits", "fetch_s", "cpu_s", "runq_s", "proc_cpu_s"),
    *_STAGE_KEYS,
    "stream",
)
_TRAIN_KEYS = (  # as the general path
    *("gpu", "epoch", "iteration", "total", "start"),
    *("iteration_s", "stall_s", "throughput", "cpu_s", "runq_s"),
)


def _words(buf: np.ndarray) -> np.ndarray:
    """Every byte offset of ``buf`` as the start of an 8-byte record (indexing copies the bytes).

    ``V8`` has alignment 1, so NumPy gathers it with plain 8-byte copies; the
    unaligned ``<u8`` view would take a slow element-by-element path.
    """
    return np.ndarray((len(buf) - 7,), dtype="V8", buffer=buf, strides=(1,))


def _word(words: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The 8 bytes at each ``pos`` as little-endian integers: byte ``pos`` is the lowest."""
    return words[pos].view("<u8")


def _not_digit(x: np.ndarray) -> np.ndarray:
    """High bit of each byte that is not an ASCII digit (exact: no carry crosses a byte)."""
    t = x ^ _U(0x3030303030303030)
    return (((t & _LOW7) + _U(0x7676767676767676)) | t) & _HIGH


def _not_byte(x: np.ndarray, byte: int) -> np.ndarray:
    """High bit of each byte that differs from ``byte``."""
    t = x ^ _U(byte * 0x0101010101010101)
    return (((t & _LOW7) + _LOW7) | t) & _HIGH


def _not_number(x: np.ndarray) -> np.ndarray:
    """High bit of each byte that is neither a digit nor a point."""
    return _not_digit(x) & _not_byte(x, 46)


def _not_space(x: np.ndarray) -> np.ndarray:
    return _not_byte(x, 32)


def _bit_count(x: np.ndarray) -> np.ndarray:
    """Bits set in each uint64, as uint8: ``np.bitwise_count`` for NumPy 1.x, which lacks it.

    The classic SWAR population count; every step is exact in uint64 (the
    final multiply wraps by design and keeps the sum in the top byte).
    """
    x = x - ((x >> _U(1)) & _U(0x5555555555555555))
    x = (x & _U(0x3333333333333333)) + ((x >> _U(2)) & _U(0x3333333333333333))
    x = (x + (x >> _U(4))) & _NIBBLES
    return ((x * _U(0x0101010101010101)) >> _U(56)).astype(np.uint8)


# NumPy >= 2.0 has the ufunc (one instruction a word); 1.x takes the exact fallback.
_popcount = getattr(np, "bitwise_count", _bit_count)


def _first(mask: np.ndarray) -> np.ndarray:
    """Index of the first byte whose high bit is set; 8 when none is (count trailing zeros / 8)."""
    return _popcount((mask - _U(1)) & ~mask) >> np.uint8(3)  # uint8: fewer bytes to move


def _swar(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Value of the ``n`` (0..8) digits at the low end of each word (the classic SWAR reduction).

    Shifting left by the bytes after the run drops them and puts leading zeros
    in front: the first digit, the lowest byte, is the most significant.
    """
    x = (x << ((8 - n) << np.uint8(3))) & _NIBBLES
    x = (x * _U(10 * 256 + 1)) >> _U(8)
    x = ((x & _U(0x00FF00FF00FF00FF)) * _U(100 * 65536 + 1)) >> _U(16)
    return ((x & _U(0x0000FFFF0000FFFF)) * _U(10000 * (1 << 32) + 1)) >> _U(32)


def _span(words: np.ndarray, pos: np.ndarray, outside, count: int) -> np.ndarray:
    """Length of the run of bytes from ``pos`` that ``outside`` does not flag, at most 8 * count.

    A run that fills all ``count`` words reads as exactly 8 * count: callers treat it as too long.
    """
    n = _first(outside(_word(words, pos)))
    rows = np.flatnonzero(n == 8)
    for k in range(1, count):
        if len(rows) == 0:
            break
        m = _first(outside(_word(words, pos[rows] + 8 * k)))
        n[rows] += m
        rows = rows[m == 8]
    return n


def _digits(words: np.ndarray, pos: np.ndarray, count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Value (uint64) and length of the run of digits at ``pos``, reading at most ``count`` words.

    The length is exact below 8 * count (8 * count means "at least"); the value
    is exact for runs of at most 16 digits.
    """
    x = _word(words, pos)
    n = _first(_not_digit(x))
    value = _swar(x, n)
    rows = np.flatnonzero(n == 8)
    if count > 1 and len(rows):
        y = _word(words, pos[rows] + 8)
        m = _first(_not_digit(y))
        value[rows] = value[rows] * _POW10_U[m] + _swar(y, m)
        n[rows] += m
        rows = rows[m == 8]
        if count > 2 and len(rows):
            n[rows] += _span(words, pos[rows] + 16, _not_digit, count - 2)
    return value, n


def _lit(words: np.ndarray, pos: np.ndarray, text: bytes) -> np.ndarray:
    """Whether ``text`` is at each ``pos``: whole words compared with constants."""
    ok = None
    for k in range(0, len(text), 8):
        chunk = text[k : k + 8]
        x = _word(words, pos + k if k else pos)
        if len(chunk) < 8:
            x = x & _U((1 << (8 * len(chunk))) - 1)
        same = x == _U(int.from_bytes(chunk, "little"))
        ok = same if ok is None else ok & same
    return ok


def _number(
    words: np.ndarray, raw: np.ndarray, pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A plain decimal ``digits[.digits]`` at ``pos``: value, length, ok, and value exact.

    ``m`` digits in all with ``k`` after the point are the integer ``m``
    divided by 10^k; while both are exact doubles (``m`` < 2^53, k <= 22) one
    IEEE division rounds the true quotient correctly, which is what any
    correct decimal parser (Arrow's cast included) returns. Longer numbers are
    left to Arrow (``exact`` False).
    """
    whole, a = _digits(words, pos, 2)
    point = raw[pos + a] == 46
    frac, b = _digits(words, pos + a + 1, 3)
    b = np.where(point, b, 0)
    length = a + point + b
    ok = (a >= 1) & (a < 16) & ~(point & ((b < 1) | (b >= 24)))
    mantissa = whole * _POW10_U[np.minimum(b, 18)] + np.where(point, frac, _U(0))
    exact = (a + b <= 16) & (mantissa < _U(_EXACT))
    value = mantissa.view(np.int64).astype(np.float64) / _POW10_F[np.minimum(b, 22)]
    return value, length, ok, exact


def _arrow_floats(raw: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Tokens at ``pos`` as float64 by Arrow's cast (the general path's parser), to the bit."""
    if len(pos) == 0:
        return np.zeros(0)
    offsets = np.concatenate(([0], np.cumsum(length))).astype(np.int64)
    flat = np.repeat(pos - offsets[:-1], length) + np.arange(offsets[-1])
    text = pa.LargeStringArray.from_buffers(
        len(pos), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(raw[flat]))
    )
    return numpy_of(pc.cast(text, pa.float64()))


def _float_values(raw, pos, length, value, exact, rows) -> np.ndarray:
    """``value`` at ``rows``, with Arrow's parse where the quick one is not exact."""
    out = value[rows]
    slow = np.flatnonzero(~exact[rows])
    if len(slow):
        out[slow] = _arrow_floats(raw, pos[rows[slow]], length[rows[slow]])
    return out


def fast_records(
    lines: pa.LargeStringArray, numbers: np.ndarray, max_duration: float
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Records of the canonical lines, and the indices of all other lines (for the general path).

    Values outside the bounds of ``dsim.sources.rawlog.bounds`` (``max_duration`` seconds and
    the rest) are left to the general path, which names the reason they are
    rejected.

    Lines near the end of the buffer are cut from a zero-padded copy of the
    tail so that every word read stays inside memory.
    """
    n = len(lines)
    _, offsets_buf, data_buf = lines.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[lines.offset : lines.offset + n + 1]
    raw = np.frombuffer(data_buf, dtype=np.uint8)[: offsets[-1]]
    starts, ends = offsets[:-1], offsets[1:]
    split = int(np.searchsorted(starts, len(raw) - _REACH, side="right"))
    tail0 = int(starts[split]) if split < n else len(raw)
    padded = np.concatenate([raw[tail0:], np.zeros(_REACH, dtype=np.uint8)])
    fetch_parts, train_parts, taken = [], [], []
    for buf, lo, hi, shift in ((raw, 0, split, 0), (padded, split, n, tail0)):
        if hi > lo:
            f_rows, fetch, t_rows, train = _cut(
                buf, starts[lo:hi] - shift, ends[lo:hi] - shift, max_duration
            )
            fetch_parts.append({"line": numbers[lo + f_rows]} | {k: fetch[k] for k in _FETCH_KEYS})
            train_parts.append({"line": numbers[lo + t_rows]} | {k: train[k] for k in _TRAIN_KEYS})
            taken += [lo + f_rows, lo + t_rows]
    keep = np.ones(n, dtype=bool)
    keep[np.concatenate(taken)] = False
    return _stack(fetch_parts), _stack(train_parts), np.flatnonzero(keep)


def _stack(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _byte(word: np.ndarray, k: int) -> np.ndarray:
    return ((word >> _U(8 * k)) & _U(0xFF)).view(np.int64)


# The timestamp ``YYYY-mm-dd HH:MM:SS.f``: three words from the line start; per word the
# bytes that must be digits and the separators (mask, value) at their places.
_TS_WORDS = ((b"dddd-dd-", 0), (b"dd dd:dd", 8), (b":dd.", 16))


def _ts_checks():
    out = []
    for pattern, at in _TS_WORDS:
        digit = sum(0x80 << (8 * i) for i, c in enumerate(pattern) if c == ord("d"))
        sep = sum(0xFF << (8 * i) for i, c in enumerate(pattern) if c != ord("d"))
        value = sum(c << (8 * i) for i, c in enumerate(pattern) if c != ord("d"))
        out.append((at, _U(digit), _U(sep), _U(value)))
    return out


_TS_CHECKS = _ts_checks()


def _pairs(word: np.ndarray) -> np.ndarray:
    """Byte k becomes 10 * digit k + digit k+1: two-digit fields read off single bytes."""
    return ((word & _NIBBLES) * _U(10 * 256 + 1)) >> _U(8)


def _cut(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_duration: float):
    """Cut canonical lines at ``starts`` (exclusive ``ends``) of ``raw``: fetch and train rows."""
    words = _words(raw)
    content_end = ends - (raw[ends - 1] == 10)
    content_end = content_end - ((content_end > starts) & (raw[content_end - 1] == 13))
    ok = None
    ts = []
    for at, digit, sep, value in _TS_CHECKS:
        w = _word(words, starts + at)
        good = ((_not_digit(w) & digit) == 0) & ((w & sep) == value)
        ok = good if ok is None else ok & good
        ts.append(_pairs(w))
    frac, frac_len = _digits(words, starts + 20, 2)
    ok &= (frac_len >= 1) & (frac_len <= 9) & (raw[starts + 20 + frac_len] == 32)
    kind_at = starts + 21 + frac_len
    kind = raw[kind_at]
    f_rows = np.flatnonzero(ok & (kind == ord("D")))
    t_rows = np.flatnonzero(ok & (kind == ord("G")))
    f_ok, fetch = _cut_fetch(words, raw, kind_at[f_rows], content_end[f_rows], max_duration)
    t_ok, train = _cut_train(words, raw, kind_at[t_rows], content_end[t_rows], max_duration)
    f_rows, t_rows = f_rows[f_ok], t_rows[t_ok]  # the values are of these rows only
    w0, w1, w2 = ts
    frac_ns = frac.view(np.int64) * _POW10[9 - np.minimum(frac_len, 9)]
    ns = []
    for rows in (f_rows, t_rows):
        a, b = w0[rows], w1[rows]
        year = _byte(a, 0) * 100 + _byte(a, 2)
        fields = (_byte(a, 5), _byte(b, 0), _byte(b, 3), _byte(b, 6), _byte(w2[rows], 1))
        whole, ts_ok = civil(year, *fields)
        ns.append((whole * 1_000_000_000 + frac_ns[rows], ts_ok))
    (fetch["end"], f_ts), (train["start"], t_ts) = ns
    fetch["end_digits"] = frac_len[f_rows].astype(np.int8)
    if not f_ts.all():
        fetch = {k: v[f_ts] for k, v in fetch.items()}
        f_rows = f_rows[f_ts]
    if not t_ts.all():
        train = {k: v[t_ts] for k, v in train.items()}
        t_rows = t_rows[t_ts]
    return f_rows, fetch, t_rows, train


def _taken(value: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return value[rows].view(np.int64)


def _cut_fetch(
    words: np.ndarray, raw: np.ndarray, at: np.ndarray, end: np.ndarray, max_duration: float
):
    """``DEBUG:\\tGPU: g worker_id: w, END FETCH at_time a data idxi`` from ``at`` to ``end``."""
    ok = _lit(words, at, b"DEBUG:\tGPU: ")
    gpu, gpu_len = _digits(words, at + 12)
    p = at + 12 + gpu_len
    ok &= (gpu_len >= 1) & (gpu_len <= 6) & _lit(words, p, b" worker_id: ")
    worker, worker_len = _digits(words, p + 12)
    p = p + 12 + worker_len
    ok &= (worker_len >= 1) & (worker_len <= 6) & _lit(words, p, b", END FETCH at_time ")
    tok_at = p + 20
    value, tok_len, tok_ok, exact = _number(words, raw, tok_at)
    p = tok_at + tok_len
    ok &= tok_ok & _lit(words, p, b" data idx")
    idx, idx_len = _digits(words, p + 9, 2)
    q = p + 9 + idx_len
    # Optionally `` stream K`` (an IterableDataset's batch), `` cpu C``, then `` runq Q``,
    # then `` proc P`` (SPEC §1.2), then the line's end. Logs without them (every log before
    # CPU times) skip the look: this is the hot path. Then, with
    # instrument_loader(stages=True), `` read R read_cpu C collate L collate_cpu D``.
    cpu_ok = runq_ok = proc_ok = has_stream = np.zeros(len(q), dtype=bool)
    cpu_tok = runq_tok = proc_tok = stream = None
    stage_ok, stage_toks = np.zeros(len(q), dtype=bool), []
    if (q != end).any():
        has_stream = _lit(words, q, b" stream ") & (q < end)
        if has_stream.any():
            stream, stream_len = _digits(words, q + 8, 2)
            has_stream &= (stream_len >= 1) & (stream_len <= 9)
            q = np.where(has_stream, q + 8 + stream_len, q)
        cpu_ok, cpu_tok, q_cpu = _suffix(words, raw, q, b" cpu ")
        runq_ok, runq_tok, q_runq = _suffix(words, raw, q_cpu, b" runq ")
        runq_ok &= cpu_ok
        after_cpu = np.where(runq_ok, q_runq, q_cpu)
        proc_ok, proc_tok, q_proc = _suffix(words, raw, after_cpu, b" proc ")
        proc_ok &= cpu_ok
        after_cpu = np.where(proc_ok, q_proc, after_cpu)
        tail = np.where(cpu_ok, after_cpu, q)  # where the stages start
        if (tail != end).any():  # logs without stages skip the look
            s, stage_ok = tail, np.ones(len(q), dtype=bool)
            for label in _STAGE_LABELS:  # each step reads a bounded span: stays inside _REACH
                here, tok, s = _suffix(words, raw, s, label)
                stage_ok &= here
                stage_toks.append(tok)
            stage_ok &= s == end
        proc_ok &= (q_proc == end) | stage_ok
        runq_ok &= (q_runq == end) | stage_ok | proc_ok
        cpu_ok &= (q_cpu == end) | runq_ok | proc_ok | (stage_ok & (tail == q_cpu))
    ok &= (idx_len >= 1) & (idx_len <= 9) & ((q == end) | cpu_ok | stage_ok)
    rows = np.flatnonzero(ok)
    fetch_s = _float_values(raw, tok_at, tok_len, value, exact, rows)
    good = bounds.fetch_ok(fetch_s, max_duration)  # the general path names the reason otherwise
    optional = {
        "cpu_s": _optional_values(raw, cpu_tok, cpu_ok, rows),
        "runq_s": _optional_values(raw, runq_tok, runq_ok, rows),
        "proc_cpu_s": _optional_values(raw, proc_tok, proc_ok, rows),
    }
    for key, tok in zip(_STAGE_KEYS, stage_toks or [None] * 4, strict=True):
        optional[key] = _optional_values(raw, tok, stage_ok, rows)
    for values in optional.values():
        good &= _seconds_ok(values, max_duration)
    good &= ~bounds.beyond_span(fetch_s, optional["cpu_s"], optional["runq_s"])
    if not good.all():
        rows, fetch_s = rows[good], fetch_s[good]
        optional = {k: v[good] for k, v in optional.items()}
    ok = np.zeros(len(at), dtype=bool)
    ok[rows] = True
    if stream is None or not has_stream[rows].any():  # absent: one NaN's view (no memory)
        positions = np.broadcast_to(np.float64(np.nan), len(rows))
    else:
        positions = np.where(has_stream[rows], stream[rows].astype(np.float64), np.nan)
    return ok, {
        "gpu": _taken(gpu, rows),
        "worker": _taken(worker, rows),
        "idx": _taken(idx, rows),
        "fetch_s": fetch_s,
        **optional,
        "stream": positions,
    }


def _suffix(words: np.ndarray, raw: np.ndarray, p: np.ndarray, label: bytes):
    """``<label><number>`` at ``p``: whether it is there, the number's parts, and its end."""
    ok = _lit(words, p, label)
    tok_at = p + len(label)
    value, tok_len, tok_ok, exact = _number(words, raw, tok_at)
    return ok & tok_ok, (tok_at, tok_len, value, exact), tok_at + tok_len


def _optional_values(raw, tok, present: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """An optional number's values at ``rows``; NaN where the line does not carry it.

    When no line carries it (most logs), one read-only view of a NaN: no memory
    and no fill for columns that ``logfile.Columns`` then leaves out anyway.
    """
    here = present[rows]
    if not here.any():
        return np.broadcast_to(np.float64(np.nan), len(rows))
    out = np.full(len(rows), np.nan)
    out[here] = _float_values(raw, *tok, rows[here])
    return out


def _seconds_ok(values: np.ndarray, max_duration: float) -> np.ndarray | np.bool_:
    """NaN (absent) or within the bound; the general path rejects the rest with a reason.

    A column no line carries (``_optional_values``' view of one NaN: most logs, six
    such columns per fetch block) passes whole without a pass over it.
    """
    if bounds.absent(values):
        return np.True_
    with np.errstate(invalid="ignore"):
        return np.isnan(values) | (values <= max_duration)


def _value_then_avg(words: np.ndarray, raw: np.ndarray, p: np.ndarray, label: bytes):
    """``<label><number> (<avg>)`` from ``p``: the number's parts and the offset of ``)``."""
    ok = _lit(words, p, label)
    tok_at = p + len(label)
    value, tok_len, tok_ok, exact = _number(words, raw, tok_at)
    p = tok_at + tok_len
    ok &= tok_ok & _lit(words, p, b" (")
    avg = _span(words, p + 2, _not_number, 4)
    ok &= avg < 32
    return ok, (tok_at, tok_len, value, exact), p + 2 + avg


def _cut_train(
    words: np.ndarray, raw: np.ndarray, at: np.ndarray, end: np.ndarray, max_duration: float
):
    """``GPU: g Epoch: [e][  i/n]\\tTime t (t)\\tData d (d)[\\tThroughput p (p)]`` from ``at``."""
    ok = _lit(words, at, b"GPU: ")
    gpu, gpu_len = _digits(words, at + 5)
    p = at + 5 + gpu_len
    ok &= (gpu_len >= 1) & (gpu_len <= 6) & _lit(words, p, b" Epoch: [")
    epoch, epoch_len = _digits(words, p + 9)
    p = p + 9 + epoch_len
    ok &= (epoch_len >= 1) & (epoch_len <= 6) & _lit(words, p, b"][")
    pad = _span(words, p + 2, _not_space, 2)  # the padding of the iteration index
    iteration, iteration_len = _digits(words, p + 2 + pad, 2)
    p = p + 2 + pad + iteration_len
    ok &= (pad < 16) & (iteration_len >= 1) & (iteration_len <= 9) & (raw[p] == 47)
    total, total_len = _digits(words, p + 1, 2)
    p = p + 1 + total_len
    ok &= (total_len >= 1) & (total_len <= 9)
    time_ok, time_tok, p = _value_then_avg(words, raw, p, b"]\tTime ")
    data_ok, data_tok, p = _value_then_avg(words, raw, p, b")\tData ")
    ok &= time_ok & data_ok & (raw[p] == 41)
    tp_ok, tp_tok, q = _value_then_avg(words, raw, p, b")\tThroughput ")
    has_tp = tp_ok & (raw[q] == 41)
    p = np.where(has_tp, q, p)  # the ``)`` closing the last standard field
    # Optionally ``\tCPU c (avg)`` and then ``\tRunq q (avg)`` (SPEC §1.2), then the end.
    has_cpu = has_runq = np.zeros(len(p), dtype=bool)
    cpu_tok = runq_tok = None
    if (p + 1 != end).any():  # logs without CPU fields skip the look (hot path)
        cpu_ok, cpu_tok, q = _value_then_avg(words, raw, p, b")\tCPU ")
        has_cpu = cpu_ok & (raw[q] == 41)
        runq_ok, runq_tok, r = _value_then_avg(words, raw, q, b")\tRunq ")
        has_runq = has_cpu & runq_ok & (raw[r] == 41)
        p = np.where(has_runq, r, np.where(has_cpu, q, p))
    ok &= p + 1 == end
    rows = np.flatnonzero(ok)
    iteration_v, total_v = _taken(iteration, rows), _taken(total, rows)
    good = iteration_v < total_v  # the general path names the reason otherwise
    if not good.all():
        rows, iteration_v, total_v = rows[good], iteration_v[good], total_v[good]
    with_tp = rows[has_tp[rows]]
    throughput = np.full(len(rows), np.nan)
    throughput[has_tp[rows]] = _float_values(raw, *tp_tok, with_tp)
    iteration_s = _float_values(raw, *time_tok, rows)
    stall_s = _float_values(raw, *data_tok, rows)
    good = bounds.train_ok(iteration_s, stall_s, throughput, max_duration)
    cpu_s = _optional_values(raw, cpu_tok, has_cpu, rows)
    runq_s = _optional_values(raw, runq_tok, has_runq, rows)
    good &= _seconds_ok(cpu_s, max_duration) & _seconds_ok(runq_s, max_duration)
    good &= ~bounds.beyond_span(iteration_s, runq_s)
    if not good.all():  # the general path names the reason
        rows, iteration_v, total_v = rows[good], iteration_v[good], total_v[good]
        iteration_s, stall_s, throughput = iteration_s[good], stall_s[good], throughput[good]
        cpu_s, runq_s = cpu_s[good], runq_s[good]
    ok = np.zeros(len(at), dtype=bool)
    ok[rows] = True
    return ok, {
        "gpu": _taken(gpu, rows),
        "epoch": _taken(epoch, rows),
        "iteration": iteration_v,
        "total": total_v,
        "iteration_s": iteration_s,
        "stall_s": stall_s,
        "throughput": throughput,
        "cpu_s": cpu_s,
        "runq_s": runq_s,
    }
