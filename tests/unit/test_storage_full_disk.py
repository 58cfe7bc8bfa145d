"""`storage.write_atomic` on a full disk (a real 3 MB tmpfs): the write fails with ENOSPC naming the
file, the old content stays, and no temporary file of the failed write is left to hold the space."""

from __future__ import annotations

import errno
import os

import pytest

from orchestrator import storage


@pytest.mark.timeout(60)
def test_a_write_that_does_not_fit_raises_naming_the_file_and_leaves_the_old_content_and_no_temporary_file(
        small_filesystem):
    target = small_filesystem / "run" / "summary.json"
    loc = storage.resolve(str(target))
    storage.write_atomic(loc, b"old")  # the control: a write that fits lands whole

    with pytest.raises(OSError) as failed:
        storage.write_atomic(loc, b"x" * (4 * 1024 * 1024))  # more than the whole filesystem holds

    assert sorted(os.listdir(target.parent)) == ["summary.json"]
    assert target.read_bytes() == b"old"
    assert failed.value.errno == errno.ENOSPC
    assert str(target) in str(failed.value), str(failed.value)
    # The space is free again: a write of most of it fits now.
    storage.write_atomic(loc, b"y" * (2 * 1024 * 1024))
    assert target.stat().st_size == 2 * 1024 * 1024
