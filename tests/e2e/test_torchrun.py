"""`orchestrator torchrun` end to end, with a script written the torchrun way (tests/helpers/torchrun_seed.py),
as a user's shell runs both commands: against plain `torchrun` on the same script, through faults
a rank suffers (SIGKILL, SIGSTOP, a bug, the driver's SIGTERM), on two loopback nodes of two ranks
each (the session's shared cluster, tests/helpers/clusters.py), and elastic over a lost node. `ray job
submit` of the command is in test_ray_jobs.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml
from conftest import REPO, run_cli, scratch_in, wait_for
from node_faults import kill_node
from seed_runs import BUG_LINE, EPOCHS, SEED
from seed_runs import events as _events
from seed_runs import final as _final

from orchestrator.processes import is_alive

pytestmark = pytest.mark.slow

def _summary(storage, name: str) -> dict:
    with open(os.path.join(storage, name, "summary.json")) as f:
        return json.load(f)


def _strike_when(argv: list[str], work, seen_event, act, timeout: float,
                 env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the command line `argv` in the background (with `env` added to this environment);
    once rank 0's events show `seen_event` (a predicate on one event), call `act(process)`; its
    exit status and output."""
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", *argv], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **(env or {})})
    try:
        wait_for(lambda: os.path.exists(work / "events.jsonl") and any(
            seen_event(e) for e in _events(str(work))), timeout=240, interval=0.5)
        act(process)
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, output


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
def test_a_clean_run_is_bit_equal_to_plain_torchrun_with_rank_0_live_and_every_rank_logged(tmp_path, plain_torchrun):
    done = run_cli("torchrun", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name", "clean",
                   "--rdzv_backend", "c10d", "--rdzv_endpoint", "head:29500", SEED,
                   "--work_dir", "{run_dir}/work", "--epochs", EPOCHS, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _final(str(tmp_path / "clean" / "work")) == plain_torchrun
    # torchrun's rendezvous flags are taken and said to be Ray's business; rank 0's prints are live.
    assert "--rdzv_backend, --rdzv_endpoint ignored: Ray places the ranks" in done.stdout
    assert f"rank 0: epoch {int(EPOCHS) - 1} loss" in done.stdout and "rank 1: epoch" not in done.stdout
    for rank in (0, 1):
        with open(tmp_path / "clean" / "logs" / f"rank-{rank}.log") as f:
            assert f"rank {rank}: epoch {int(EPOCHS) - 1} loss" in f.read()
    summary = _summary(tmp_path, "clean")
    assert summary["status"] == "finished" and summary["restarts"] == 0 and summary["world_size"] == 2


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(500)
def test_a_sigkilled_then_a_sigstopped_rank_are_restarted_in_place_and_the_weights_stay_bit_equal(
        tmp_path, plain_torchrun):
    """A rank SIGKILLed in epoch 1, then one SIGSTOPped in epoch 2: both restart every rank in the same
    Ray Train worker (the children's parent), TORCHELASTIC_RESTART_COUNT 1 then 2, and the script
    resumes from its own checkpoint each time. The stopped rank's stack is in its log, and the driver
    names the line it was stuck on."""
    work, env_out = tmp_path / "faults" / "work", tmp_path / "seen"
    done = run_cli("torchrun", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name", "faults",
                   "--set", "failure.hang_timeout_s=8", SEED, "--work_dir", "{run_dir}/work", "--epochs", EPOCHS,
                   "--fault", "kill,stop", "--step_sleep", "0.02", "--env_out", str(env_out), timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _final(str(work)) == plain_torchrun

    starts = [e for e in _events(str(work)) if e["kind"] == "first_step"]
    assert [e["restart"] for e in starts] == [0, 1, 2]
    assert [e["epoch"] for e in starts] == [0, 1, 2]  # each restart resumed from the script's own checkpoint
    parents = {json.load(open(env_out / name))["parent_pid"] for name in os.listdir(env_out)}
    assert len(parents) == 1, "the ranks were restarted in place, under the same supervising worker"

    assert "rank 1 failed (infrastructure): the process was killed by SIGKILL" in done.stdout
    assert "TORCHELASTIC_RESTART_COUNT=1" in done.stdout and "TORCHELASTIC_RESTART_COUNT=2" in done.stdout
    assert "rank 1 (node" in done.stdout and "stopped answering for more than 8 s (failure.hang_timeout_s)" in done.stdout
    assert "rank 1 was at torchrun_seed.py:" in done.stdout and " in hurt_once" in done.stdout
    with open(tmp_path / "faults" / "logs" / "rank-1.log") as f:
        log = f.read()
    assert "most recent call first" in log and "in hurt_once" in log
    # From the stop to the restarted ranks' first step: the hang timeout plus the restart.
    with open(work / "fault-stop.done") as f:
        stopped_at = float(f.read())
    assert starts[2]["time"] - stopped_at < 8 + 30
    summary = _summary(tmp_path, "faults")
    assert summary["status"] == "finished" and summary["restarts"] == 2


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
def test_a_bug_in_a_module_run_with_m_fails_on_its_first_attempt_naming_the_line_and_the_log(tmp_path):
    done = run_cli("torchrun", "--nproc-per-node", "2", "--storage", str(tmp_path), "--name", "bug",
                   "-m", "tests.helpers.torchrun_seed", "--work_dir", "{run_dir}/work", "--fault", "bug", timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    error = errors[0]
    assert "failed on its first attempt: rank 1: ValueError: bad batch at epoch 1 step 3" in error, error
    assert f"torchrun_seed.py:{BUG_LINE} in hurt_once" in error, error
    assert str(tmp_path / "bug" / "logs" / "rank-1.log") in error and "not retried" in error
    # The peer's "connection closed" is the bug's consequence: one start, no restart.
    assert [e["restart"] for e in _events(str(tmp_path / "bug" / "work")) if e["kind"] == "start"] == [0]
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "said"), [
    (None, "1 node(s) x 64 rank(s) cannot run on this machine in local mode"),
    ("--ray", "1 node(s) x 64 rank(s) cannot run on the local cluster")])
def test_more_ranks_than_the_local_cluster_can_ever_hold_is_bad_input(tmp_path, mode, said):
    done = run_cli("torchrun", "--nproc_per_node", "64", "--storage", str(tmp_path), *([mode] if mode else []), SEED,
                   "--work_dir", "w", timeout=100)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and said in errors[0], done.stderr
    assert "{CPU: 64}" in errors[0] and "Fix:" in errors[0] and "Traceback" not in done.stderr


# --- two loopback nodes --------------------------------------------------------------------------


# The shared cluster's nodes have 1 CPU: each node's worker holds its two ranks with it, as a node
# of K GPUs holds K ranks.
ONE_CPU = "scaling.resources_per_worker={CPU: 1}"


@pytest.mark.timeout(500)
def test_two_nodes_of_two_ranks_get_every_variable_torchrun_gives_and_an_elastic_run_finishes_on_one_after_the_other_is_lost(
        three_nodes, tmp_path, run_temp_dir):
    """--nnodes 1:2 on two nodes of two ranks each: every rank gets every variable torchrun gives.
    Then one node is killed in epoch 1 (its raylet and workers SIGKILLed; its ranks die with their
    worker); Ray Train restarts the group on the node left, WORLD_SIZE 2, restart count 1, and
    the script resumes from its checkpoint. (The fixture puts the nodes back.)"""
    two_nodes = three_nodes
    two_nodes.remove_node(next(iter(two_nodes.worker_nodes)))  # two nodes: none to grow back onto
    work, env_out = tmp_path / "elastic" / "work", tmp_path / "seen"
    argv = ["torchrun", "--nnodes", "1:2", "--nproc_per_node", "2", "--max_restarts", "4", "--storage", str(tmp_path),
            "--name", "elastic", "--address", two_nodes.address, "--set", ONE_CPU, "--env", "SEED_FROM_FLAG=1",
            "--env", f"TMPDIR={run_temp_dir}",
            SEED, "--work_dir", "{run_dir}/work", "--epochs", "3", "--step_sleep", "0.25", "--env_out", str(env_out)]
    victim = next(n for n in two_nodes.worker_nodes if n is not two_nodes.head_node)
    code, output = _strike_when(argv, work, lambda e: e["kind"] == "epoch_end" and e["epoch"] == 0,
                                lambda process: kill_node(two_nodes, victim), timeout=400,
                                env={"NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "3"})
    assert code == 0, output[-4000:]

    # The first round's four ranks, on two nodes.
    seen = {}
    for name in os.listdir(env_out):
        if name.endswith("-restart-0.json"):
            with open(env_out / name) as f:
                entry = json.load(f)
            seen[int(entry["RANK"])] = entry
    assert sorted(seen) == [0, 1, 2, 3]
    ports = {e["MASTER_PORT"] for e in seen.values()}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, e in seen.items():
        assert (e["LOCAL_RANK"], e["GROUP_RANK"], e["ROLE_RANK"]) == (str(rank % 2), str(rank // 2), str(rank))
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["ROLE_WORLD_SIZE"]) == ("4", "2", "2",
                                                                                                       "4")
        assert e["ROLE_NAME"] == "default" and e["MASTER_ADDR"] == "127.0.0.1"
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"], e["TORCHELASTIC_RUN_ID"]) == (
            "0", "4", "elastic")
        # The user's shell's own OMP_NUM_THREADS wins over torchrun's 1, as under torchrun.
        assert e["OMP_NUM_THREADS"] == "3"
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank % 2}/error.json")
        assert e["ORCHESTRATOR_RUN_DIR"] == str(tmp_path / "elastic")
        assert e["extra"] == {"NCCL_DEBUG": "WARN", "GLOO_SOCKET_IFNAME": "lo", "SEED_FROM_FLAG": "1"}
    # A node's ranks share their supervising worker; the two nodes' are different workers.
    parents = [seen[r]["parent_pid"] for r in range(4)]
    assert parents[0] == parents[1] and parents[2] == parents[3] and parents[0] != parents[2]

    # After the loss: two ranks on the node left.
    starts = [e for e in _events(str(work)) if e["kind"] == "start"]
    assert starts[0]["world_size"] == 4 and starts[-1]["world_size"] == 2, starts
    assert starts[-1]["restart"] >= 1
    assert _final(str(work))["world_size"] == 2 and _final(str(work))["epochs"] == 3
    assert _summary(tmp_path, "elastic")["status"] == "finished"
    # The killed node's supervisor could not remove its scratch folder; the restarted one did.
    assert not scratch_in(run_temp_dir)


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(300)
def test_a_spec_with_a_script_section_stopped_by_sigterm_on_ray_passes_it_to_every_rank_exits_143_and_ends_its_worker(
        tmp_path, _warm_record):
    """The second way in, `orchestrator run SPEC.yaml` with a script: section, on Ray (the warm
    cluster), and the driver's SIGTERM: every rank gets it, as under torchrun, the command exits
    143, and the Ray Train worker that supervised the ranks ends with the run. That worker is
    found by Ray's state API (the dashboard's actors, by their own pid) while the ranks step,
    and is their parent; once the command returned, its process is gone and Ray lists it dead."""
    work, seen = tmp_path / "stop" / "work", tmp_path / "seen"
    spec = tmp_path / "stop.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "stop", "storage": str(tmp_path),
        "script": {"path": SEED, "nproc_per_node": 2,
                   "args": ["--work_dir", "{run_dir}/work", "--step_sleep", "0.3", "--env_out", str(seen)]},
        "scaling": {"num_workers": 1}}))
    record = json.load(open(_warm_record))
    found = {}

    def while_the_ranks_step(process):
        found["job"] = job = wait_for(lambda: _job_of_driver(record, process.pid), timeout=60)
        found["workers"] = wait_for(lambda: _train_workers(record, "ALIVE", job), timeout=60)
        found["alive"] = [w["pid"] for w in found["workers"].values() if is_alive(w["pid"])]
        # The controller's actors of this job: Ray Train's default callbacks would start a Ray Data
        # DatasetManager at every group start, which a run with no Ray datasets never uses.
        found["actors"] = {actor["class_name"] for actor in _actors(record, job)}
        process.send_signal(signal.SIGTERM)

    code, output = _strike_when(["run", str(spec)], work, lambda e: e["kind"] == "first_step", while_the_ranks_step,
                                timeout=60)
    assert code == 143, output[-3000:]
    assert output.startswith("on Ray"), output[:500]
    assert "2 ranks up (1 node(s) x 2)" in output
    assert "run 'stop' stopped by SIGTERM: every rank was sent SIGTERM" in output, output[-3000:]
    ranks = [json.load(open(seen / name)) for name in os.listdir(seen)]
    assert sorted(r["RANK"] for r in ranks) == ["0", "1"]
    assert not os.path.exists(work / "final.json")  # stopped part-way, not run to the end
    # The supervising worker, as Ray knows it: the one Ray Train worker of this one-node run, and
    # the ranks' parent (so the pid that is gone below is the worker's, alive while they stepped).
    job, workers = found["job"], found["workers"]
    assert len(workers) == 1, workers
    (actor_id, worker), = workers.items()
    assert found["alive"] == [worker["pid"]] and {r["parent_pid"] for r in ranks} == {worker["pid"]}, (ranks, found)
    assert {"TrainController", "RayTrainWorker"} <= found["actors"] and "DatasetManager" not in found["actors"], found
    # No rank and no supervising worker is left once the command returned: its process ends (an
    # exited process that waits for its reaper, a zombie, has ended: CI's init may reap late)
    # and Ray says its actor is dead, within the moments Ray takes to end a finished job's workers.
    wait_for(lambda: not is_alive(worker["pid"]), timeout=30)
    assert wait_for(lambda: _train_workers(record, "DEAD", job).get(actor_id), timeout=30) == worker


def _dashboard(record: dict, path: str):
    """The warm cluster's dashboard's JSON answer at `path`, asked with the cluster's token."""
    request = urllib.request.Request(record["dashboard"] + path, headers={"Authorization": f"Bearer {record['token']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def _actors(record: dict, job: str) -> list[dict]:
    """Every actor of `job`, alive or dead, as Ray's state API lists them."""
    actors = _dashboard(record, "/api/v0/actors?limit=10000")
    return [actor for actor in actors["data"]["result"]["result"] if actor["job_id"] == job]


def _job_of_driver(record: dict, pid: int) -> str | None:
    """The Ray job whose driver is the process `pid` (Ray's Jobs API), once Ray lists it."""
    return next((job["job_id"] for job in _dashboard(record, "/api/jobs/")
                 if str((job.get("driver_info") or {}).get("pid")) == str(pid)), None)


def _train_workers(record: dict, state: str, job: str) -> dict[str, dict]:
    """The Ray Train workers of `job` in `state` (ALIVE, DEAD), by actor id, as Ray's state API
    lists them: each one's pid."""
    return {actor["actor_id"]: {"pid": actor["pid"]} for actor in _actors(record, job)
            if actor["class_name"] == "RayTrainWorker" and actor["state"] == state}
