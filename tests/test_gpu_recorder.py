"""dsim.instrument.GpuUtilRecorder against NVML bindings that answer like a 2-GPU machine.

These machines have no GPU, so ``pynvml`` is a stand-in with NVML's call
names and result shapes; what is under test is that the recorder's rows
are nvidia-smi's CSV format, which the real parser reads without a reject.
"""

from __future__ import annotations

import sys
import time
import types
from types import SimpleNamespace

import pytest

from dsim.instrument.gpu import GpuUtilRecorder
from dsim.sources.gpuutil import is_util_log, read_util_log


class NVMLError(Exception):
    pass


def fake_nvml(calls: list[str]) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: calls.append("init")
    nvml.nvmlShutdown = lambda: calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"

    def utilisation(handle):
        if handle == "gpu1" and calls.count("util1") == 1 and "failed" not in calls:
            calls.append("failed")
            raise NVMLError("not supported")  # the second sample of GPU 1, once
        calls.append("util1" if handle == "gpu1" else "util0")
        return SimpleNamespace(gpu=37 if handle == "gpu0" else 80, memory=5)

    nvml.nvmlDeviceGetUtilizationRates = utilisation
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=3 * (1 << 30), total=0, free=0)
    return nvml


def test_rows_are_nvidia_smi_csv_that_dsim_parses(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls))
    path = tmp_path / "logs" / "gpu.csv"
    with GpuUtilRecorder(path, interval_s=0.01):
        deadline = time.monotonic() + 10
        while calls.count("util0") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert calls[0] == "init" and calls[-1] == "shutdown"
    assert is_util_log(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "timestamp, index, utilization.gpu [%], memory.used [MiB]"
    assert lines[1].endswith(", 0, 37 %, 3072 MiB") and lines[2].endswith(", 1, 80 %, 3072 MiB")
    log = read_util_log(path)
    assert log.samples.num_rows == len(lines) - 2  # all but the header and the [N/A] row
    assert set(log.samples["util_pct"].to_pylist()) == {37.0, 80.0}
    assert log.rejects["reason"].to_pylist() == ["utilisation not reported ([N/A])"]


def test_a_second_recording_appends_without_a_second_header(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([]))
    path = tmp_path / "gpu.csv"
    for _ in range(2):
        recorder = GpuUtilRecorder(path, interval_s=10, indices=[0]).start()
        recorder.stop()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("timestamp") and "index" not in lines[2]


def test_without_nvml_bindings_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ImportError, match="pip install nvidia-ml-py"):
        GpuUtilRecorder(tmp_path / "gpu.csv").start()
    assert not (tmp_path / "gpu.csv").exists()
    with pytest.raises(ValueError, match="interval_s"):
        GpuUtilRecorder(tmp_path / "gpu.csv", interval_s=0)
