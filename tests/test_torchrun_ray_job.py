"""`ray job submit -- orchestrator torchrun ...` on a head with token authentication (test_ray_jobs.py's
head): the script travels in the job's working_dir, runs as 2 ranks, and the job succeeds."""

from __future__ import annotations

import json
import os
import secrets
import time

import pytest
from conftest import REPO, wait_for
from test_ray_jobs import _ray_job, _status, head_node  # noqa: F401 - head_node is a fixture

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_a_torchrun_command_submitted_as_a_ray_job_trains_its_ranks_and_succeeds(head_node, tmp_path):  # noqa: F811
    address, env = head_node
    job_id = f"torchrun-{secrets.token_hex(4)}"
    args = ("submit", "--no-wait", "--submission-id", job_id, "--working-dir", REPO, "--",
            "orchestrator", "torchrun", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name", "rj",
            os.path.join("tests", "torchrun_seed.py"), "--work_dir", "{run_dir}/work", "--epochs", "2")
    submitted = _ray_job(env, address, *args)
    # Right after `ray start` the head's job agent may not be up yet; Ray says to try again.
    deadline = time.monotonic() + 180
    while "No available agent to submit job" in submitted.stderr and time.monotonic() < deadline:
        time.sleep(2)
        submitted = _ray_job(env, address, *args)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    wait_for(lambda: _status(env, address, job_id) in ("SUCCEEDED", "FAILED", "STOPPED"), timeout=300, interval=1)
    logs = _ray_job(env, address, "logs", job_id).stdout
    assert _status(env, address, job_id) == "SUCCEEDED", logs[-4000:]
    assert "2 ranks up (1 node(s) x 2)" in logs and "rank 0: epoch 1 loss" in logs, logs[-4000:]
    with open(tmp_path / "rj" / "work" / "final.json") as f:
        assert json.load(f)["world_size"] == 2
    assert os.path.exists(tmp_path / "rj" / "logs" / "rank-1.log")

