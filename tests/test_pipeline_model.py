"""The pipeline replay model: the fast kernel against the row-by-row reference, and its laws."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsim.replay.models import pipeline_kernel
from dsim.replay.models.pipeline_kernel import (
    Calibration,
    PipelineInputs,
    calibrate,
    replay_pipeline,
    segments_of,
)
from tests.reference_pipeline import reference_pipeline

STARTS = ("actual", "min", "avg", "max")
POLICIES = [(f, s) for f in ("actual", "min", "avg") for s in STARTS]
METRICS = ("iteration_s", "stall_s", "delay_s", "fetch_diff_s", "start_diff_s", "gpu_stall_s")
PAIRS = {**{m: m for m in METRICS}, "gpu_end_s": "end_s", "gpu_start_s": "start_s"}


@st.composite
def traces(draw):
    """Arbitrary timing arrays (not necessarily physical): calibration must absorb anything."""
    n = draw(st.integers(1, 30))
    g = draw(st.integers(1, 5))
    workers = draw(st.integers(0, 4))
    prefetch = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # Epochs and iterations with occasional gaps (segments).
    epoch = np.sort(rng.integers(0, 3, n)).astype(np.int32)
    iteration = np.zeros(n, dtype=np.int32)
    for k in range(1, n):
        step = 1 if rng.random() < 0.85 else int(rng.integers(2, 4))
        iteration[k] = 0 if epoch[k] != epoch[k - 1] else iteration[k - 1] + step
    fetch = rng.lognormal(np.log(0.05), rng.uniform(0, 1.2), (n, g))
    if draw(st.booleans()):
        fetch[rng.random((n, g)) < 0.3] = 0.05  # ties
    stall = rng.uniform(0, 0.05, (n, g)) * (rng.random((n, g)) < 0.7)
    itime = stall + rng.uniform(0.001, 0.05, (n, g))
    arrival = np.cumsum(rng.uniform(0.01, 0.06, n))[:, None] + rng.uniform(0, 0.01, (n, g))
    start = arrival - fetch - rng.uniform(0, 0.1, (n, g))
    if workers:
        worker = (iteration[:, None] % workers).repeat(g, axis=1).astype(np.int64)
    else:
        worker = np.zeros((n, g), dtype=np.int64)
    return epoch, iteration, start, fetch, arrival, stall, itime, worker, workers, prefetch


def _inputs(t) -> PipelineInputs:
    epoch, iteration, start, fetch, arrival, stall, itime, worker, _, _ = t
    return PipelineInputs(
        segments_of(epoch, iteration), iteration.astype(np.int64), start, fetch, arrival, stall,
        itime, worker,
    )  # fmt: skip


def _reference(
    t, policy, new_w=None, new_p=None, busy_min_samples=10, busy_min_se=2.0, busy_min_r2=0.8,
    work_ratio=None,
):  # fmt: skip
    epoch, iteration, start, fetch, arrival, stall, itime, worker, workers, prefetch = t
    return reference_pipeline(
        epoch.tolist(), iteration.tolist(), start.tolist(), fetch.tolist(), arrival.tolist(),
        stall.tolist(), itime.tolist(), worker.tolist(), policy, workers, prefetch, new_w, new_p,
        busy_min_samples, busy_min_se, busy_min_r2,
        None if work_ratio is None else work_ratio.tolist(),
    )  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=traces(), policy=st.sampled_from(POLICIES), loader=st.sampled_from(
    [(None, None), (1, 1), (2, 2), (3, 1), (4, 3), (0, 2)]
))  # fmt: skip
def test_kernel_equals_reference(t, policy, loader):
    cal = calibrate(_inputs(t), t[8], t[9])
    fast = replay_pipeline(_inputs(t), cal, policy, *loader)
    ref = _reference(t, policy, *loader)
    for name, ref_name in PAIRS.items():
        np.testing.assert_allclose(fast[name], np.array(getattr(ref, ref_name)), rtol=0, atol=1e-9)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=traces(), policy=st.sampled_from(POLICIES), loader=st.sampled_from(
    [(None, None), (1, 1), (2, 2), (3, 1), (4, 3), (0, 2)]
), seed=st.integers(0, 2**32 - 1), given_ratio=st.booleans())  # fmt: skip
def test_kernel_equals_reference_with_the_busy_hand_over(t, policy, loader, seed, given_ratio):
    """As above with the busy worker's hand-over measured from a single ready batch of each
    kind and kept wherever busy ones took longer, so that about half the drawn traces carry
    it (as shipped, 10 of each beyond 2 standard errors, random stalls almost never do), and
    half of the time a drawn work ratio per batch (what a fetch alignment gives)."""
    cal = calibrate(_inputs(t), t[8], t[9], busy_min_samples=1, busy_min_se=0.0, busy_min_r2=0.0)
    inputs = _inputs(t)
    ratio = None
    if given_ratio:
        ratio = np.random.default_rng(seed).uniform(0.2, 2.5, inputs.fetch.shape)
        inputs = replace(inputs, work_ratio=ratio)
    fast = replay_pipeline(inputs, cal, policy, *loader)
    ref = _reference(
        t, policy, *loader, busy_min_samples=1, busy_min_se=0.0, busy_min_r2=0.0, work_ratio=ratio
    )
    for name, ref_name in PAIRS.items():
        np.testing.assert_allclose(fast[name], np.array(getattr(ref, ref_name)), rtol=0, atol=1e-9)


@settings(max_examples=150, deadline=None)
@given(t=traces())
def test_identity_reproduces_the_measured_run(t):
    """actual/actual with the measured loader settings gives back every measured number."""
    _, _, start, fetch, _, stall, itime, _, workers, prefetch = t
    cal = calibrate(_inputs(t), workers, prefetch, busy_min_samples=1, busy_min_se=0.0)  # on
    out = replay_pipeline(_inputs(t), cal, ("actual", "actual"))
    np.testing.assert_allclose(out["iteration_s"], itime.max(axis=1), rtol=0, atol=1e-9)
    np.testing.assert_allclose(out["gpu_stall_s"], stall, rtol=0, atol=1e-9)
    np.testing.assert_allclose(out["stall_s"], stall.max(axis=1), rtol=0, atol=1e-9)
    np.testing.assert_allclose(out["delay_s"], np.ptp(stall, axis=1), rtol=0, atol=1e-9)
    np.testing.assert_allclose(out["start_diff_s"], np.ptp(start, axis=1), rtol=0, atol=1e-9)
    np.testing.assert_allclose(out["fetch_diff_s"], np.ptp(fetch, axis=1), rtol=0, atol=1e-9)


@settings(max_examples=150, deadline=None)
@given(t=traces(), policy=st.sampled_from(POLICIES), data=st.data())
def test_a_shorter_fetch_never_makes_an_iteration_end_later(t, policy, data):
    """Max-plus monotonicity: the model only adds and takes maxima of its inputs.

    Without the busy worker's hand-over, which is deliberately not monotone: a
    shorter fetch can let a worker start its next batch before the loop asks
    for this one, and a busy worker hands a batch over later (SPEC §4.2;
    ``test_a_busy_worker_hands_over_later``).
    """
    epoch, iteration, start, fetch, arrival, stall, itime, worker, workers, prefetch = t
    shorter = fetch.copy()
    rows = data.draw(st.lists(st.integers(0, fetch.shape[0] - 1), min_size=1, max_size=5))
    for k in rows:
        r = data.draw(st.integers(0, fetch.shape[1] - 1))
        shorter[k, r] *= data.draw(st.floats(0, 1))
    cal = replace(  # calibrated on the measured run
        calibrate(_inputs(t), workers, prefetch), busy=None, busy_excess=None, idle_hand=None
    )
    what_if = (epoch, iteration, start, shorter, arrival, stall, itime, worker, workers, prefetch)
    faster = replay_pipeline(_inputs(what_if), cal, policy)
    measured = replay_pipeline(_inputs(t), cal, policy)
    assert (faster["gpu_end_s"] <= measured["gpu_end_s"] + 1e-9).all()


@settings(max_examples=200, deadline=None)
@given(t=traces(), policy=st.sampled_from(POLICIES), data=st.data())
def test_more_prefetch_or_a_multiple_of_the_workers_never_ends_later(t, policy, data):
    """With fetch durations unchanged, a larger prefetch factor, or k times the workers, helps.

    Not *any* larger worker count: PyTorch hands batch i to worker i mod W, so
    going from 2 to 3 workers can put a long batch behind a straggler that
    2 workers kept apart (``test_three_workers_can_be_slower_than_two``).
    With k*W workers each worker's batches are a subset of one worker's
    batches under W, so nothing can start later -- as long as a worker's
    batches end in the order they start, i.e. every latency is >= 0, as in a
    physical run (a calibration from arbitrary arrays can have negative
    ones, so this test draws its latencies instead of calibrating them).
    """
    n, g = t[3].shape  # the fetch durations' shape
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))

    def latencies(scale: float) -> np.ndarray:
        return rng.uniform(0, scale, (n, g))

    # Loader settings no draw below equals, so that every replay hands batches out round-robin
    # (under the measured settings a replay keeps the measured worker ids instead).
    cal = Calibration(
        0, 0, latencies(0.002), latencies(0.001), latencies(0.004), latencies(0.003),
        latencies(0.05), latencies(0.001),
    )  # fmt: skip
    w = data.draw(st.integers(1, 3))
    p = data.draw(st.integers(1, 3))
    base = replay_pipeline(_inputs(t), cal, policy, w, p)
    more_p = replay_pipeline(_inputs(t), cal, policy, w, p + data.draw(st.integers(1, 3)))
    more_w = replay_pipeline(_inputs(t), cal, policy, w * data.draw(st.integers(2, 3)), p)
    assert (more_p["gpu_end_s"] <= base["gpu_end_s"] + 1e-9).all()
    assert (more_w["gpu_end_s"] <= base["gpu_end_s"] + 1e-9).all()


def test_three_workers_can_be_slower_than_two():
    """The round-robin anomaly the previous test steps around, in numbers.

    One rank, prefetch 2, 8 batches; batch 1 is a straggler (0.6 s) and
    batch 4 is long (0.43 s). With 2 workers batch 4 lands on the idle
    worker 0; with 3 it queues behind the straggler on worker 1.
    """
    fetch = np.array([[0.015], [0.599], [0.027], [0.134], [0.426], [0.081], [0.028], [0.033]])
    n = len(fetch)
    zeros = np.zeros((n, 1))
    inputs = PipelineInputs(
        segments_of(np.zeros(n, np.int32), np.arange(n, dtype=np.int32)),
        np.arange(n, dtype=np.int64), zeros, fetch, zeros, zeros, zeros, np.zeros((n, 1), np.int64),
    )  # fmt: skip
    # No start latencies, 2 ms hand-over, 1 ms delivery, 18 ms of compute after the last arrival.
    cal = Calibration(1, 2, zeros, zeros, zeros + 0.002, zeros + 0.001, zeros + 0.018, zeros)
    two = replay_pipeline(inputs, cal, ("actual", "actual"), 2, 2)["gpu_end_s"][-1, 0]
    three = replay_pipeline(inputs, cal, ("actual", "actual"), 3, 2)["gpu_end_s"][-1, 0]
    assert three > two + 0.1


def _alternating_run(
    n: int = 40, left: np.ndarray | None = None, busy_stall=None, busy_every: int = 2
):
    """One rank, 1 worker, prefetch 2, a batch asked for every 20 ms, each built in 8 ms
    well before: on every ``busy_every``-th row (even rows unless given) the worker has
    already started the next batch when the loop asks (busy; ``left`` of it still to build,
    6 ms unless given), on the others it starts it 5 ms later (idle). A busy worker's batch
    took ``busy_stall`` (12 ms unless given) to hand over, an idle one's 1 ms: a dataset
    that holds the GIL (SPEC §4.2)."""
    ms = 1e-3
    req = np.arange(n) * 20 * ms
    left = np.full(n, 6 * ms) if left is None else left
    busy = np.arange(n) % busy_every == 0
    start = np.empty(n)
    start[0] = -30 * ms
    for j in range(1, n):
        start[j] = req[j - 1] - (8 * ms - left[j - 1]) if busy[j - 1] else req[j - 1] + 5 * ms
    stall = np.where(busy, 12 * ms if busy_stall is None else busy_stall, 1 * ms)
    col = lambda a: np.ascontiguousarray(a[:, None])  # noqa: E731
    inputs = PipelineInputs(
        segments_of(np.zeros(n, np.int32), np.arange(n, dtype=np.int32)),
        np.arange(n, dtype=np.int64), col(start), col(np.full(n, 8 * ms)), col(req + stall),
        col(stall), col(np.full(n, 20 * ms)), np.zeros((n, 1), np.int64),
    )  # fmt: skip
    return inputs, busy


def _waiting_run(n: int = 40, busy_every: int = 2):
    """As ``_alternating_run``, but a busy worker's batch reaches the loop 1 ms after the
    worker finished the batch it was building, whose time left at the request varies from
    2 to 6 ms: a worker whose Python code holds the GIL for the whole batch (SPEC §4.2,
    "Waiting for the batch being built")."""
    left = (2 + (np.arange(n) // (busy_every // 2)) % 5) * 1e-3  # 2 to 6 ms on busy rows
    return _alternating_run(n, left=left, busy_stall=left + 1e-3, busy_every=busy_every)


def test_a_busy_hand_over_waits_for_the_batch_being_built():
    """The calibration finds the line of a busy ready batch's stall on its worker's time left
    (slope 1, 1 ms above); replayed with shorter fetches, every batch whose worker is busy
    when the loop asks reaches it 1 ms after the worker finishes the batch it is building."""
    inputs, _ = _waiting_run()
    cal = calibrate(inputs, 1, 2)
    np.testing.assert_allclose(cal.busy_slope, 1.0, atol=1e-9)
    np.testing.assert_allclose(cal.busy_icept, 1e-3, atol=1e-9)
    same = replay_pipeline(inputs, cal, ("actual", "actual"))
    np.testing.assert_allclose(same["gpu_stall_s"], inputs.stall, atol=1e-12)
    shorter = replace(inputs, fetch=np.full_like(inputs.fetch, 6e-3))
    out = replay_pipeline(shorter, cal, ("actual", "actual"))
    start, end, stall = out["gpu_start_s"][:, 0], out["gpu_end_s"][:, 0], out["gpu_stall_s"][:, 0]
    checked = 0
    for k in range(2, len(start) - 1):
        ask = end[k - 1]  # the loop asks as the last iteration ends (its gap is 0 here)
        if start[k + 1] <= ask < start[k + 1] + 6e-3:  # the worker is building batch k + 1
            assert stall[k] == pytest.approx(start[k + 1] + 6e-3 - ask + 1e-3, abs=1e-12)
            checked += 1
    assert checked >= 10
    # The same run whose busy stalls do not follow the time left keeps the rules before.
    flat = calibrate(_alternating_run()[0], 1, 2)
    assert not np.any(flat.busy_slope)
    # the measured time left is kept only where it is read: not a row of it for this run
    assert cal.busy_rem.shape == inputs.fetch.shape and flat.busy_rem.shape == (0, 1)


def test_a_few_busy_hand_overs_count_where_the_time_left_explains_them():
    """A run whose worker is seldom busy when the loop asks (7 of 38 ready batches here; 7
    of 368 at 4 workers per rank on 16 cores) has too few busy hand-overs for a mean, but
    where each waited for the batch being built, that line is kept (from 5 of them); the
    same few at one flat stall are not, nor 4 on the line."""
    assert pipeline_kernel.BUSY_MIN_LINE_SAMPLES == 5 < pipeline_kernel.BUSY_MIN_SAMPLES
    inputs, busy = _waiting_run(40, busy_every=5)
    assert busy[2:-1].sum() == 7  # ready busy ones past the start-up batches
    cal = calibrate(inputs, 1, 2)
    np.testing.assert_allclose(cal.busy_slope, 1.0, atol=1e-9)
    np.testing.assert_allclose(cal.busy_icept, 1e-3, atol=1e-9)
    assert cal.busy_excess.max() > 0 and cal.idle_hand.max() == pytest.approx(1e-3)
    same = replay_pipeline(inputs, cal, ("actual", "actual"))
    np.testing.assert_allclose(same["gpu_stall_s"], inputs.stall, atol=1e-12)
    more = replay_pipeline(inputs, cal, ("actual", "actual"), 4, 2)["gpu_stall_s"][8:, 0]
    np.testing.assert_allclose(more, 1e-3, atol=1e-12)  # idle at every hand-over
    flat = calibrate(_alternating_run(40, busy_every=5)[0], 1, 2)  # 12 ms, whatever is left
    assert not flat.busy_excess.any() and not flat.busy_slope.any() and not flat.idle_hand.any()
    fewer = calibrate(_waiting_run(30, busy_every=7)[0], 1, 2)
    assert _waiting_run(30, busy_every=7)[1][2:-1].sum() == 4
    assert not fewer.busy_excess.any() and not fewer.busy_slope.any()


def test_a_busy_worker_hands_over_later():
    """The calibration measures the busy worker's extra hand-over; a what-if whose workers are
    idle when the loop asks (more of them) drops it, and the measured run is kept as it was."""
    inputs, busy = _alternating_run()
    cal = calibrate(inputs, 1, 2)
    assert (cal.busy[:-1, 0] == busy[:-1]).all()  # the last batch has no next one
    np.testing.assert_allclose(cal.busy_excess, 11e-3, atol=1e-12)
    assert cal.busy_wait.shape == inputs.fetch.shape  # kept: a segment has the extra
    np.testing.assert_allclose(cal.idle_hand, 1e-3, atol=1e-12)
    same = replay_pipeline(inputs, cal, ("actual", "actual"))
    np.testing.assert_allclose(same["gpu_stall_s"], inputs.stall, atol=1e-12)
    more = replay_pipeline(inputs, cal, ("actual", "actual"), 4, 2)["gpu_stall_s"][8:, 0]
    np.testing.assert_allclose(more, 1e-3, atol=1e-12)  # every batch as an idle worker's
    carried = replace(cal, busy=None, busy_excess=None, idle_hand=None)
    kept = replay_pipeline(inputs, carried, ("actual", "actual"), 4, 2)["gpu_stall_s"][8:, 0]
    assert kept.max() == pytest.approx(12e-3)  # without the term, the busy hand-overs stay
