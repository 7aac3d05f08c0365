"""``dsim watch`` as a library call: follow a running job's logs and look at its last window.

Each look (``Watch.look``) takes the complete lines written since the last
one (``dsim.sources.follow``), adds them to what is held of each log, and,
when something new came, parses what is held with the very parser ``dsim
parse`` uses (the registry's raw-log source, clocks set as ``dsim parse``
sets them) and computes the window (``dsim.live``). The parser reads files,
so what is held is written to a private temporary directory, one file per
log under the log's own name (a rank in a file name still names the rank).

What is held stays bounded: after each look, lines older than the window
and as many complete iterations again (at least ``MARGIN`` iterations) are
let go (the fetch epochs of the window's iterations depend only on the
training lines just before them, SPEC §1.4), and the logs together hold
at most ``MAX_HELD_LINES`` lines (each its even share, at least
``MIN_HELD_LINES``). The training records let go are still counted in
each rank's progress.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from dsim.analysis.sanity import check_threshold
from dsim.analysis.summary import DEFAULT_THRESHOLD_S, DEFAULT_WARMUP
from dsim.app.parse import with_clocks_set
from dsim.app.runplan import logged_loader
from dsim.errors import InputError, UsageError
from dsim.live import (
    DEFAULT_POLICIES,
    DEFAULT_WINDOW,
    LiveWindow,
    RankProgress,
    Snapshot,
    live_window,
    rank_progress,
)
from dsim.model.consistency import consistency
from dsim.replay.arrays import build_iteration_arrays
from dsim.replay.policies import Policy
from dsim.sources import RunSource, get_source
from dsim.sources.follow import LogFollower

#: Complete iterations held before the window, at least (see the module docstring); the
#: headline's pipeline model is calibrated on as many before the window (``dsim.live``).
MARGIN = 50
#: Lines held at most, all logs together, whatever the window (about 400 MB at 200 bytes a
#: line): each log keeps its even share, at least ``MIN_HELD_LINES``.
MAX_HELD_LINES = 2_000_000
MIN_HELD_LINES = 20_000
NO_RECORDS = "no fetch or training records yet"
NO_COMPLETE = "no complete iteration yet (every rank must log its fetch and training line)"
NO_FETCHES = "no fetch records yet (the window replays dsim.instrument's fetch lines)"


class Watch:
    """The state of one ``dsim watch``: the follower, the lines held, the last snapshot.

    Use as a context manager (the temporary directory goes with it).
    """

    def __init__(
        self,
        path: Path,
        *,
        window: int = DEFAULT_WINDOW,
        warmup: int = DEFAULT_WARMUP,
        threshold_s: float = DEFAULT_THRESHOLD_S,
        policies: Sequence[Policy] = DEFAULT_POLICIES,
    ) -> None:
        check_threshold(threshold_s, force=False)  # in seconds: 30 meant as 30 ms is refused
        if window < 1:
            raise UsageError(f"--window {window}: the window needs at least 1 iteration")
        self.name, self.path = _the_run(Path(path))
        self.follower = LogFollower(self.path)
        self.follower.check()
        self.window, self.warmup, self.threshold_s = window, warmup, threshold_s
        self.policies = tuple(policies)
        self._held: dict[str, list[bytes]] = {}
        self._let_go: Counter[int] = Counter()  # training records no longer held, per rank
        self._last: Snapshot | None = None
        self._parse_error: InputError | None = None
        self._origin_ns: int | None = None  # the first fetch start seen (see _compute)
        self.report: dict = {}  # the parse report of the lines held at the last parse
        self._dir = tempfile.TemporaryDirectory(prefix="dsim-watch-")

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._dir.cleanup()

    @property
    def parse_error(self) -> InputError | None:
        """What the parser refused at the last look that had new lines (``None``: nothing)."""
        return self._parse_error

    def look(self) -> Snapshot:
        """Read what was written since the last look; the snapshot (the last one if nothing
        new came)."""
        new = self.follower.poll()
        for log, lines in new.items():
            self._held.setdefault(log, []).extend(lines)
        cap = max(MAX_HELD_LINES // max(len(self._held), 1), MIN_HELD_LINES)
        for held in self._held.values():
            if len(held) > cap:
                _let_go(held, len(held) - cap)
        if not self.path.exists():
            # Deleted or moved while followed: say so over what was last seen (it stayed
            # on screen without a word, as if the job had stopped logging), and keep
            # looking, as `tail -F` does, for the job may write it again.
            base = self._last or self._snapshot(None, None)
            if base.waiting != self._gone or base.files != self.follower.stats.files:
                self._last = replace(base, files=self.follower.stats.files, waiting=self._gone)
            return self._last
        back = self._last is not None and self._last.waiting == self._gone
        if self._last is not None and not new and not back:
            if self._last.files != self.follower.stats.files:
                self._last = replace(self._last, files=self.follower.stats.files)
            return self._last
        self._last = self._compute()
        return self._last

    @property
    def _gone(self) -> str:
        return (
            f"{self.path} is gone (deleted or moved): the numbers below are from before; "
            "watching for it to come back"
        )

    def _snapshot(self, view: LiveWindow | None, waiting: str | None) -> Snapshot:
        return Snapshot(self.name, str(self.path), self.follower.stats.files, view, waiting)

    def _compute(self) -> Snapshot:
        files = self._write_held()
        self._parse_error = None
        if not files:
            self._parse_error = InputError(f"{NO_RECORDS} (its logs are empty)", self.path)
            return self._snapshot(None, NO_RECORDS)
        try:
            parsed = get_source("rawlog").parse(RunSource(self.name, files), keep_lines=True)
        except InputError as exc:
            exc = self._named_for_user(exc)
            self._parse_error = exc
            if "no fetch or training records" in exc.reason:
                return self._snapshot(None, NO_RECORDS)
            return self._snapshot(None, f"the lines read so far cannot be replayed: {exc.reason}")
        self.report = parsed.report
        tables = with_clocks_set(parsed.tables)
        tables = replace(tables, info=tables.info.with_consistency(consistency(tables.train)))
        train = tables.train
        gpu = np.asarray(train.column("gpu").to_numpy(), dtype=np.int64)
        epoch = np.asarray(train.column("epoch").to_numpy(), dtype=np.int64)
        iteration = np.asarray(train.column("iteration").to_numpy(), dtype=np.int64)
        ranks = rank_progress(gpu, epoch, iteration, self._let_go)
        if tables.fetch.num_rows == 0:
            return self._snapshot(_progress_only(self, ranks), NO_FETCHES)
        if tables.train.num_rows == 0:
            return self._snapshot(_progress_only(self, ranks), NO_COMPLETE)
        # Times relative to the first fetch ever seen, as in `dsim run` of the whole logs:
        # the same iterations then round the same way (bit for bit).
        starts = tables.fetch.column("start").cast(pa.timestamp("ns")).cast(pa.int64())
        first = int(np.asarray(starts.to_numpy()).min())
        self._origin_ns = first if self._origin_ns is None else min(self._origin_ns, first)
        arrays = build_iteration_arrays(tables.fetch, tables.train, origin_ns=self._origin_ns)
        # The loader settings as `dsim run` gives them to the pipeline model (the headline).
        arrays = replace(arrays, loader=logged_loader(tables.info))
        view = live_window(
            self.name,
            arrays,
            ranks,
            window=self.window,
            warmup=self.warmup,
            threshold_s=self.threshold_s,
            policies=self.policies,
            trace=tables.info.document(),
            calibration=max(self.window, MARGIN),
        )
        self._let_go_before(parsed.lines, tables, arrays, files, view)
        if not view.rows:
            if arrays.n_iterations == 0:
                return self._snapshot(view, NO_COMPLETE)
            return self._snapshot(
                view, f"no complete iteration past the warm-up (iteration > {self.warmup}) yet"
            )
        return self._snapshot(view, None)

    def _named_for_user(self, exc: InputError) -> InputError:
        """The parser's error about a held copy, said of the log it came from (its line
        numbers count from the first line held, so they are left out)."""
        if exc.path is None or exc.path.parent != Path(self._dir.name):
            return exc
        real = self.path / exc.path.name if self.path.is_dir() else self.path
        return InputError(exc.reason, real)

    def _write_held(self) -> tuple[Path, ...]:
        """What is held, one file per log in the temporary directory; their paths, by name."""
        root = Path(self._dir.name)
        files = []
        for log, lines in sorted(self._held.items()):
            target = root / log
            with open(target, "wb") as handle:
                handle.write(b"".join(lines))
            if lines:
                files.append(target)
        return tuple(files)

    def _let_go_before(self, lines, tables, arrays, files: tuple[Path, ...], view) -> None:
        """Let go of each log's lines before the first one the next looks still need."""
        if view.first is None or "train" not in lines:
            return
        keys = arrays.epoch.astype(np.int64) * 2**32 + arrays.iteration.astype(np.int64)
        first = int(np.searchsorted(keys, view.first[0] * 2**32 + view.first[1]))
        keep_from = int(keys[max(first - max(view.window, MARGIN), 0)])

        def table_keys(table) -> np.ndarray:
            e = np.asarray(table.column("epoch").to_numpy(), dtype=np.int64)
            i = np.asarray(table.column("iteration").to_numpy(), dtype=np.int64)
            return e * 2**32 + i

        train_keys = table_keys(tables.train)
        train_gpu = np.asarray(tables.train.column("gpu").to_numpy(), dtype=np.int64)
        needed_file = np.concatenate(
            [
                lines["train"][0][train_keys >= keep_from],
                lines["fetch"][0][table_keys(tables.fetch) >= keep_from],
            ]
        )
        needed_line = np.concatenate(
            [
                lines["train"][1][train_keys >= keep_from],
                lines["fetch"][1][table_keys(tables.fetch) >= keep_from],
            ]
        )
        for index, path in enumerate(files):
            mine = needed_line[needed_file == index]
            if not len(mine):
                continue
            cut = int(mine.min())  # 1-based: lines before it go
            if cut <= 1:
                continue
            gone = (lines["train"][0] == index) & (lines["train"][1] < cut)
            self._let_go.update(int(g) for g in train_gpu[gone])
            _let_go(self._held[path.name], cut - 1)


#: The mark of a loader line (SPEC §1.2), as the parser's fast path finds it.
LOADER_MARK = b" LOADER "


def _let_go(held: list[bytes], count: int) -> None:
    """Drop a log's first ``count`` held lines, but keep the last loader line among them.

    A loader line comes once per epoch and rank; the window's epoch may have started
    long before the lines held, and without it the headline's pipeline model would fall
    back to implied loader settings (and no CPU-aware replay), unlike `dsim run`'s. A
    line's place in a log does not matter to the parser (SPEC §1.2).
    """
    gone = held[:count]
    loader = next((line for line in reversed(gone) if LOADER_MARK in line), None)
    del held[:count]
    if loader is not None:
        held.insert(0, loader)


def _progress_only(watch: Watch, ranks: list[RankProgress]) -> LiveWindow:
    return LiveWindow(
        run=watch.name,
        ranks=ranks,
        complete=0,
        window=watch.window,
        iterations=0,
        first=None,
        last=None,
        warmup=watch.warmup,
        threshold_s=watch.threshold_s,
        model="per-iteration",
    )


def _the_run(path: Path) -> tuple[str, Path]:
    """The run's name as ``dsim parse`` gives it, and the directory (or file) to follow:
    a tree holding one run is that run; a tree of several runs is refused."""
    runs = get_source("rawlog").discover([path])
    if len(runs) != 1:
        where = ", ".join(str(r.files[0].parent) for r in runs[:3])
        raise UsageError(
            f"{path} holds {len(runs)} runs ({where}{', ...' if len(runs) > 3 else ''}); "
            "dsim watch follows one: give its directory"
        )
    run = runs[0]
    if path.is_dir() and run.files and run.files[0].parent != path:
        return run.name, run.files[0].parent
    return run.name, path
