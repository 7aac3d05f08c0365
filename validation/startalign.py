"""Physical start alignment: the ranks' DataLoader workers share fetch start times.

A board is a float64 array ``[2, epochs, iterations, ranks]`` in a file under
``/dev/shm`` (or the temporary directory), created by the job's parent before
the ranks fork and removed at its end, followed by a uint32 *release word*
per batch ``[epochs, iterations]`` that the barrier sleeps on. Plane 0 holds the moment each rank's
worker *posted* the start of batch (e, i) — when it was free and had the
batch's indices, i.e. the start it would have had without alignment; plane 1
the moment it began spending the batch's cost. Times are ``time.monotonic()``,
which on Linux is one clock for all processes. NaN means not posted yet.
Aligned 8-byte stores and loads are atomic on the platforms the harness runs
on, and every cell has one writer (the worker of rank r that fetches (e, i)).

Modes (``--start-align``):

* ``none`` — no board;
* ``min`` — causal start-min: post, read the earliest posted start of (e, i)
  over ranks, start at max(own, earliest). That is always the own start (no
  fetch begins before its worker is free), so start-min never waits; what it
  records is how often, and by how much, causality clipped it (own start more
  than ``CLIP_S`` after the earliest: the shift a non-causal start-min wants);
* ``max`` — a barrier: post, wait until every rank has posted (e, i), start
  then (all ranks gated to the last). The waiters sleep in the kernel (a
  futex on the batch's release word, which the last poster sets and wakes),
  so waiting costs no CPU: a barrier that polled every 0.2 ms burned 2-4 ms
  of CPU time per batch on the 2-core VM, slowed the trainers that share the
  cores (their step after the last arrival grew from 25-28 to 33-37 ms in
  held-out 3's start-max runs) and so measured a what-if other than "fetches
  start together". Two ranks posting at once may each miss the other's post
  (a store then a load on x86 can reorder), so a waiter also wakes every
  ``FUTEX_RECHECK_S`` and looks again; where futexes are unavailable (not
  Linux on x86-64 or arm64), it polls every ``POLL_S``;
* ``control`` — post and read as ``max`` would, never wait: the mechanism's
  own overhead.

Why ``max`` cannot deadlock (batches in the order (e, i) the sampler yields):
suppose every rank has posted every batch before (e, i). Each of those
batches was then released (its barrier saw all posts), so it completes in
finite time on every rank; every rank's training loop receives it, and each
all-reduce of those iterations finds all ranks. A rank sends the indices of
(e, i) once batch i - prefetch*workers of its epoch has been handed to its
loop (or with the epoch's first window), and the worker that fetches (e, i)
works through its index queue in order, so it is free once its earlier —
released — batches are done. So every rank posts (e, i), its barrier opens,
and by induction every batch is posted. With 0 workers the training process
fetches batch i after iteration i - 1, which all ranks finish by the same
argument. ``WAIT_LIMIT_S`` turns a violated assumption into an error rather
than a hang.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = ("none", "min", "max", "control")
CLIP_S = 1e-3  # own start later than the earliest by more: start-min was clipped
POLL_S = 2e-4  # the barrier's sleep between looks at the board, where no futex is
FUTEX_RECHECK_S = 1e-2  # a futex waiter's look again (a missed wake costs at most this)
WAIT_LIMIT_S = 120.0

#: ``futex(2)``'s system call number per machine (absent: poll instead).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not _PRIVATE): the waiters are other processes


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc() -> ctypes.CDLL | None:
    if _SYS_FUTEX is None or platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.syscall.restype = ctypes.c_long
    return libc


_LIBC = _libc()


def futex_wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the uint32 at ``address`` holds ``expected``, at most ``timeout_s``."""
    assert _LIBC is not None
    whole = int(timeout_s)
    timeout = _Timespec(whole, int((timeout_s - whole) * 1e9))
    _LIBC.syscall(
        ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAIT),
        ctypes.c_uint32(expected), ctypes.byref(timeout), None, ctypes.c_uint32(0),
    )  # fmt: skip


def futex_wake(address: int) -> None:
    """Wake every process sleeping on the uint32 at ``address``."""
    assert _LIBC is not None
    _LIBC.syscall(
        ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAKE),
        ctypes.c_int(2**31 - 1), None, None, ctypes.c_uint32(0),
    )  # fmt: skip


def _board_bytes(shape: tuple[int, int, int]) -> int:
    return 2 * int(np.prod(shape)) * 8


def board_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def create_board(epochs: int, iterations: int, ranks: int, tag: str) -> Path:
    """A new board file filled with NaN; the caller removes it (``remove_board``)."""
    fd, name = tempfile.mkstemp(prefix=f"dsim-startalign-{tag}-", suffix=".f64", dir=board_dir())
    os.close(fd)
    board = np.memmap(name, dtype=np.float64, mode="w+", shape=(2, epochs, iterations, ranks))
    board[:] = np.nan
    board.flush()
    del board
    with open(name, "ab") as f:  # the release words, zero: no batch released yet
        f.write(bytes(4 * epochs * iterations))
    return Path(name)


def remove_board(path: Path) -> None:
    path.unlink(missing_ok=True)


class StartGate:
    """One process's view of the board (opened lazily: DataLoader workers are forked later)."""

    def __init__(self, path: Path, mode: str, shape: tuple[int, int, int]):
        if mode not in MODES or mode == "none":
            raise ValueError(
                f"start alignment {mode!r} needs no gate (choose from min, max, control)"
            )
        self.path, self.mode, self.shape = Path(path), mode, shape
        self._board: np.ndarray | None = None
        self._released: np.ndarray | None = None
        self._pid = -1

    def _open(self) -> np.ndarray:
        if self._board is None or self._pid != os.getpid():
            self._board = np.memmap(self.path, dtype=np.float64, mode="r+", shape=(2, *self.shape))
            self._released = np.memmap(
                self.path, dtype=np.uint32, mode="r+", offset=_board_bytes(self.shape),
                shape=self.shape[:2],
            )  # fmt: skip
            self._pid = os.getpid()
        return self._board

    def __getstate__(self) -> dict:  # spawned workers reopen the file themselves
        return {**self.__dict__, "_board": None, "_released": None, "_pid": -1}

    def _release_address(self, epoch: int, batch: int) -> int:
        released = self._released
        assert released is not None
        return released.ctypes.data + 4 * (epoch * self.shape[1] + batch)

    def enter(self, epoch: int, batch: int, rank: int) -> float:
        """Post this rank's start of (epoch, batch); return when it may spend the cost."""
        board = self._open()
        own = time.monotonic()
        board[0, epoch, batch, rank] = own
        posted = board[0, epoch, batch]
        if self.mode == "max":
            self._barrier(epoch, batch, own)
            begin = time.monotonic()
        else:  # min never starts before its own start; control never waits
            np.nanmin(posted)  # the read a start-min does (control measures its cost)
            begin = time.monotonic()
        board[1, epoch, batch, rank] = begin
        return begin

    def _barrier(self, epoch: int, batch: int, own: float) -> None:
        """Return once every rank has posted (epoch, batch), sleeping, not spinning."""
        posted = self._open()[0, epoch, batch]
        released = self._released
        assert released is not None
        address = self._release_address(epoch, batch)
        if not np.isnan(posted).any():  # the last to post releases the others
            released[epoch, batch] = 1
            if _LIBC is not None:
                futex_wake(address)
            return
        while np.isnan(posted).any():
            if time.monotonic() - own > WAIT_LIMIT_S:
                missing = np.flatnonzero(np.isnan(posted)).tolist()
                raise RuntimeError(
                    f"start-align max: ranks {missing} never posted batch {batch} of epoch "
                    f"{epoch} within {WAIT_LIMIT_S:.0f} s"
                )
            if _LIBC is None:
                time.sleep(POLL_S)
            elif not released[epoch, batch]:
                futex_wait(address, 0, FUTEX_RECHECK_S)

    def read(self) -> np.ndarray:
        return np.array(self._open())


def _stats(values_s: np.ndarray) -> dict[str, float | int]:
    ms = values_s * 1e3
    return {
        "count": len(ms),
        "mean_ms": round(float(ms.mean()), 3) if len(ms) else 0.0,
        "p90_ms": round(float(np.quantile(ms, 0.9)), 3) if len(ms) else 0.0,
    }


def summarize(board: np.ndarray, mode: str) -> dict[str, object]:
    """What ``<run>/start_align.json`` records, per rank, from a finished run's board.

    ``clipped``: batches whose own start was more than ``CLIP_S`` after the
    earliest posted start of the same batch (the shift start-min wanted and
    causality refused), with its mean and 90th percentile; ``waited``: the time
    between posting and starting to spend (the barrier's cost under ``max``,
    the bookkeeping under ``min``/``control``).
    """
    posted, began = board[0], board[1]
    if np.isnan(posted).any() or np.isnan(began).any():
        missing = int(np.isnan(posted).sum())
        raise ValueError(f"the start-align board has {missing} batches never posted")
    shift = posted - posted.min(axis=2, keepdims=True)
    waited = began - posted
    ranks = []
    for r in range(board.shape[3]):
        s = shift[:, :, r].ravel()
        clip = s[s > CLIP_S]
        ranks.append(
            {
                "rank": r,
                "batches": int(s.size),
                "clipped": _stats(clip),
                "clipped_share_pct": round(100.0 * clip.size / max(s.size, 1), 2),
                "waited": _stats(waited[:, :, r].ravel()),
            }
        )
    return {
        "mode": mode,
        "clip_threshold_ms": CLIP_S * 1e3,
        "clock": "time.monotonic",
        "ranks": ranks,
    }


def write_summary(board_path: Path, mode: str, shape: tuple[int, int, int], out: Path) -> dict:
    board = np.array(np.memmap(board_path, dtype=np.float64, mode="r", shape=(2, *shape)))
    summary = summarize(board, mode)
    out.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return summary


__all__ = ["MODES", "StartGate", "create_board", "remove_board", "summarize", "write_summary"]
