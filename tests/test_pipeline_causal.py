"""Causality of the pipeline model (SPEC §4.2): alignment only ever delays a fetch.

Both laws hold for any trace once the latencies are >= 0, as in a physical run
(a calibration from arbitrary arrays can have negative ones), so the
latencies are drawn, not calibrated. The loader is the measured one or a
what-if (W, P), so that the laws are checked under round-robin hand-out too.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsim.replay.models.pipeline_kernel import Calibration, replay_pipeline, segments_of
from tests.test_pipeline_model import POLICIES, STARTS, _inputs, traces


def _calibration(t, data) -> Calibration:
    """Non-negative latencies of a physical scale for the trace's own loader settings."""
    n, g = t[3].shape
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))

    def lat(scale: float) -> np.ndarray:
        return rng.uniform(0, scale, (n, g))

    lat_sent, lat_free, hand, deliver = lat(0.002), lat(0.001), lat(0.004), lat(0.003)
    return Calibration(t[8], t[9], lat_sent, lat_free, hand, deliver, lat(0.05), lat(0.002))


def _loader(t, data) -> tuple[int | None, int | None, int]:
    """(workers, prefetch) to replay with, and the worker count W that results."""
    if data.draw(st.booleans()):
        return None, None, t[8]
    w, p = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 3))
    return w, p, w


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=traces(), start=st.sampled_from(STARTS), data=st.data())
def test_kept_fetch_durations_never_beat_the_workers_nor_the_compute_floor(t, start, data):
    """With fetch durations kept, no start alignment beats the loader's throughput.

    Per rank r and segment of m batches, with W workers (main-process loading
    counts as 1): the worker with the most work runs its batches one after
    another from the segment's first request (a batch's index is never sent
    before it), and the rank's last iteration ends after the last of them.
    The iteration times add up to that span less the loop's gaps between
    iterations (time in no iteration), so

        sum_k iteration_s[k] >= sum_k F[k, r] / W - sum_{k>=1} loop[k, r].

    And every iteration lasts at least one rank's hand-over plus its time
    after the last arrival: iteration_s[k] >= max_r (hand + after)[k, r].
    """
    epoch, iteration, _, fetch, *_ = t
    cal = _calibration(t, data)
    new_w, new_p, w = _loader(t, data)
    out = replay_pipeline(_inputs(t), cal, ("actual", start), new_w, new_p)
    for lo, hi in segments_of(epoch, iteration):
        total = out["iteration_s"][lo:hi].sum()
        bound = fetch[lo:hi].sum(axis=0) / max(w, 1) - cal.loop[lo + 1 : hi].sum(axis=0)
        assert total >= bound.max() - 1e-9
    floor = (cal.hand + cal.after).max(axis=1)
    assert (out["iteration_s"] >= floor - 1e-9).all()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=traces(), policy=st.sampled_from(POLICIES), data=st.data())
def test_a_replayed_fetch_never_starts_before_its_worker_is_free(t, policy, data):
    """Each rank's worker i mod W builds one batch at a time, under every policy."""
    epoch, iteration, _, fetch, *_ = t
    cal = _calibration(t, data)
    new_w, new_p, w = _loader(t, data)
    out = replay_pipeline(_inputs(t), cal, policy, new_w, new_p)
    starts = out["gpu_start_s"]
    g = fetch.shape[1]
    if policy[0] == "min":
        fetch = np.repeat(fetch.min(axis=1, keepdims=True), g, axis=1)
    elif policy[0] == "avg":
        fetch = np.repeat(fetch.mean(axis=1, keepdims=True), g, axis=1)
    if w == 0:
        return  # loading in the main process: no worker to wait for
    for lo, hi in segments_of(epoch, iteration):
        for k in range(lo, hi):
            prev = [j for j in range(lo, k) if iteration[j] % w == iteration[k] % w]
            if prev:
                free = starts[prev[-1]] + fetch[prev[-1]]
                assert (starts[k] >= free + cal.lat_free[k] - 1e-9).all()
