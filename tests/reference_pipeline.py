"""Row-by-row reference of the ``pipeline`` replay model (docs/SPEC.md, "The pipeline model").

Plain Python over lists, one batch and one rank at a time, written to be
read next to the specification rather than to be fast. The fast kernel
(``dsim.replay.models.pipeline``) must agree with it to float precision on
any trace; the property tests compare the two.

Notation (all times in seconds, per rank r and batch k of one segment):
``FS``/``FE`` fetch start/end, ``F`` fetch duration, ``A`` batch arrival
(the training line's timestamp), ``ST`` stall, ``T`` iteration time,
``req = A - ST`` when the loop asked for the batch, ``end = req + T``.

The busy worker's hand-over (SPEC §4.2): a batch that was there when the
loop asked takes longer to hand over when its worker is building its next
batch; the extra is measured per segment (pooled over ranks). Where a replay
makes the worker busy, an idle ready batch takes the busy hand-over at its own
quantile among the idle ones (any other batch: the extra on top); where idle,
the idle mean. A busy hand-over's wait (beyond the idle mean) scales with the
work of the batch the worker is building, what-if over measured
(``work_ratio``, 1 unless given). Where the busy ones' stalls follow the time
their worker still needed for the batch it was building (a line explaining
``busy_min_r2`` of their variance), the busy hand-over follows that time
left instead, as replayed.

Causality (SPEC §4.2): a replayed fetch starts at its rank's causal start
``max(index sent + lat_sent, worker free + lat_free)`` or, under a start
alignment, at the policy's aggregate of the ranks' causal starts if that is
later -- never earlier.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

BIG = math.inf
BUSY_MIN_SAMPLES = 10  # ready batches of each kind a segment needs (as the kernel)
BUSY_MIN_R2 = 0.8  # share of the busy stalls' variance the time left must explain (as the kernel)
BUSY_MIN_LINE_SAMPLES = 5  # busy ready batches enough where that line holds (as the kernel)


@dataclass
class RefResult:
    iteration_s: list[float]
    stall_s: list[float]
    delay_s: list[float]
    fetch_diff_s: list[float]
    start_diff_s: list[float]
    start_s: list[list[float]]  # [N][G] replayed fetch starts (seconds since the origin)
    gpu_stall_s: list[list[float]]  # [N][G]
    end_s: list[list[float]]  # [N][G] when each rank's iteration ended (seconds since the origin)


def segments(epoch: list[int], iteration: list[int]) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of consecutive iterations of one epoch."""
    out = []
    lo = 0
    for k in range(1, len(epoch) + 1):
        if k == len(epoch) or epoch[k] != epoch[k - 1] or iteration[k] != iteration[k - 1] + 1:
            out.append((lo, k))
            lo = k
    return out if epoch else []


def _typical(per_rank: list[list[float]]) -> list[float]:
    """The typical latency: the mean over every rank's samples, the same for all ranks."""
    pooled = [v for values in per_rank for v in values]
    mean = math.fsum(pooled) / len(pooled) if pooled else 0.0
    return [mean] * len(per_rank)


def _aggregate(values: list[float], how: str) -> list[float]:
    if how == "actual":
        return list(values)
    if how == "min":
        return [min(values)] * len(values)
    if how == "avg":
        return [sum(values) / len(values)] * len(values)
    raise ValueError(how)


def _aggregate_start(causal: list[float], how: str) -> list[float]:
    """Replayed starts: each rank's causal start, delayed to the policy's aggregate if later."""
    if how == "actual":
        target = -BIG
    elif how == "min":
        target = min(causal)  # never later than any causal start: min changes nothing
    elif how == "avg":
        hi, lo = max(causal), min(causal)
        target = hi - (hi - lo) / 2
    elif how == "max":
        target = max(causal)
    else:
        raise ValueError(how)
    return [max(s, target) for s in causal]


def reference_pipeline(
    epoch: list[int],
    iteration: list[int],
    start: list[list[float]],
    fetch: list[list[float]],
    arrival: list[list[float]],
    stall: list[list[float]],
    iteration_time: list[list[float]],
    worker: list[list[int]],
    policy: tuple[str, str],
    workers: int,
    prefetch: int,
    new_workers: int | None = None,
    new_prefetch: int | None = None,
    busy_min_samples: int = BUSY_MIN_SAMPLES,
    busy_min_se: float = 2.0,
    busy_min_r2: float = BUSY_MIN_R2,
    work_ratio: list[list[float]] | None = None,
    busy_min_line_samples: int = BUSY_MIN_LINE_SAMPLES,
) -> RefResult:
    """Replay every segment under ``policy`` with the loader set to (new_workers, new_prefetch)."""
    n = len(epoch)
    g_count = len(start[0]) if n else 0
    new_w = workers if new_workers is None else new_workers
    new_p = prefetch if new_prefetch is None else new_prefetch
    same_loader = new_w == workers and new_p == prefetch
    out = RefResult([], [], [], [], [], [], [], [])
    for lo, hi in segments(epoch, iteration):
        m = hi - lo
        rows = range(lo, hi)
        fs = [[start[k][r] for r in range(g_count)] for k in rows]
        f = [[fetch[k][r] for r in range(g_count)] for k in rows]
        fe = [[fs[k][r] + f[k][r] for r in range(g_count)] for k in range(m)]
        a = [[arrival[k][r] for r in range(g_count)] for k in rows]
        st = [[stall[k][r] for r in range(g_count)] for k in rows]
        t = [[iteration_time[k][r] for r in range(g_count)] for k in rows]
        wk = [[worker[k][r] for r in range(g_count)] for k in rows]
        req = [[a[k][r] - st[k][r] for r in range(g_count)] for k in range(m)]
        end = [[req[k][r] + t[k][r] for r in range(g_count)] for k in range(m)]

        # --- calibration: the unobserved terms, per rank, from the measured run
        lat_sent = [[0.0] * g_count for _ in range(m)]  # index sent -> fetch start
        lat_free = [[0.0] * g_count for _ in range(m)]  # worker's previous batch done -> start
        hand = [[0.0] * g_count for _ in range(m)]
        deliver = [[0.0] * g_count for _ in range(m)]
        after = [[0.0] * g_count for _ in range(m)]
        loop = [[0.0] * g_count for _ in range(m)]
        sent = [[0.0] * g_count for _ in range(m)]
        free = [[-BIG] * g_count for _ in range(m)]
        samples: dict[str, list[list[float]]] = {
            name: [[] for _ in range(g_count)] for name in ("sent", "free", "ready", "waited")
        }
        for r in range(g_count):
            last_end: dict[int, float] = {}
            for k in range(m):
                if workers == 0:  # loading in the main process, on request
                    sent[k][r] = req[k][r]
                elif k < prefetch * workers:  # the first indices go out with the iterator
                    sent[k][r] = req[0][r]
                else:  # one more index each time a batch is handed to the loop
                    sent[k][r] = a[k - prefetch * workers][r]
                if workers > 0:
                    free[k][r] = last_end.get(wk[k][r], -BIG)
                    last_end[wk[k][r]] = fe[k][r]
                if k:
                    loop[k][r] = req[k][r] - end[k - 1][r]
                if k < max(prefetch * workers, 1):
                    continue  # start-up batches (sent with the iterator) are not typical
                if sent[k][r] > free[k][r]:
                    samples["sent"][r].append(fs[k][r] - sent[k][r])
                else:
                    samples["free"][r].append(fs[k][r] - free[k][r])
                if fe[k][r] < req[k][r]:
                    samples["ready"][r].append(st[k][r])
                else:
                    samples["waited"][r].append(a[k][r] - fe[k][r])
        s_hat = _typical(samples["sent"])
        f_hat = _typical(samples["free"])
        h_hat = _typical(samples["ready"])
        d_hat = _typical(samples["waited"])
        for r in range(g_count):
            for k in range(m):
                if (
                    sent[k][r] + s_hat[r] >= free[k][r] + f_hat[r]
                ):  # the worker waited for the index
                    lat_sent[k][r] = fs[k][r] - sent[k][r]
                    lat_free[k][r] = min(f_hat[r], fs[k][r] - free[k][r])
                else:  # the worker was busy with its previous batch
                    lat_free[k][r] = fs[k][r] - free[k][r]
                    lat_sent[k][r] = min(s_hat[r], fs[k][r] - sent[k][r])
                if fe[k][r] + d_hat[r] <= req[k][r] + h_hat[r]:  # ready: the handover binds
                    hand[k][r] = st[k][r]
                    deliver[k][r] = min(d_hat[r], a[k][r] - fe[k][r])
                else:  # the loop waited for the fetch: delivery binds
                    deliver[k][r] = a[k][r] - fe[k][r]
                    hand[k][r] = min(h_hat[r], st[k][r])
        for k in range(m):
            last = max(a[k])
            for r in range(g_count):
                after[k][r] = end[k][r] - last
        # The busy worker's hand-over: was the batch's worker building its next batch when
        # the loop asked? Ready batches' stalls, pooled over ranks, split by that.
        busy = [[0.0] * g_count for _ in range(m)]
        left = [[0.0] * g_count for _ in range(m)]  # time the worker still needed, when busy
        split: dict[bool, list[float]] = {True: [], False: []}
        busy_left: list[float] = []  # beside split[True], in the same order
        for r in range(g_count):
            for k in range(m):
                if workers == 0:
                    continue
                later = [j for j in range(k + 1, m) if wk[j][r] == wk[k][r]]
                # only a batch whose index went out before this hand-over
                sent_before = bool(later) and (
                    later[0] < prefetch * workers or later[0] - prefetch * workers < k
                )
                if sent_before and fs[later[0]][r] <= req[k][r] < fe[later[0]][r]:
                    busy[k][r] = 1.0
                    left[k][r] = fe[later[0]][r] - req[k][r]
                if k >= max(prefetch * workers, 1) and fe[k][r] < req[k][r]:
                    split[busy[k][r] > 0].append(st[k][r])
                    if busy[k][r]:
                        busy_left.append(left[k][r])
        excess = idle_hand = 0.0
        # Fewer busy ones than a mean needs still count where the time left explains them.
        few = len(split[True]) < busy_min_samples
        enough = min(busy_min_samples, busy_min_line_samples)
        if len(split[True]) >= enough and len(split[False]) >= busy_min_samples:
            idle_hand = math.fsum(split[False]) / len(split[False])
            excess = math.fsum(split[True]) / len(split[True]) - idle_hand
            se2 = 0.0  # only an extra beyond 2 standard errors of the two means counts
            for kind in (True, False):
                mean = math.fsum(split[kind]) / len(split[kind])
                var = max(math.fsum(v * v for v in split[kind]) / len(split[kind]) - mean**2, 0)
                se2 += var / len(split[kind])
            if excess <= busy_min_se * math.sqrt(se2) or excess <= 0:
                excess = 0.0
        # Does a busy hand-over wait for the batch being built? The line of the busy ready
        # batches' stalls on the time left, where it explains >= BUSY_MIN_R2 of their variance.
        slope = icept = 0.0
        if excess > 0:
            nb = len(busy_left)
            mean_st, mean_left = math.fsum(split[True]) / nb, math.fsum(busy_left) / nb
            var_left = math.fsum(x * x for x in busy_left) / nb - mean_left**2
            var_st = max(math.fsum(x * x for x in split[True]) / nb - mean_st**2, 0.0)
            products = (x * y for x, y in zip(busy_left, split[True], strict=True))
            cov = math.fsum(products) / nb - mean_left * mean_st
            if var_left > 0 and var_st > 0 and cov * cov >= busy_min_r2 * var_left * var_st:
                slope = min(max(cov / var_left, 0.0), 1.0)
                icept = mean_st - slope * mean_left
        if few and slope == 0.0:
            excess = idle_hand = 0.0
        # What a busy worker would add: an idle ready batch, the busy hand-over at its own
        # quantile (mid-rank among the idle ones; the busy ones interpolated at p*m - 0.5)
        # less its own; any other batch, the extra.
        wait = [[excess] * g_count for _ in range(m)]
        if excess > 0:
            idle_sorted, busy_sorted = sorted(split[False]), sorted(split[True])
            n_idle, n_busy = len(idle_sorted), len(busy_sorted)
            for r in range(g_count):
                for k in range(m):
                    if k < max(prefetch * workers, 1) or not fe[k][r] < req[k][r] or busy[k][r]:
                        continue
                    less = bisect.bisect_left(idle_sorted, st[k][r])
                    upto = bisect.bisect_right(idle_sorted, st[k][r])
                    p = (less + (upto - less) / 2) / n_idle
                    t = min(max(p * n_busy - 0.5, 0.0), n_busy - 1.0)
                    j = math.floor(t)
                    q = busy_sorted[j]
                    if j + 1 < n_busy:
                        q += (t - j) * (busy_sorted[j + 1] - busy_sorted[j])
                    wait[k][r] = q - st[k][r]

        # --- replay
        fetch_new = [_aggregate(f[k], policy[0]) for k in range(m)]
        a2 = [[0.0] * g_count for _ in range(m)]
        end2 = [[0.0] * g_count for _ in range(m)]
        req2 = [[0.0] * g_count for _ in range(m)]
        fs2 = [[0.0] * g_count for _ in range(m)]
        last_end2: list[dict[int, float]] = [{} for _ in range(g_count)]
        for k in range(m):
            causal = []
            for r in range(g_count):
                req2[k][r] = req[0][r] if k == 0 else end2[k - 1][r] + loop[k][r]
                who = wk[k][r] if same_loader else (iteration[lo + k] % new_w if new_w else 0)
                if new_w == 0:
                    sent = req2[k][r]
                elif k < new_p * new_w:
                    sent = req2[0][r]
                else:
                    sent = a2[k - new_p * new_w][r]
                free = last_end2[r].get(who, -BIG) if new_w > 0 else -BIG
                causal.append(max(sent + lat_sent[k][r], free + lat_free[k][r]))
            fs2[k] = _aggregate_start(causal, policy[1])
            for r in range(g_count):
                who = wk[k][r] if same_loader else (iteration[lo + k] % new_w if new_w else 0)
                done = fs2[k][r] + fetch_new[k][r]
                last_end2[r][who] = done
                h = hand[k][r]
                if excess != 0.0 and new_w > 0:
                    # Is this batch's worker building its next batch when the loop asks?
                    if same_loader:
                        later = [j for j in range(k + 1, m) if wk[j][r] == wk[k][r]]
                        nxt = later[0] if later else m
                    else:
                        nxt = k + new_w
                    now = 0.0
                    left_now = 0.0
                    if nxt < m:
                        if nxt < new_p * new_w:
                            sent_next = req2[0][r]
                        elif nxt - new_p * new_w < k:
                            sent_next = a2[nxt - new_p * new_w][r]
                        else:  # its index goes out with this very hand-over
                            sent_next = BIG
                        s_next = max(sent_next + lat_sent[nxt][r], done + lat_free[nxt][r])
                        if s_next <= req2[k][r] < s_next + fetch_new[nxt][r]:
                            now = 1.0
                            left_now = s_next + fetch_new[nxt][r] - req2[k][r]
                    ratio = 1.0
                    if now and work_ratio is not None:
                        ratio = work_ratio[lo + nxt][r]  # the batch the worker is building
                    if slope > 0 and now and busy[k][r]:  # busy in both: it waits for the
                        h = max(h + slope * (left_now - left[k][r]), 0.0)  # batch being built
                    elif slope > 0 and now > busy[k][r]:  # busy where it was idle: the line
                        h = max(h, icept + slope * left_now)
                    elif now > busy[k][r]:  # busy where it was idle: a busy worker's hand-over
                        h = max(h + wait[k][r] * ratio, 0.0)
                    elif now < busy[k][r]:  # idle where it was busy: an idle worker's hand-over
                        h = idle_hand
                    elif now:  # busy in both: the wait scales with the next batch's work
                        h = max(h + (h - idle_hand) * (ratio - 1), 0.0)
                a2[k][r] = max(req2[k][r] + h, done + deliver[k][r])
            last = max(a2[k])
            for r in range(g_count):
                end2[k][r] = last + after[k][r]
            stalls = [a2[k][r] - req2[k][r] for r in range(g_count)]
            times = [end2[k][r] - req2[k][r] for r in range(g_count)]
            out.iteration_s.append(max(times))
            out.stall_s.append(max(stalls))
            out.delay_s.append(max(stalls) - min(stalls))
            out.fetch_diff_s.append(max(fetch_new[k]) - min(fetch_new[k]))
            out.start_diff_s.append(max(fs2[k]) - min(fs2[k]))
            out.start_s.append(list(fs2[k]))
            out.gpu_stall_s.append(stalls)
            out.end_s.append(list(end2[k]))
    return out
