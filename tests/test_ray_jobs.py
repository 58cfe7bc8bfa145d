"""`ray job submit` / `ray job stop` against a real head node with token authentication.

The head is started with `ray start --head` on loopback, its own temp directory and a token, as
users run it (README, "On a cluster"); the client side uses RAY_AUTH_MODE=token and
RAY_AUTH_TOKEN. A job stopped with `ray job stop` reports itself stopped, and the same job
submitted again resumes from the newest committed checkpoint and ends with the clean run's weights.
The head's processes are ended by their own process ids at the end.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import yaml
from conftest import REPO, free_port, wait_for
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.cluster import is_alive, session_pids

pytestmark = pytest.mark.slow

BIN = os.path.dirname(sys.executable)


@pytest.fixture
def head_node():
    """A one-node Ray cluster with the dashboard and Jobs API on loopback; yields (address, env)."""
    # Short: Ray's socket paths live under it and must stay under the OS limit of 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="rj-", dir="/tmp")
    dashboard_port = free_port()
    env = {
        **os.environ,
        "PATH": BIN + os.pathsep + os.environ.get("PATH", ""),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        # Time the stopped driver gets between SIGTERM and SIGKILL (Ray's default: 3 s).
        "RAY_JOB_STOP_WAIT_TIME_S": "30",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    subprocess.run(
        [os.path.join(BIN, "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", "--num-cpus=2",
         f"--temp-dir={temp_dir}", "--disable-usage-stats"],
        env=env, check=True, capture_output=True, timeout=180,
    )
    session_dir = os.path.realpath(os.path.join(temp_dir, "session_latest"))
    try:
        yield f"http://127.0.0.1:{dashboard_port}", env
    finally:
        _end_processes(session_pids(session_dir))
        wait_for(lambda: not session_pids(session_dir), timeout=30)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _end_processes(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ray_job(env, address, command, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, "ray"), "job", command, "--address", address, *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _submit(env, address, spec_path) -> str:
    job_id = f"orchestrator-{secrets.token_hex(4)}"
    # The working directory travels with the job; tests/ holds the slowed-down loop.
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": os.path.join(REPO, "tests")}})
    submitted = _ray_job(env, address, "submit", "--no-wait", "--submission-id", job_id, "--working-dir", REPO,
                         "--runtime-env-json", runtime_env, "--", "orchestrator", "run", str(spec_path))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return job_id


def _status(env, address, job_id) -> str:
    answer = _ray_job(env, address, "status", job_id)
    text = answer.stdout + answer.stderr
    # Ray prints terminal states as sentences and the others as "Status for job '<id>': <STATUS>".
    for sentence, status in (("' succeeded", "SUCCEEDED"), ("' failed", "FAILED"), ("' was stopped", "STOPPED")):
        if sentence in text:
            return status
    found = re.search(r"Status for job '[^']+': (\w+)", text)
    return found.group(1) if found else "UNKNOWN"


@pytest.mark.timeout(600)
def test_a_job_stopped_with_ray_job_stop_resumes_when_submitted_again(head_node, tmp_path, clean_torch):
    address, env = head_node
    spec_path = tmp_path / "job.yaml"
    spec = torch_spec("ray-job", tmp_path, loop="faulty:slow_loop", sleep_s=0.2)
    spec_path.write_text(yaml.safe_dump(spec))
    store = CheckpointStore(storage.resolve(str(tmp_path / "ray-job")))

    first = _submit(env, address, spec_path)
    try:
        wait_for(lambda: len(store.committed()) >= 2 or _status(env, address, first) in ("FAILED", "SUCCEEDED"),
                 timeout=240, interval=1)
    finally:
        status, logs = _status(env, address, first), _ray_job(env, address, "logs", first)
    assert status == "RUNNING", f"{status}: {logs.stdout[-3000:]}{logs.stderr[-3000:]}"
    stopped = _ray_job(env, address, "stop", first)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_for(lambda: _status(env, address, first) == "STOPPED", timeout=60, interval=1)
    logs = _ray_job(env, address, "logs", first).stdout
    assert "stopped by SIGTERM" in logs, logs[-3000:]
    summary = json.loads((tmp_path / "ray-job" / "summary.json").read_text())
    assert summary["status"] == "stopped"
    # The workers took a last checkpoint after the stop request, and it is the newest committed one.
    stop_checkpoints = [i for i in store.committed() if i.manifest.reason == "stop"]
    assert len(stop_checkpoints) == 1, [(i.step, i.manifest.reason) for i in store.committed()]
    assert summary["final_checkpoint"] == stop_checkpoints[0].uri == store.committed()[-1].uri

    spec["torch"]["train_loop"] = "jobs.digits_torch:train_loop"  # the same training, without the sleeps
    spec_path.write_text(yaml.safe_dump(spec))
    second = _submit(env, address, spec_path)
    wait_for(lambda: _status(env, address, second) in ("SUCCEEDED", "FAILED"), timeout=300, interval=1)
    logs = _ray_job(env, address, "logs", second).stdout
    assert _status(env, address, second) == "SUCCEEDED", logs[-3000:]
    assert "resuming from step" in logs
    summary = json.loads((tmp_path / "ray-job" / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["resumed_from"]["step"] == stop_checkpoints[0].step
    assert summary["weights_sha256"] == clean_torch.weights_sha256

