"""The ``pipeline`` replay model behind the common interface (docs/SPEC.md §3.5).

The mechanics and the calibration are in ``pipeline_kernel``; this module
only connects them to execution: ``prepare`` calibrates a run once under its
measured loader settings, ``replay`` replays rows under a policy and the
loader settings ``ReplayParams`` asks for (``workers``/``prefetch_factor``;
``None`` keeps the measured value), and ``cut_points`` allows execution to
split a run only where the model restarts anyway: at the first row of every
segment (a run of consecutive iterations of one epoch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dsim.errors import UsageError
from dsim.replay.models.base import Replay, ReplayModel
from dsim.replay.params import LoaderSettings, ReplayParams
from dsim.replay.policies import Policy

if TYPE_CHECKING:  # the kernel imports numba (~0.3 s): only runs of this model load it
    from dsim.replay.arrays import IterationArrays
    from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

#: Alignments the pipeline kernel knows (it aggregates start times inside the recurrence).
SUPPORTED = ("actual", "min", "avg", "max")


@dataclass(frozen=True)
class PreparedPipeline:
    """A calibrated run (or a slice of whole segments of one): inputs, calibration, settings."""

    inputs: PipelineInputs
    calibration: Calibration

    @property
    def shape(self) -> tuple[int, int]:
        return self.inputs.fetch.shape  # type: ignore[return-value]

    def take(self, lo: int, hi: int) -> PreparedPipeline:
        """Rows ``[lo, hi)``, which must start and end at segment bounds (``cut_points``)."""
        seg = self.inputs.segments
        inside = (seg[:, 0] >= lo) & (seg[:, 1] <= hi)
        segments = seg[inside] - lo
        covered = int((segments[:, 1] - segments[:, 0]).sum()) if len(segments) else 0
        if covered != hi - lo:
            raise ValueError(f"rows [{lo}, {hi}) do not fall on segment bounds")
        from dsim.replay.models.pipeline_kernel import Calibration, PipelineInputs

        i, c = self.inputs, self.calibration

        def rows(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a[lo:hi])

        inputs = PipelineInputs(
            segments, rows(i.iteration), rows(i.start), rows(i.fetch), rows(i.arrival),
            rows(i.stall), rows(i.iteration_time), rows(i.worker),
        )  # fmt: skip
        calibration = Calibration(
            c.workers, c.prefetch, rows(c.lat_sent), rows(c.lat_free), rows(c.hand),
            rows(c.deliver), rows(c.after), rows(c.loop),
        )  # fmt: skip
        return PreparedPipeline(inputs, calibration)


def pipeline_inputs(arrays: IterationArrays) -> PipelineInputs:
    """The kernel's row-major inputs from a run's [N, G] arrays."""
    from dsim.replay.models.pipeline_kernel import PipelineInputs, segments_of

    def c(a: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=dtype)

    return PipelineInputs(
        segments_of(arrays.epoch, arrays.iteration),
        c(arrays.iteration, np.int64), c(arrays.start), c(arrays.fetch), c(arrays.arrival),
        c(arrays.stall), c(arrays.iteration_time), c(arrays.worker, np.int64),
    )  # fmt: skip


def measured_loader(arrays: IterationArrays) -> LoaderSettings:
    """The run's loader settings: as its trace logged them, else as its worker ids imply."""
    if arrays.loader is not None:
        return arrays.loader
    return LoaderSettings.implied(arrays.worker)


def assumed_loader(measured: LoaderSettings, params: ReplayParams) -> tuple[int, int]:
    """The (workers, prefetch factor) a replay assumes: the what-if where given, else measured."""
    workers = measured.workers if params.workers is None else params.workers
    prefetch = (
        measured.prefetch_factor if params.prefetch_factor is None else params.prefetch_factor
    )
    return int(workers), int(prefetch)


class PipelineModel(ReplayModel):
    """DataLoader pipelines per rank, coupled by the all-reduce, across iterations."""

    name = "pipeline"
    params = ("workers", "prefetch_factor")
    uses_loader = True

    def prepare(self, arrays: IterationArrays, params: ReplayParams) -> PreparedPipeline:
        from dsim.replay.models.pipeline_kernel import calibrate

        measured = measured_loader(arrays)
        inputs = pipeline_inputs(arrays)
        return PreparedPipeline(
            inputs, calibrate(inputs, measured.workers, measured.prefetch_factor)
        )

    def supports(self, policy: Policy) -> bool:
        return all(name in SUPPORTED for name in policy)

    def replay(self, prepared: PreparedPipeline, policy: Policy, params: ReplayParams) -> Replay:
        unsupported = [name for name in policy if name not in SUPPORTED]
        if unsupported:
            raise UsageError(
                f"the pipeline model cannot replay alignment {unsupported[0]!r} "
                f"(it supports {', '.join(SUPPORTED)})"
            )
        from dsim.replay.models.pipeline_kernel import replay_pipeline

        workers, prefetch = params.workers, params.prefetch_factor
        out = replay_pipeline(prepared.inputs, prepared.calibration, policy, workers, prefetch)
        return Replay(
            iteration_s=out["iteration_s"],
            stall_s=out["stall_s"],
            delay_s=out["delay_s"],
            fetch_diff_s=out["fetch_diff_s"],
            start_diff_s=out["start_diff_s"],
            gpu_stall_s=out["gpu_stall_s"],
        )

    def cut_points(self, arrays: IterationArrays) -> np.ndarray | None:
        from dsim.replay.models.pipeline_kernel import segments_of

        return segments_of(arrays.epoch, arrays.iteration)[:, 0]
