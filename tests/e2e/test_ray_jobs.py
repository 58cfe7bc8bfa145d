"""`ray job submit` / `ray job stop` against a real head node with token authentication.

The head is started with `ray start --head` on loopback, its own temp directory and a token, as
users run it (docs/cluster.md), with Ray's default `ray job stop` wait; the client side
uses RAY_AUTH_MODE=token and RAY_AUTH_TOKEN. A job stopped with `ray job stop` reports itself
stopped, and the same job submitted again resumes from the newest committed checkpoint and ends
with the clean run's weights. A job whose storage is a relative path is refused before it trains.
`orchestrator torchrun` submitted as a job runs its script's ranks.
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
import ray_logs
import yaml
from conftest import REPO, free_port, wait_for
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.processes import is_alive, session_pids

pytestmark = pytest.mark.slow

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    """A one-node Ray cluster with the dashboard and Jobs API on loopback; yields (address, env,
    its session folder).
    One head serves the module: a job leaves nothing on it that the next one would see (each has
    its own submission id and storage)."""
    # Short: Ray's socket paths live under it and must stay under the OS limit of 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="rj-", dir="/tmp")
    dashboard_port = free_port()
    env = {
        **os.environ,
        "PATH": BIN + os.pathsep + os.environ.get("PATH", ""),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        # What conftest's _isolated_state gives each test, for the head the module's tests share:
        # the jobs' drivers get their environment from it.
        "ORCHESTRATOR_STATE_DIR": str(tmp_path_factory.mktemp("state")),
        "ORCHESTRATOR_DATA_DIR": os.environ.get("ORCHESTRATOR_TEST_DATA_DIR", str(tmp_path_factory.mktemp("data"))),
    }
    # As users start a head: Ray's own `ray job stop` wait (3 s); a job sets its own below.
    env.pop("RAY_JOB_STOP_WAIT_TIME_S", None)
    session_dir = os.path.join(temp_dir, "session_latest")
    try:
        started = subprocess.run(
            [os.path.join(BIN, "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", "--num-cpus=2",
             # Its own port for the job agent: on Ray's default (52365) it fails to bind wherever
             # another Ray cluster on this machine holds it, and no job could be submitted.
             f"--dashboard-agent-listen-port={free_port()}",
             f"--temp-dir={temp_dir}", "--disable-usage-stats"],
            env=env, capture_output=True, text=True, timeout=180, cwd=REPO,
        )
        session_dir = os.path.realpath(session_dir)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield f"http://127.0.0.1:{dashboard_port}", env, session_dir
    finally:
        # Also after a failed start: the processes it did start are ended, by their own ids.
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


def _submit(env, address, spec_path, **env_vars: str) -> str:
    job_id = f"orchestrator-{secrets.token_hex(4)}"
    # The working directory travels with the job; tests/ holds the slowed-down loop.
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": os.path.join(REPO, "tests", "helpers"), **env_vars}})
    args = ("submit", "--no-wait", "--submission-id", job_id, "--working-dir", REPO, "--runtime-env-json",
            runtime_env, "--", "orchestrator", "run", str(spec_path))
    submitted = _ray_job(env, address, *args)
    # Right after `ray start` the head's job agent may not be up yet; Ray says to try again.
    deadline = time.monotonic() + 180
    while "No available agent to submit job" in submitted.stderr and time.monotonic() < deadline:
        time.sleep(2)
        submitted = _ray_job(env, address, *args)
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


def _wait_ended(env, address, job_id, session_dir, timeout: float) -> str:
    """Wait for the job to end; its status. A job still going after `timeout` fails the test with
    its output and what the head's Ray logs say (the job's own output is silent on a worker that
    never came)."""
    def ended() -> str | None:
        status = _status(env, address, job_id)
        return status if status in ("SUCCEEDED", "FAILED", "STOPPED") else None

    try:
        return wait_for(ended, timeout=timeout, interval=1)
    except TimeoutError:
        logs = _ray_job(env, address, "logs", job_id)
        raise AssertionError(f"job {job_id} still {_status(env, address, job_id)} after {timeout} s:\n"
                             f"{logs.stdout[-3000:]}{logs.stderr[-2000:]}\n{ray_logs.story(session_dir)}") from None


# The bounds of this module's waits hold a loaded machine: beside three other tests' Ray clusters
# on two cores, a job here took four times as long as alone (62 s alone, 243 s beside them), and
# this one's first job took 5 minutes to reach step 22 beside the multi-node tests (480 s was
# too short on CI).
JOB_WAIT_S = 900


@pytest.mark.timeout(2400)
def test_a_job_stopped_with_ray_job_stop_resumes_when_submitted_again(head_node, tmp_path, clean_torch):
    address, env, session_dir = head_node
    spec_path = tmp_path / "job.yaml"
    # Rank 0 holds at step 22, two checkpoints in, until the stop reaches it (at most 45 s, within
    # the 60 s hang timeout): the stop lands mid-run however long the `ray` commands take on a
    # loaded machine (a fixed 10 s hold was not enough on CI: the run had ended its last epoch
    # when the stop came), and the stop checkpoint comes at once, well within the job's 20 s grace.
    marker = tmp_path / "at-step-22"
    spec = torch_spec("ray-job", tmp_path, loop="faulty:slow_loop", sleep_s=0.2, mark_at=22, marker=str(marker),
                      hold_s=45.0)
    spec_path.write_text(yaml.safe_dump(spec))
    store = CheckpointStore(storage.resolve(str(tmp_path / "ray-job")))

    # The job gives its driver 20 s between SIGTERM and SIGKILL, as the driver's note at start
    # tells users to: Ray's job supervisor and the driver both take it from the job's runtime_env.
    first = _submit(env, address, spec_path, RAY_JOB_STOP_WAIT_TIME_S="20")
    try:
        wait_for(lambda: (marker.exists() and len(store.committed()) >= 2)
                 or _status(env, address, first) in ("FAILED", "SUCCEEDED"), timeout=JOB_WAIT_S, interval=0.5)
    except TimeoutError:
        pass  # said below, with the job's output and what the head's Ray logs say
    status, logs = _status(env, address, first), _ray_job(env, address, "logs", first)
    assert status == "RUNNING" and marker.exists() and len(store.committed()) >= 2, (
        f"{status}, at step 22: {marker.exists()}, {len(store.committed())} checkpoint(s) after {JOB_WAIT_S} s:\n"
        f"{logs.stdout[-3000:]}{logs.stderr[-3000:]}\n{ray_logs.story(session_dir)}")
    stopped = _ray_job(env, address, "stop", first)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_for(lambda: _status(env, address, first) == "STOPPED", timeout=60, interval=1)
    logs = _ray_job(env, address, "logs", first).stdout
    assert "stopped by SIGTERM" in logs, logs[-3000:]
    # All of the job's 20 s but the driver's measured need (signals.JOB_STOP_MARGIN_S) go to the
    # workers' last checkpoint, and a wait that long needs no note at start.
    grace = re.search(r"stop requested: .*\(grace ([\d.]+) s", logs)
    assert grace and float(grace.group(1)) >= 19, logs[-3000:]
    assert "RAY_JOB_STOP_WAIT_TIME_S" not in logs, logs[-3000:]
    summary = json.loads((tmp_path / "ray-job" / "summary.json").read_text())
    assert summary["status"] == "stopped"
    # The workers took a last checkpoint after the stop request, and it is the newest committed one.
    stop_checkpoints = [i for i in store.committed() if i.manifest.reason == "stop"]
    assert len(stop_checkpoints) == 1, [(i.step, i.manifest.reason) for i in store.committed()]
    assert summary["final_checkpoint"] == stop_checkpoints[0].uri == store.committed()[-1].uri

    spec["torch"]["train_loop"] = "jobs.digits_torch:train_loop"  # the same training, without the sleeps
    spec_path.write_text(yaml.safe_dump(spec))
    second = _submit(env, address, spec_path)
    ended = _wait_ended(env, address, second, session_dir, timeout=JOB_WAIT_S)
    logs = _ray_job(env, address, "logs", second).stdout
    assert ended == "SUCCEEDED", logs[-3000:]
    assert "resuming from step" in logs
    # Submitted with Ray's default wait: the driver says once what that leaves and how to give more.
    notes = [line for line in logs.splitlines() if line.startswith("note: `ray job stop`")]
    assert len(notes) == 1, logs[-3000:]
    assert "kills this driver 3 s after its SIGTERM" in notes[0] and "the workers get 2.5 s" in notes[0]
    assert '"RAY_JOB_STOP_WAIT_TIME_S": "60"' in notes[0]
    summary = json.loads((tmp_path / "ray-job" / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["resumed_from"]["step"] == stop_checkpoints[0].step
    assert summary["weights_sha256"] == clean_torch.weights_sha256



@pytest.mark.timeout(480)
def test_a_relative_storage_is_refused_under_ray_job_submit(head_node, tmp_path):
    """The driver of a Ray job runs in a copy of its working_dir that Ray unpacks under a name
    derived from the files: a relative storage path there would start the run afresh after
    every edit. The job fails at once (exit 2) with one paragraph naming the value, where it
    would have landed and the fix."""
    address, env, session_dir = head_node
    spec_path = tmp_path / "job.yaml"
    spec = torch_spec("relative", "runs/here")
    spec_path.write_text(yaml.safe_dump(spec))
    job = _submit(env, address, spec_path)
    ended = _wait_ended(env, address, job, session_dir, timeout=360)
    status = _ray_job(env, address, "status", job)
    logs = _ray_job(env, address, "logs", job).stdout
    assert ended == "FAILED", logs[-3000:]
    assert "exit code 2" in status.stdout + status.stderr, status.stdout + status.stderr
    errors = [line for line in logs.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, logs[-3000:]
    error = errors[0]
    assert "storage 'runs/here' is a relative path, and this driver runs as a Ray job" in error, error
    # Where it would have gone: inside the job's unpacked working_dir (Ray names it _ray_pkg_<hash>).
    landed = re.search(r"it would resolve to (\S+),", error)
    assert landed and "/_ray_pkg_" in landed.group(1) and landed.group(1).endswith("/runs/here"), error
    assert "silently start fresh" in error and "Fix:" in error and "~/" in error and "s3://" in error
    assert "Traceback" not in logs


@pytest.mark.timeout(720)
def test_a_torchrun_command_submitted_as_a_ray_job_trains_its_ranks_and_succeeds(head_node, tmp_path):
    """`ray job submit -- orchestrator torchrun ...`: the script travels in the job's working_dir
    and runs unchanged as 2 ranks under the head's one worker; the job succeeds."""
    address, env, session_dir = head_node
    job_id = f"torchrun-{secrets.token_hex(4)}"
    args = ("submit", "--no-wait", "--submission-id", job_id, "--working-dir", REPO, "--",
            "orchestrator", "torchrun", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name", "rj",
            os.path.join("tests", "helpers", "torchrun_seed.py"), "--work_dir", "{run_dir}/work", "--epochs", "2")
    submitted = _ray_job(env, address, *args)
    deadline = time.monotonic() + 180  # the head's job agent may not be up yet; Ray says to try again
    while "No available agent to submit job" in submitted.stderr and time.monotonic() < deadline:
        time.sleep(2)
        submitted = _ray_job(env, address, *args)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    ended = _wait_ended(env, address, job_id, session_dir, timeout=540)
    logs = _ray_job(env, address, "logs", job_id).stdout
    assert ended == "SUCCEEDED", logs[-4000:]
    assert "2 ranks up (1 node(s) x 2)" in logs and "rank 0: epoch 1 loss" in logs, logs[-4000:]
    with open(tmp_path / "rj" / "work" / "final.json") as f:
        assert json.load(f)["world_size"] == 2
    assert os.path.exists(tmp_path / "rj" / "logs" / "rank-1.log")
