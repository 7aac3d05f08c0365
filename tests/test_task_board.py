"""The parse pool's task board: naming the run of a worker killed from outside.

A real forked worker, a real SIGKILL (as the out-of-memory killer sends); the
kill lands while the worker holds the board's lock, the one moment where a
locked read in the parent would wait forever.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

from dsim import processes


def _claim_then_hold_the_lock(board, started) -> None:
    processes.worker_init(os.getppid(), board)
    processes.in_worker(_hold_the_lock, board, started, task=7)


def _hold_the_lock(board, started) -> None:
    board.get_lock().acquire()
    started.set()
    threading.Event().wait()  # until killed


def test_the_run_of_a_worker_killed_holding_the_lock_is_named_at_once() -> None:
    context = multiprocessing.get_context("fork")
    board = processes.task_board(2)
    started = context.Event()
    worker = context.Process(target=_claim_then_hold_the_lock, args=(board, started))
    worker.start()
    assert started.wait(60), "the worker never started its task"
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(60)

    named: list[list[int]] = []
    reader = threading.Thread(target=lambda: named.append(processes.killed_tasks(board)))
    reader.daemon = True  # a locked read would never return
    reader.start()
    reader.join(10)
    assert named == [[7]], "killed_tasks waited on the lock the dead worker held"
