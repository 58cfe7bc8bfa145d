"""Ctrl-C in local mode (docs/failures.md, "Stopping a run"): the terminal sends SIGINT to the
command's process group; the run takes a stop checkpoint, exits 130, and the same command resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO, wait_for

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

HELPERS = os.path.join(REPO, "tests", "helpers")


@pytest.mark.timeout(300)
def test_ctrl_c_in_local_mode_commits_a_stop_checkpoint_exits_130_and_the_same_command_resumes(tmp_path):
    marker = tmp_path / "stepping"
    spec = {"name": "ctrl-c", "storage": str(tmp_path), "seed": 0,
            "torch": {"train_loop": "python_api_jobs:stepping_loop", "max_epochs": 1,
                      "config": {"steps": 40, "sleep_s": 0.05, "marker": str(marker), "mark_at": 3}},
            "scaling": {"num_workers": 1}, "checkpoint": {"every_n_steps": 1000}}
    (tmp_path / "job.yaml").write_text(json.dumps(spec))
    command = [sys.executable, "-m", "orchestrator", "run", str(tmp_path / "job.yaml"), "--local"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HELPERS, os.environ.get("PYTHONPATH", REPO)]))}
    # A process group of its own, as a shell's foreground job: Ctrl-C goes to the whole group.
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        wait_for(marker.exists, timeout=200, interval=0.1)
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    first = next(line for line in output.splitlines() if not line.startswith("run name: "))
    assert first.startswith("local mode:"), output[-3000:]
    assert process.returncode == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    store = CheckpointStore(storage.resolve(str(tmp_path / "ctrl-c")))
    stop = store.committed()[-1]
    assert stop.manifest.reason == "stop" and 3 <= stop.step < 40, [(i.step, i.manifest.reason)
                                                                    for i in store.committed()]

    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    summary = json.loads((tmp_path / "ctrl-c" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_from"]["uri"] == stop.uri, summary.get("resumed_from")
    # The loop steps 40 times from wherever it starts: the resumed run went on from the stop step.
    assert summary["global_step"] == stop.step + 40, (summary["global_step"], stop.step)
