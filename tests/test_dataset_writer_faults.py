"""A full disk while the tidy dataset is written: one line naming the file, exit 4, and
nothing half-written (SPEC §7.4, §9).

A robustness check found `dsim run --force` on a nearly full disk ending in "internal
error: OSError ... No space left on device" (exit 1): the dataset writer let pyarrow's
error through unnamed. The disk is made full here by a writer that fails as pyarrow's
does (a real full file system needs root to mount).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from test_run_memory import IDENT, POLICY, _replay

from dsim.errors import EXIT_OUTPUT, OutputError
from dsim.model import dataset


def _fails_once(method):
    """``method`` failing as pyarrow's writes do on a full disk, the first time only (the
    writer's own finaliser closes it again)."""
    calls = []

    def full(*args, **kwargs):
        if not calls:
            calls.append(1)
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28]")
        return method(*args, **kwargs)

    return full


@pytest.mark.parametrize("step", ["write", "close"])
def test_a_full_disk_names_the_dataset_file_and_leaves_no_temporary(
    tmp_path: Path, step: str
) -> None:
    meta = dataset.metadata(IDENT["run"], "d", {"min__min": "k"})
    writer = dataset.DatasetWriter(tmp_path, "d", meta)
    gpus_writer = writer._writers[1]
    if step == "write":
        gpus_writer.write_table = _fails_once(gpus_writer.write_table)
    else:
        gpus_writer.close = _fails_once(gpus_writer.close)
    with pytest.raises(OutputError) as caught:
        writer.add_replay(IDENT, POLICY, _replay(100, 4))
        writer.commit()
    writer.abort()
    assert caught.value.exit_code == EXIT_OUTPUT
    message = str(caught.value)
    assert str(writer.paths[1]) in message and "No space left on device" in message
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no temporary, no file
