"""A preemption past `failure.max_preemptions` (docs/checkpoints.md, "Preemption"): the node's
drain still brings the checkpoint on the notice, and at the deadline the run fails, exit 1, with one
paragraph that names the budget and how to go on, and keeps that checkpoint to resume from.

On the session's shared loopback cluster (tests/helpers/clusters.py), drained as Ray's autoscaler
drains a spot node (the idiom of tests/e2e/test_node_loss.py); the drained node is then killed by
its own process ids and a fresh one added back for the next test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from cli_runs import failure_of
from conftest import REPO, wait_for
from node_faults import drain_for_preemption, kill_node, training_worker_pids
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

# Seconds between the preemption notice and the node's end (clouds give 30 s to 2 min).
PREEMPTION_DEADLINE_S = 10


@pytest.mark.timeout(600)
def test_a_preemption_past_max_preemptions_fails_the_run_naming_the_budget_and_keeps_the_notice_checkpoint(
        three_nodes, tmp_path, monkeypatch):
    cluster = three_nodes
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")  # Ray's default: 5 s
    marker = tmp_path / "training"
    # Slow enough (63 steps x 0.3 s) that the run outlives the preemption deadline.
    spec = torch_spec("preempted", tmp_path, loop="faulty:slow_loop", sleep_s=0.3, marker=str(marker), mark_at=5)
    spec["checkpoint"] = {"every_n_steps": None, "at_epoch_end": False}
    # Failures are allowed, preemptions are not: the preemption's restart is refused by its own budget.
    spec["failure"] = {"max_failures": 2, "max_preemptions": 0}
    path = tmp_path / "preempted.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "tests", "helpers")}
    command = [sys.executable, "-m", "orchestrator", "run", str(path), "--address", cluster.address]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    doomed = None
    try:
        wait_for(lambda: marker.exists() or run.poll() is not None, timeout=240)
        assert run.poll() is None, run.communicate()
        doomed = next(n for n in cluster.worker_nodes if training_worker_pids(n))
        drain_for_preemption(cluster, doomed, deadline_s=PREEMPTION_DEADLINE_S)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if doomed is not None:
            kill_node(cluster, doomed)  # drained, it goes: the shared cluster gets a fresh node back

    done = subprocess.CompletedProcess(command, run.returncode, stdout, stderr)
    assert f"preemption notice: node(s) {doomed.node_id[:12]}" in stdout, stdout[-3000:]
    error = failure_of(done)  # exit 1, one paragraph, no traceback
    assert "preempted" in error and "failure.max_preemptions (0)" in error and "run the same command again" in error, \
        error
    summary = yaml.safe_load((tmp_path / "preempted" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["restarts"] == 0, summary
    # The checkpoint taken on the notice is committed and whole: the same command resumes from it.
    store = CheckpointStore(storage.resolve(str(tmp_path / "preempted")))
    taken = [i for i in store.committed() if i.manifest.reason == "preemption"]
    assert len(taken) == 1 and store.verify(taken[0]).status == "committed", [(i.step, i.status) for i in store.scan()]
    assert taken[0].step > 5
