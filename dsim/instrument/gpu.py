"""Record GPU utilisation from inside the job, in nvidia-smi's CSV format.

Where starting ``nvidia-smi -lms 100`` beside the job is awkward (a
scheduler, a container without the binary), the job can sample NVML
itself. The rows are written exactly as ``nvidia-smi --query-gpu=timestamp,
index,utilization.gpu,memory.used --format=csv`` writes them, so ``dsim
parse`` reads either the same way (docs/SPEC.md §1.9). NVML comes from the
``nvidia-ml-py`` package (module ``pynvml``), imported only when recording
starts: dsim needs neither it nor a GPU.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
MIB = 1 << 20


def _nvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise ImportError(
            "GpuUtilRecorder needs NVML bindings: pip install nvidia-ml-py "
            "(or run `nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used "
            "--format=csv -lms 100 > LOG_DIR/gpu.csv` beside the job)"
        ) from None
    return pynvml


class GpuUtilRecorder:
    """Samples every visible GPU every ``interval_s`` on a background thread.

    Start it in one process per node (e.g. local rank 0), writing into the
    run's log directory; each sample appends one row per GPU, written with
    one ``write`` so a crash never leaves half a row::

        with GpuUtilRecorder("logs/myrun/gpu.csv"):
            train()

    ``indices`` limits sampling to those NVML device indices. nvidia-smi's
    index is what dsim takes as the rank, so keep NVML's order (do not
    renumber with CUDA_VISIBLE_DEVICES in mind).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        interval_s: float = 0.1,
        indices: list[int] | None = None,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.path = Path(path)
        self.interval_s = interval_s
        self.indices = indices
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []

    def start(self) -> GpuUtilRecorder:
        if self._thread is not None:
            raise RuntimeError("GpuUtilRecorder is already recording")
        nvml = _nvml()
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        indices = range(count) if self.indices is None else self.indices
        self._handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        self._nvml = nvml
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._append(HEADER)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="dsim-gpu-util", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._nvml.nvmlShutdown()

    def sample(self) -> str:
        """One row per GPU for now, as nvidia-smi prints them."""
        now = dt.datetime.now()
        stamp = f"{now:%Y/%m/%d %H:%M:%S}.{now.microsecond // 1000:03d}"
        rows = []
        for index, handle in self._handles:
            rows.append(f"{stamp}, {index}, {self._read(handle)}\n")
        return "".join(rows)

    def _read(self, handle: Any) -> str:
        """``45 %, 1234 MiB``; ``[N/A]`` for what NVML cannot tell, as nvidia-smi writes it."""
        nvml = self._nvml
        try:
            util = f"{nvml.nvmlDeviceGetUtilizationRates(handle).gpu} %"
        except nvml.NVMLError:
            util = "[N/A]"
        try:
            used = f"{nvml.nvmlDeviceGetMemoryInfo(handle).used // MIB} MiB"
        except nvml.NVMLError:
            used = "[N/A]"
        return f"{util}, {used}"

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._append(self.sample())
            self._stop.wait(self.interval_s)

    def _append(self, text: str) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(text)

    def __enter__(self) -> GpuUtilRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
