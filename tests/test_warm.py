"""`orchestrator up` / `orchestrator down`: a warm local cluster that `orchestrator run` joins,
says so, and that leaves nothing behind once it is down."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from conftest import run_cli

from orchestrator.cluster import session_pids

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_runs_join_the_warm_cluster_and_down_leaves_no_process_or_file_behind(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "warm", "storage": str(tmp_path / "runs"),
        "torch": {"train_loop": "bench.startup_job:train_loop", "max_steps": 1,
                  "config": {"first_step_file": str(tmp_path / "first-step")}},
        "scaling": {"num_workers": 2}}))
    env = {"PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    record_path = os.path.join(os.environ["ORCHESTRATOR_STATE_DIR"], "warm-cluster.json")
    started = run_cli("up", env=env, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "warm local cluster up at 127.0.0.1:" in started.stdout
        assert oct(os.stat(record_path).st_mode & 0o777) == "0o600"  # it holds the cluster's token
        record = json.load(open(record_path))
        assert session_pids(record["session_dir"])
        assert "already up" in run_cli("up", env=env, timeout=60).stdout

        for attempt in range(2):  # the cluster outlives a run
            ran = run_cli("run", str(spec), "--set", f"name=warm-{attempt}", env=env, timeout=240)
            assert ran.returncode == 0, ran.stdout + ran.stderr
            assert f"using the warm local cluster at {record['address']}" in ran.stdout
            assert "finished" in ran.stdout
            assert session_pids(record["session_dir"])
    finally:
        stopped = run_cli("down", env=env, timeout=120)
    assert stopped.returncode == 0 and "stopped; its processes and files are gone" in stopped.stdout
    assert not session_pids(record["session_dir"])
    assert not os.path.exists(record["temp_dir"]) and not os.path.exists(record_path)
    assert "no warm local cluster is up" in run_cli("down", env=env, timeout=60).stdout
