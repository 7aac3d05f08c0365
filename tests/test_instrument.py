"""dsim.instrument: the instrumented loader yields what the plain one yields, and logs parse.

Everything runs real PyTorch DataLoaders (worker processes included) and, for
the round trip, the real ``dsim parse`` command on the logs they wrote.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsim.errors import UsageError
from dsim.instrument import FileSink, fetch_line, training_line
from dsim.instrument.cpu import cpu_ranges

pytestmark = pytest.mark.torch

# The two line kinds of docs/SPEC.md §1, written independently of dsim's grammar module.
FETCH_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{1,9}) DEBUG:\tGPU: (?P<gpu>\d+) "
    r"worker_id: (?P<worker>\d+), END FETCH at_time (?P<secs>\d+\.\d+) data idx(?P<idx>\d+)"
    r"( cpu (?P<cpu>\d+\.\d{9})( runq (?P<runq>\d+\.\d{9}))?( proc (?P<proc>\d+\.\d{9}))?)?$"
)
TRAIN_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{1,9}) GPU: (?P<gpu>\d+) "
    r"Epoch: \[(?P<epoch>\d+)\]\[ *(?P<it>\d+)/(?P<total>\d+)\]"
    r"\tTime (?P<time>\d+\.\d+) \((?P<time_avg>\d+\.\d+)\)"
    r"\tData (?P<data>\d+\.\d+) \((?P<data_avg>\d+\.\d+)\)"
    r"(\tThroughput (?P<thr>\d+\.\d+) \((?P<thr_avg>\d+\.\d+)\))?"
    r"(\tCPU (?P<cpu>\d+\.\d+) \((?P<cpu_avg>\d+\.\d+)\))?"
    r"(\tRunq (?P<runq>\d+\.\d+) \((?P<runq_avg>\d+\.\d+)\))?$"
)
LOADER_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{1,9}) GPU: (?P<gpu>\d+) LOADER"
    r" num_workers (?P<num_workers>\d+) prefetch_factor (?P<prefetch_factor>\d+|none)"
    r" batch_size (?P<batch_size>\d+|none) persistent_workers (?P<persistent_workers>[01])"
    r" pin_memory (?P<pin_memory>[01])"
    r"( cores (?P<cores>\d+) local_world_size (?P<local_world_size>\d+|none)"
    r"( cpus (?P<cpus>\d+(-\d+)?(,\d+(-\d+)?)*))?)?"
    r"( batch_bytes (?P<batch_bytes>\d+))?$"
)


def read_log(
    path: Path, loaders: list[dict[str, str]] | None = None
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Split a log into fetch and training records (loader lines into ``loaders``).

    Any other line fails the test.
    """
    fetches, trains = [], []
    if not path.exists():
        return fetches, trains
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if m := FETCH_RE.match(line):
            fetches.append(m.groupdict())
        elif m := TRAIN_RE.match(line):
            trains.append(m.groupdict())
        elif m := LOADER_RE.match(line):
            if loaders is not None:
                loaders.append(m.groupdict())
        else:
            raise AssertionError(f"{path}:{number}: not a dsim line: {line!r}")
    return fetches, trains


# ---------------------------------------------------------------- lines, no torch needed


def test_lines_match_the_grammar_even_for_tiny_and_huge_values() -> None:
    f = fetch_line(1_630_525_734.841123, 3, 11, 1e-7, 850).rstrip("\n")
    m = FETCH_RE.match(f)
    assert m and m["gpu"] == "3" and m["worker"] == "11" and m["idx"] == "850"
    assert float(m["secs"]) == pytest.approx(1e-7, abs=1e-9)
    t = training_line(
        1_630_525_735.191641, 0, 1, 7, 851, (9.777588, 1.5), (8.596788, 1.0), (52.365, 52.0)
    ).rstrip("\n")
    m = TRAIN_RE.match(t)
    assert m and m["epoch"] == "1" and m["it"] == "7" and m["total"] == "851"
    assert "[1][  7/851]" in t and m["thr"] == "52.365"
    no_rate = training_line(0.0, 0, 0, 0, 1, (1e-9, 1e-9), (0.0, 0.0), None)
    assert TRAIN_RE.match(no_rate.rstrip("\n")) and "Throughput" not in no_rate
    assert "cpu" not in fetch_line(0.0, 0, 0, 1.0, 0) and "CPU" not in no_rate


def test_cpu_fields_are_appended_only_when_known() -> None:
    from dsim.instrument.lines import loader_line

    f = fetch_line(0.0, 1, 2, 0.05, 3, 0.031, 0.0025).rstrip("\n")
    m = FETCH_RE.match(f)
    assert m and m["cpu"] == "0.031000000" and m["runq"] == "0.002500000"
    m = FETCH_RE.match(fetch_line(0.0, 1, 2, 0.05, 3, 0.031).rstrip("\n"))
    assert m and m["cpu"] == "0.031000000" and m["runq"] is None and m["proc"] is None
    m = FETCH_RE.match(fetch_line(0.0, 1, 2, 0.05, 3, 0.031, 0.0025, proc=0.034).rstrip("\n"))
    assert m and m["runq"] == "0.002500000" and m["proc"] == "0.034000000"
    m = FETCH_RE.match(fetch_line(0.0, 1, 2, 0.05, 3, 0.031, proc=0.034).rstrip("\n"))
    assert m and m["runq"] is None and m["proc"] == "0.034000000"
    assert "proc" not in fetch_line(0.0, 1, 2, 0.05, 3, None, proc=0.034)  # only with cpu
    t = training_line(0.0, 0, 0, 0, 1, (0.1, 0.1), (0.0, 0.0), None, (0.02, 0.03), (1e-4, 2e-4))
    m = TRAIN_RE.match(t.rstrip("\n"))
    assert m and (m["cpu"], m["cpu_avg"], m["runq"]) == ("0.020000", "0.030000", "0.000100")
    base = dict(num_workers=1, prefetch_factor=2, batch_size=4, persistent_workers=0, pin_memory=0)
    old = loader_line(0.0, 0, base)
    assert old.rstrip("\n").endswith("pin_memory 0")  # no node fields: the old line exactly
    m = LOADER_RE.match(loader_line(0.0, 0, {**base, "cores": 2, "local_world_size": None})[:-1])
    assert m and m["cores"] == "2" and m["local_world_size"] == "none"
    assert loader_line(0.0, 0, {**base, "batch_bytes": None}) == old  # unknown: not written
    m = LOADER_RE.match(loader_line(0.0, 0, {**base, "cores": 2, "batch_bytes": 4096})[:-1])
    assert m and m["cores"] == "2" and m["batch_bytes"] == "4096" and m["cpus"] is None
    node = {**base, "cores": 2, "local_world_size": 4, "cpus": "0-1,8", "batch_bytes": 64}
    m = LOADER_RE.match(loader_line(0.0, 0, node)[:-1])
    assert m and m["cpus"] == "0-1,8" and m["batch_bytes"] == "64"
    assert "cpus" not in loader_line(0.0, 0, {**base, "cpus": "0-1"})  # only with the node's


def test_cpu_sets_are_written_as_linux_lists_them() -> None:
    from dsim.instrument.cpu import cpu_ranges, usable_cpus

    assert cpu_ranges([0, 1, 2, 5]) == "0-2,5"
    assert cpu_ranges([3]) == "3" and cpu_ranges([0, 2, 4]) == "0,2,4"
    assert cpu_ranges(list(range(8)) + list(range(16, 24))) == "0-7,16-23"
    assert usable_cpus() == cpu_ranges(sorted(os.sched_getaffinity(0)))


def test_first_batch_hook_reports_once_and_steps_aside() -> None:
    from dsim.instrument.batchsize import on_first_batch

    class Iterator:  # the part of a DataLoader iterator the hook relies on
        def __init__(self, items):
            self.items = list(items)

        def _next_data(self):
            if not self.items:
                raise StopIteration
            return self.items.pop(0)

    seen: list = []
    it = Iterator(["no tensor", "b"])
    on_first_batch(it, seen.append)
    assert it._next_data() == "no tensor" and seen == [None]  # no tensor: size unknown
    assert "_next_data" not in vars(it) and it._next_data() == "b" and seen == [None]
    empty = Iterator([])
    on_first_batch(empty, seen.append)
    with pytest.raises(StopIteration):
        empty._next_data()
    assert seen == [None, None]  # an epoch without a batch still logs its settings
    again = Iterator(["x"])
    on_first_batch(again, seen.append)
    on_first_batch(again, seen.append)  # re-armed before a batch (persistent workers)
    assert seen == [None, None, None]
    again._next_data()
    assert seen == [None, None, None, None] and "_next_data" not in vars(again)
    on_first_batch(object(), seen.append)  # no _next_data at all: reported at once
    assert seen == [None] * 5


def test_thread_times_read_schedstat_and_count_this_threads_work() -> None:
    from dsim.instrument import cpu

    assert cpu.parse_schedstat(b"1500000000 250000 7\n") == (1.5, 0.00025)
    # A short burst of CPU work is counted to well under a millisecond: schedstat's own
    # CPU field, stale between scheduler ticks, read ~0 ms for a 2 ms burst.
    errors = []
    for _ in range(20):
        c0, q0 = cpu.thread_times()
        t0 = time.thread_time()
        deadline = time.perf_counter() + 0.002
        while time.perf_counter() < deadline:  # spin (reading the CPU clock would refresh
            pass  # schedstat and hide the staleness)
        c1, q1 = cpu.thread_times()
        t1 = time.thread_time()
        errors.append(abs((c1 - c0) - (t1 - t0)))  # both clocks over the same span
    assert sorted(errors)[10] < 0.0005, errors
    if Path("/proc/thread-self/schedstat").exists():
        assert q0 is not None and q1 is not None and q1 >= q0
    assert cpu.usable_cores() >= 1


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 4e9))
def test_timestamps_are_local_time_truncated_to_the_microsecond(wall: float) -> None:
    from datetime import datetime

    from dsim.instrument.lines import format_timestamp

    text = format_timestamp(wall)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", text)
    parsed = datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
    # datetime rounds to the nearest microsecond where dsim truncates.
    assert abs((parsed - datetime.fromtimestamp(wall)).total_seconds()) <= 1e-6


def _hammer(path: str, who: int, count: int) -> None:
    sink = FileSink(path)
    for i in range(count):
        sink.write(fetch_line(1_630_525_734.0 + i, who, who, 0.25 * i, i))


def test_file_sink_never_tears_lines_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(str(path), w, 3000)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    fetches, _ = read_log(path)
    per_writer = Counter(r["gpu"] for r in fetches)
    assert per_writer == {str(w): 3000 for w in range(4)}
    for w in range(4):
        idx = [int(r["idx"]) for r in fetches if r["gpu"] == str(w)]
        assert idx == list(range(3000))  # each process's lines in its own order


def test_file_sink_reopens_after_fork_and_pickles_without_its_descriptor(tmp_path: Path) -> None:
    import pickle

    sink = FileSink(tmp_path / "a" / "rank2.log")
    sink.write("x\n")
    clone = pickle.loads(pickle.dumps(sink))
    clone.write("y\n")
    sink.close()
    assert (tmp_path / "a" / "rank2.log").read_text() == "x\ny\n"


# ---------------------------------------------------------------- with torch


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


class Squares:
    """A map-style dataset of mixed structures, so collation is not trivial."""

    def __init__(self, n: int):
        self.n = n
        self.note = "passes through"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        return {"x": torch.tensor([float(i), float(i * i)]), "label": i % 3, "name": f"s{i}"}


class SquaresBatched(Squares):
    """Same data, read a batch at a time through ``__getitems__``."""

    def __getitems__(self, indices):
        return [self[i] for i in indices]


def tuple_collate(samples):
    """A custom collate_fn returning a different structure than default_collate."""
    import torch

    return (
        torch.stack([s["x"] for s in samples]).sum(dim=1),
        [s["name"] for s in samples],
    )


def same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def make_loader(torch, cfg: dict, rank: int):
    from torch.utils.data import DataLoader, DistributedSampler

    ds = (SquaresBatched if cfg["getitems"] else Squares)(cfg["size"])
    kwargs: dict = {"num_workers": cfg["workers"]}
    if cfg["workers"]:
        kwargs.update(persistent_workers=cfg["persistent"], prefetch_factor=cfg["prefetch"])
    if cfg["collate"]:
        kwargs["collate_fn"] = tuple_collate if cfg["batch"] else (lambda s: s["x"] * 2)
    if cfg["distributed"]:
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=cfg["shuffle"], seed=5)
        kwargs["sampler"] = sampler
    else:
        sampler = None
        kwargs["shuffle"] = cfg["shuffle"]
    if cfg["batch"]:
        kwargs.update(batch_size=cfg["batch"], drop_last=cfg["drop_last"])
    else:
        kwargs["batch_size"] = None
    return DataLoader(ds, **kwargs), sampler


def tensor_bytes(batch) -> int | None:
    """The tensors' bytes in a batch, counted independently of dsim; None without a tensor."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    parts = batch.values() if isinstance(batch, dict) else batch
    if not isinstance(batch, dict | list | tuple):
        return None
    sizes = [n for n in map(tensor_bytes, parts) if n is not None]
    return sum(sizes) if sizes else None


def test_batch_bytes_sum_nested_tensors_and_give_up_past_the_cap(torch) -> None:
    from dsim.instrument.batchsize import MAX_ITEMS, batch_nbytes

    batch = {"x": torch.zeros(4, 3), "y": [torch.zeros(5, dtype=torch.int64), "label"],
             "z": (torch.zeros(2, dtype=torch.float16), 7)}  # fmt: skip
    assert batch_nbytes(batch) == 4 * 3 * 4 + 5 * 8 + 2 * 2 == tensor_bytes(batch)
    assert batch_nbytes(torch.zeros(0)) == 0 and batch_nbytes(["a", 1]) is None
    assert batch_nbytes([torch.zeros(1)] + [0] * MAX_ITEMS) is None


def run_epochs(torch, loader, sampler, epochs: int, timer=None) -> list[list]:
    out = []
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        batches = loader if timer is None else timer.iterate(loader, epoch=epoch)
        out.append(list(batches))
    return out


configs = st.fixed_dictionaries(
    {
        "size": st.integers(1, 23),
        "batch": st.sampled_from([None, 1, 3, 4]),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "workers": st.sampled_from([0, 1, 2]),
        "persistent": st.booleans(),
        "prefetch": st.sampled_from([1, 2, 3]),
        "collate": st.booleans(),
        "distributed": st.booleans(),
        "getitems": st.booleans(),
        "epochs": st.integers(1, 2),
        "seed": st.integers(0, 2**16),
    }
)


@settings(
    max_examples=14,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cfg=configs)
def test_instrumented_loader_yields_the_same_batches_and_one_fetch_per_batch(
    torch, tmp_path_factory, cfg: dict
) -> None:
    from dsim.instrument import TrainingTimer, instrument_loader

    # Each rank logs into its own directory: the ranks run here one after the other, and
    # parsed as one run they would be two jobs at disjoint times (which dsim parse refuses
    # unless their iteration ends agree up to a constant, as they do only on a quiet machine).
    logs = tmp_path_factory.mktemp("logs")
    ranks = (0, 1) if cfg["distributed"] else (0,)
    for rank in ranks:
        log_dir = logs / f"rank{rank}"
        torch.manual_seed(cfg["seed"])
        plain, sampler = make_loader(torch, cfg, rank)
        expected = run_epochs(torch, plain, sampler, cfg["epochs"])

        torch.manual_seed(cfg["seed"])
        original, sampler = make_loader(torch, cfg, rank)
        loader = instrument_loader(original, log_dir=log_dir, rank=rank)
        timer = TrainingTimer(log_dir=log_dir, rank=rank, batch_size=cfg["batch"])
        got = run_epochs(torch, loader, sampler, cfg["epochs"], timer)

        assert len(loader) == len(original)
        assert loader.sampler is original.sampler and loader.batch_size == original.batch_size
        assert [len(e) for e in got] == [len(e) for e in expected]
        flat_expected = [b for epoch in expected for b in epoch]
        pairs = list(zip(flat_expected, [b for epoch in got for b in epoch], strict=True))
        assert all(same(a, b) for a, b in pairs)

        loaders: list[dict[str, str]] = []
        fetches, trains = read_log(log_dir / f"rank{rank}.log", loaders)
        n = len(expected[0])
        # One loader line per epoch (per iterator), with its first batch's bytes, as configured.
        workers = cfg["workers"]
        settings = {
            "gpu": str(rank),
            "num_workers": str(workers),
            "prefetch_factor": str(cfg["prefetch"]) if workers else "none",
            "batch_size": str(cfg["batch"]) if cfg["batch"] else "none",
            "persistent_workers": str(int(bool(workers and cfg["persistent"]))),
            "pin_memory": "0",
            "cores": str(len(os.sched_getaffinity(0))),
            "local_world_size": os.environ.get("LOCAL_WORLD_SIZE", "none"),
            "cpus": cpu_ranges(sorted(os.sched_getaffinity(0))),
        }
        sizes = [None if not e else tensor_bytes(e[0]) for e in expected]
        assert [{k: v for k, v in r.items() if k != "ts"} for r in loaders] == [
            {**settings, "batch_bytes": None if size is None else str(size)} for size in sizes
        ]
        assert {r["gpu"] for r in fetches + trains} <= {str(rank)}
        assert {int(r["worker"]) for r in fetches} <= set(range(max(cfg["workers"], 1)))
        # One fetch per batch and epoch: every index of the epoch once per epoch.
        assert Counter(int(r["idx"]) for r in fetches) == Counter(
            {i: cfg["epochs"] for i in range(n)}
        )
        assert [(int(r["epoch"]), int(r["it"])) for r in trains] == [
            (e, i) for e in range(cfg["epochs"]) for i in range(n)
        ]
        for r in trains:
            assert int(r["total"]) == n
            assert float(r["time"]) + 2e-6 >= float(r["data"]) >= 0
            assert (r["thr"] is None) == (cfg["batch"] is None)
            assert float(r["cpu"]) >= 0 and (r["runq"] is not None) == _has_schedstat()
        for r in fetches:  # the worker's CPU time for the batch cannot exceed its wall time much
            assert 0 <= float(r["cpu"]) <= float(r["secs"]) + 0.01
            assert (r["runq"] is not None) == _has_schedstat()
            if r["proc"] is not None:  # the whole worker process since its previous batch
                assert float(r["proc"]) + 1e-6 >= float(r["cpu"])
        # The worker process's CPU comes from workers only (in the main process it is the
        # training process's), and on every batch but each worker process's first.
        without = sum(r["proc"] is None for r in fetches)
        if not workers:
            assert without == len(fetches)
        elif fetches:
            processes = workers * (1 if cfg["persistent"] else cfg["epochs"])
            assert 1 <= without <= processes

    if n:  # the real parser, strict: any rejected line fails
        from dsim.sources.rawlog.discover import discover_runs
        from dsim.sources.rawlog.parse import parse_run

        for rank in ranks:
            (source,) = discover_runs([logs / f"rank{rank}"], name="run")
            tables = parse_run(source, strict=True).tables
            expected_keys = Counter((e, i, rank) for e in range(cfg["epochs"]) for i in range(n))
            for table in (tables.fetch, tables.train):
                columns = table.select(["epoch", "iteration", "gpu"]).to_pydict()
                assert Counter(zip(*columns.values(), strict=True)) == expected_keys


def _has_schedstat() -> bool:
    return Path("/proc/thread-self/schedstat").exists()


def test_timer_logs_each_finished_iteration_syncs_once_and_skips_a_broken_one(
    torch, tmp_path: Path
) -> None:
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    calls = []
    loader = instrument_loader(DataLoader(Squares(10), batch_size=2), log_dir=tmp_path, rank=4)
    timer = TrainingTimer(log_dir=tmp_path, rank=4, sync=lambda: calls.append(1))
    for i, _ in enumerate(timer.iterate(loader, epoch=3)):
        if i == 2:
            break
    fetches, trains = read_log(tmp_path / "rank4.log")
    assert [(r["epoch"], r["it"], r["total"]) for r in trains] == [("3", "0", "5"), ("3", "1", "5")]
    assert len(calls) == 2
    assert [r["idx"] for r in fetches] == ["0", "1", "2"]
    assert {r["thr"] is not None for r in trains} == {True}  # batch size taken from the loader


def test_a_timed_loader_logs_the_iterations_of_a_loop_that_reads_one_batch_ahead(
    torch, tmp_path: Path
) -> None:
    """Framework loops that ask for batch k+1 before step k (accelerate) and never ask
    past the last batch: iteration k then ends where batch k+1 is asked for, the last one
    where ``_dsim_finish`` is called, each epoch numbered by ``epoch()`` when the epoch's
    iterator is made."""
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    epochs = iter([7, 8])
    timer = TrainingTimer(log_dir=tmp_path, rank=1, batch_size=2)
    plain = DataLoader(Squares(6), batch_size=2, collate_fn=tuple_collate)
    loader = instrument_loader(
        plain, log_dir=tmp_path, rank=1, timer=timer, epoch=lambda: next(epochs),
        settings={"local_world_size": 3, "batch_size": 5},
    )  # fmt: skip
    steps = []
    for _ in range(2):
        batches = iter(loader)
        ahead = next(batches)
        for k in range(3):
            if k < 2:
                current, ahead = ahead, next(batches)
            else:
                current = ahead
                loader._dsim_finish()  # where the loop stops asking
            time.sleep(0.02)  # the step
            steps.append(current)
    assert all(map(same, steps, list(plain) * 2))
    loaders: list[dict[str, str]] = []
    fetches, trains = read_log(tmp_path / "rank1.log", loaders)
    assert [(r["epoch"], r["it"], r["total"]) for r in trains] == [
        (e, str(i), "3") for e in ("7", "8") for i in range(3)
    ]
    assert len(fetches) == 6 and len(loaders) == 2
    assert {(r["local_world_size"], r["batch_size"]) for r in loaders} == {("3", "5")}
    # Iteration k (k >= 1) holds the step on batch k-1, taken while batch k was asked for.
    assert all(float(r["time"]) >= 0.02 for r in trains if r["it"] != "0")
    loader._dsim_finish()  # nothing running: a no-op
    with pytest.raises(UsageError, match="both timer= and epoch="):
        instrument_loader(plain, log_dir=tmp_path, timer=timer)


def test_finishing_mid_epoch_logs_the_running_iteration_and_asks_for_no_batch(
    torch, tmp_path: Path
) -> None:
    """A framework loop that stops mid-epoch (``max_steps``, a resumed epoch's end) ends
    the iteration in flight with ``_dsim_finish``: its training line is written, and no
    further batch is asked of the loader (no fetch line, no time spent building it)."""
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    timer = TrainingTimer(log_dir=tmp_path, rank=0, batch_size=2)
    plain = DataLoader(Squares(12), batch_size=2, collate_fn=tuple_collate)  # 6 batches
    loader = instrument_loader(plain, log_dir=tmp_path, timer=timer, epoch=lambda: 0)
    batches = iter(loader)
    ahead = next(batches)
    for _ in range(2):  # steps on batches 0 and 1, each after asking for the next
        ahead = next(batches)
    loader._dsim_finish()  # the loop stops after the step on batch 1; batch 2 in flight
    fetches, trains = read_log(tmp_path / "rank0.log")
    assert [r["it"] for r in trains] == ["0", "1", "2"]
    assert [r["idx"] for r in fetches] == ["0", "1", "2"]  # nothing built past batch 2
    assert same(ahead, list(plain)[2])
    loader._dsim_finish()  # nothing running any more: a no-op
    assert len(read_log(tmp_path / "rank0.log")[1]) == 3


def test_a_loader_rebuilt_from_the_instrumented_ones_attributes_still_collates(
    torch, tmp_path: Path
) -> None:
    """accelerate's skip_first_batches (on resume) and Lightning rebuild a loader from its
    attributes: its untagged samples must still be collated with the user's collate_fn."""
    from torch.utils.data import DataLoader

    from dsim.instrument import instrument_loader

    plain = DataLoader(Squares(4), batch_size=2, collate_fn=tuple_collate)
    loader = instrument_loader(plain, log_dir=tmp_path, rank=0)
    rebuilt = DataLoader(loader.dataset, batch_size=2, collate_fn=loader.collate_fn)
    assert all(map(same, plain, rebuilt))


class _SkipFirst:
    """A batch sampler that skips another's first ``skip_batches`` (as accelerate's
    ``SkipBatchSampler`` does, written here without accelerate)."""

    def __init__(self, batch_sampler, skip_batches: int):
        self.batch_sampler, self.skip_batches = batch_sampler, skip_batches

    def __iter__(self):
        for k, indices in enumerate(self.batch_sampler):
            if k >= self.skip_batches:
                yield indices

    def __len__(self) -> int:
        return len(self.batch_sampler) - self.skip_batches


@pytest.mark.parametrize("workers", [0, 2])
def test_a_rebuilt_loader_resuming_an_epoch_logs_its_batches_at_their_positions(
    torch, tmp_path: Path, workers: int
) -> None:
    """A loader rebuilt from an instrumented one's attributes to resume an epoch past
    its first 3 batches (accelerate's skip_first_batches), given to instrument_rebuilt:
    the same batches as the plain loader's from batch 3, fetch lines data idx 3-9 from
    its workers and training lines [3/10] … [9/10], into the original's file."""
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader
    from dsim.instrument.loader import instrument_rebuilt

    kwargs = {"num_workers": workers} if workers else {}
    plain = DataLoader(Squares(20), batch_size=2, collate_fn=tuple_collate, **kwargs)
    loader = instrument_loader(plain, log_dir=tmp_path, rank=2)
    rebuilt = DataLoader(
        loader.dataset, batch_sampler=_SkipFirst(loader.batch_sampler, 3),
        collate_fn=loader.collate_fn, **kwargs,
    )  # fmt: skip
    timer = TrainingTimer(rank=2, batch_size=2, sink=loader.dataset._dsim_sink)
    resumed = instrument_rebuilt(rebuilt, 3, timer=timer, epoch=lambda: 4)
    batches = list(resumed)
    assert len(batches) == 7 and all(map(same, list(plain)[3:], batches))
    fetches, trains = read_log(tmp_path / "rank2.log")
    assert sorted(int(r["idx"]) for r in fetches) == list(range(3, 10))
    assert {r["gpu"] for r in fetches + trains} == {"2"}
    assert [(r["epoch"], int(r["it"]), r["total"]) for r in trains] == [
        ("4", i, "10") for i in range(3, 10)
    ]
    with pytest.raises(UsageError, match="already instrumented"):
        instrument_rebuilt(resumed, 3)
    with pytest.raises(UsageError, match="rebuilt from an instrumented one"):
        instrument_rebuilt(plain, 3)
    with pytest.raises(UsageError, match="not both"):
        TrainingTimer(log_dir=tmp_path, sink=loader.dataset._dsim_sink)


def test_rank_comes_from_the_environment_and_logger_output_works(
    torch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    monkeypatch.setenv("RANK", "3")
    logger = logging.getLogger("dsim-test-instrument")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(tmp_path / "out.log")
    handler.setFormatter(logging.Formatter("[rank3]: %(message)s"))
    logger.addHandler(handler)
    try:
        loader = instrument_loader(DataLoader(Squares(4), batch_size=2), logger=logger)
        for _ in TrainingTimer(logger=logger).iterate(loader, epoch=0):
            pass
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = (tmp_path / "out.log").read_text().splitlines()
    assert len(lines) == 5
    assert all(line.startswith("[rank3]: ") for line in lines)
    stripped = [line.removeprefix("[rank3]: ") for line in lines]
    # The loader line comes with the first batch (after its fetch line), carrying its bytes:
    # x is 2 float32 × 2 samples, label 2 int64 (the names are not tensors).
    [loader_line] = [m for s in stripped if (m := LOADER_RE.match(s))]
    assert loader_line["batch_bytes"] == str(2 * 2 * 4 + 2 * 8)
    assert sum(bool(FETCH_RE.match(s)) for s in stripped) == 2
    assert sum(bool(TRAIN_RE.match(s)) for s in stripped) == 2
    assert all("GPU: 3 " in s for s in stripped)


def test_spawned_workers_and_attribute_passthrough(torch, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from dsim.instrument import instrument_loader

    plain = DataLoader(Squares(6), batch_size=3, num_workers=1, multiprocessing_context="spawn")
    loader = instrument_loader(plain, log_dir=tmp_path, rank=0)
    assert loader.dataset.note == "passes through" and loader.dataset.wrapped is plain.dataset
    loader.dataset.note = "set through"
    assert plain.dataset.note == "set through"
    assert all(map(same, plain, loader))
    fetches, _ = read_log(tmp_path / "rank0.log")
    assert sorted(r["idx"] for r in fetches) == ["0", "1"]


def test_refuses_what_it_cannot_time(torch, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from dsim.instrument import TrainingTimer, instrument_loader

    # IterableDatasets are instrumented since #23 (tests/test_iterable.py).
    once = instrument_loader(DataLoader(Squares(2)), log_dir=tmp_path)
    with pytest.raises(UsageError, match="already"):
        instrument_loader(once, log_dir=tmp_path)
    with pytest.raises(UsageError, match="exactly one"):
        TrainingTimer()
    with pytest.raises(UsageError, match="total="):
        list(TrainingTimer(log_dir=tmp_path).iterate(iter([1, 2]), epoch=0))


def test_dsim_import_does_not_import_torch() -> None:
    code = "import dsim.instrument, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_real_parser_reads_two_ranks_with_zero_rejects(torch, tmp_path: Path) -> None:
    """Two ranks of a DistributedSampler, two epochs, then `dsim parse` and the Parquet tables."""
    from dsim.instrument import TrainingTimer, instrument_loader

    log_dir = tmp_path / "logs" / "instr_squares_none_mlp_epoch2_b6_worker2_thread0"
    cfg = {
        "size": 22,
        "batch": 3,
        "drop_last": False,
        "shuffle": True,
        "workers": 2,
        "persistent": True,
        "prefetch": 2,
        "collate": False,
        "distributed": True,
        "getitems": False,
    }
    for rank in (0, 1):
        original, sampler = make_loader(torch, cfg, rank)
        loader = instrument_loader(original, log_dir=log_dir, rank=rank)
        run_epochs(torch, loader, sampler, 2, TrainingTimer(log_dir=log_dir, rank=rank))
    n = len(original)
    out = tmp_path / "traces"
    dsim = Path(sys.executable).with_name("dsim")
    proc = subprocess.run(
        [str(dsim), "parse", str(log_dir), "--out", str(out), "--name", "run"],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    from dsim.model.tables import read_run

    run = read_run(out / "run")
    fetch = run.fetch.to_pandas()
    train = run.train.to_pandas()
    expected = {(e, i, g) for e in (0, 1) for i in range(n) for g in (0, 1)}
    assert set(zip(fetch.epoch, fetch.iteration, fetch.gpu, strict=True)) == expected
    assert len(fetch) == len(expected)
    assert set(zip(train.epoch, train.iteration, train.gpu, strict=True)) == expected
    assert len(train) == len(expected)
    assert run.info.gpu_count == 2
    report = run.info.report
    assert report["rejected"] == 0 and report["other_lines"] == 0, report
    assert report["fetch_records"] == report["train_records"] == len(expected)
    assert report["incomplete_iterations"]["count"] == 0
    # CPU times travel into the tables (SPEC §2.1), the node's fields into run.json.
    assert (fetch.cpu_s >= 0).all() and (train.cpu_s >= 0).all()
    assert ("runq_s" in fetch) == ("runq_s" in train) == _has_schedstat()
    assert run.info.loader["cores"] == len(os.sched_getaffinity(0))
    # The largest first batch (3 samples: x 3 × 2 float32, label 3 int64) reaches run.json.
    assert run.info.loader["batch_bytes"] == 3 * 2 * 4 + 3 * 8
    assert "local_world_size" in run.info.loader
