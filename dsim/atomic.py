"""Atomic writes: an output either exists complete or not at all.

A crash, a full disk or Ctrl-C in the middle of a write must never leave a
truncated Parquet file that a later step would read as complete. Everything
is written to a temporary sibling first and moved into place with
``os.replace``, which is atomic on POSIX within one file system.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from dsim import parquetio
from dsim.errors import OutputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; move it onto ``target`` on success."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would outlive the rename
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_parquet(table: pa.Table, target: str | Path) -> None:
    with atomic_path(target) as tmp:
        parquetio.write_table(table, tmp)


def write_text(text: str, target: str | Path) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(obj: Any, target: str | Path) -> None:
    write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", target)


@contextlib.contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Build a whole directory in a temporary sibling and swap it into place.

    Readers see either the old directory or the new one, never a mix: the old
    one is moved aside, the new one renamed in, and only then the old removed.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        tmp.chmod(0o777 & ~_umask())
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    try:
        yield tmp
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
