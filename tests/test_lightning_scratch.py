"""The Lightning path's scratch folders do not pile up in the temp dir when workers are killed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from orchestrator.runtime.lightning.fit import SCRATCH_PREFIX, _remove_scratch_of_dead_workers


def test_scratch_folders_of_dead_workers_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f"{SCRATCH_PREFIX}{dead_pid}-abc").mkdir()
    (tmp_path / f"{SCRATCH_PREFIX}{dead_pid}-abc" / "lightning.ckpt").write_bytes(b"x" * 10)
    (tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def").mkdir()
    (tmp_path / "someone-elses").mkdir()

    _remove_scratch_of_dead_workers()

    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{SCRATCH_PREFIX}{os.getpid()}-def", "someone-elses"]
