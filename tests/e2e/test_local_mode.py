"""Local mode end to end (orchestrator/driver/local.py): a run of one node with no Ray, the agent
in the command's own process. On each path (a torchrun script, a ctx loop, a Lightning module):
finished bit-equal to the Ray path (the script's to plain torchrun), a SIGKILLed then a SIGSTOPped
rank restarted in place, a user's bug failing once and naming its line, SIGTERM ending with a
stop checkpoint (the script's ranks get the signal, as under torchrun); a second run of the same
name refused; nothing left behind; the mode said on the run's first line."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import urllib.request

import pytest
from cli_runs import failure_of, run_command, run_spec
from conftest import REPO, run_cli, scratch_in, wait_for
from run_processes import ProcessesOfRun
from seed_runs import BUG_LINE, EPOCHS, SEED, events, final
from specs import lightning_spec, torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 8
HELPERS = os.path.join(REPO, "tests", "helpers")


def _cpu_of_children() -> float:
    """CPU seconds of this process's ended children, and of every process they waited for."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _first_line(output: str) -> str:
    return next(line for line in output.splitlines() if not line.startswith("run name: "))


def _popen(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": HELPERS, **env})


def _faults(tmp_path, kill_at: int, stop_at: int) -> list[dict]:
    """Rank 1 SIGKILLed after step `kill_at`, then SIGSTOPped after step `stop_at`, once each."""
    return [{"at": kill_at, "rank": 1, "how": "kill", "marker": str(tmp_path / "killed")},
            {"at": stop_at, "rank": 1, "how": "stop", "marker": str(tmp_path / "stopped")}]


def _assert_restarted_in_place(result, starts_file) -> None:
    """Two failures (the kill, then the freeze caught as a hang), each restarting every rank in
    place, under the same parent (the agent, in the command's process)."""
    assert result.status == "finished" and result.restarts == 2, result.failures
    killed, frozen = result.failures
    assert any(r["rank"] == 1 and "SIGKILL" in r["error"] for r in killed["ranks"]), killed
    assert frozen["classification"] == "hang" and frozen["hang"]["what"] == "stopped answering", frozen
    with open(starts_file) as f:
        starts = [json.loads(line) for line in f]
    assert sorted({s["attempt"] for s in starts}) == [1, 2, 3]
    parents = {s["ppid"] for s in starts}
    assert len(parents) == 1, f"every start had the same parent, the agent: {starts}"


def _assert_survives_in_place_to_the_clean_weights(spec, tmp_path, starts, temp: str, clean) -> None:
    """`spec` (faults of `_faults`, its starts recorded in `starts`) run in local mode, its workers'
    temp files in `temp`: restarted in place twice, said so on its first line, ended with the Ray
    path's clean weights, and nothing of it left."""
    spec["failure"]["hang_timeout_s"] = HANG_TIMEOUT_S
    spec["env"] = {"TMPDIR": temp}
    lines: list[str] = []
    imports = tmp_path / "imports.jsonl"
    # The run's processes: what carries its workers' TMPDIR, or the command's own FAULTY_IMPORTS.
    with pytest.MonkeyPatch.context() as patch, ProcessesOfRun(TMPDIR=temp, FAULTY_IMPORTS=str(imports)) as watch:
        patch.setenv("FAULTY_IMPORTS", str(imports))  # (this command's own environment: faulty.py notes its imports)
        result = run_spec(spec, str(tmp_path), mode="local", lines=lines)
    assert lines[0].startswith("local mode:"), lines[:3]
    _assert_restarted_in_place(result, starts)
    # The first attempt's ranks were started before the command had imported the job's code (its
    # validation, in the agent's process): they imported torch and Lightning beside it, not after.
    with open(starts) as f:
        first = [json.loads(line) for line in f if json.loads(line)["attempt"] == 1]
    with open(imports) as f:
        by_command = [json.loads(line)["at"] for line in f if json.loads(line)["pid"] == first[0]["ppid"]]
    assert by_command and all(s["created"] < by_command[0] for s in first), (first, by_command)
    assert result.global_step == clean.global_step
    assert result.weights_sha256 == clean.weights_sha256
    with open(starts) as f:
        ranks = {json.loads(line)["pid"] for line in f}
    # The scan saw the ranks of every attempt (spares, the sweeper and the command beside them).
    assert ranks <= set(watch.seen), (ranks, watch.seen)
    _nothing_left(temp, watch)


def _nothing_left(temp: str, watch: ProcessesOfRun) -> None:
    """No scratch folder in the run's temp dir, and every process `watch` saw is gone."""
    assert not scratch_in(temp), os.listdir(temp)
    watch.assert_all_gone()


# --- a torchrun script ------------------------------------------------------------------------------


@pytest.mark.timeout(400)
def test_a_script_in_local_mode_survives_a_sigkill_and_a_sigstop_in_place_bit_equal_to_plain_torchrun(
        tmp_path, plain_torchrun, run_temp_dir):
    work, env_out = tmp_path / "faults" / "work", tmp_path / "seen"
    with ProcessesOfRun(TMPDIR=run_temp_dir) as watch:
        process = _popen("torchrun", "--local", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name",
                         "faults", "--set", f"failure.hang_timeout_s={HANG_TIMEOUT_S}", SEED, "--work_dir",
                         "{run_dir}/work", "--epochs", EPOCHS, "--fault", "kill,stop", "--step_sleep", "0.02",
                         "--env_out", str(env_out), env={"TMPDIR": run_temp_dir})
        output, _ = process.communicate(timeout=360)
    assert process.returncode == 0, output[-3000:]
    assert _first_line(output).startswith("local mode: 2 rank(s) on this machine, no Ray (--local)"), output[:500]
    assert final(str(work)) == plain_torchrun
    starts = [e for e in events(str(work)) if e["kind"] == "first_step"]
    assert [e["restart"] for e in starts] == [0, 1, 2]
    seen = [json.load(open(env_out / name)) for name in os.listdir(env_out)]
    # The ranks' parent is the command itself: the agent runs in it, no Ray worker between.
    assert {s["parent_pid"] for s in seen} == {process.pid}
    assert "rank 1 failed (infrastructure): the process was killed by SIGKILL" in output
    assert f"stopped answering for more than {HANG_TIMEOUT_S} s" in output and "rank 1 was at torchrun_seed.py:" in output
    summary = json.loads((tmp_path / "faults" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["restarts"] == 2
    # The command and its ranks of three attempts (the frozen one among them) were seen alive.
    assert sum(pid != process.pid for pid in watch.seen) >= 2 * 3, watch.seen
    _nothing_left(run_temp_dir, watch)


@pytest.mark.timeout(300)
def test_a_bug_in_a_script_in_local_mode_fails_once_naming_its_line(tmp_path):
    done = run_cli("torchrun", "--local", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name", "bug",
                   SEED, "--work_dir", "{run_dir}/work", "--fault", "bug", timeout=240)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    error = failure_of(done)
    assert "failed on its first attempt: rank 1: ValueError: bad batch at epoch 1 step 3" in error, error
    assert f"torchrun_seed.py:{BUG_LINE} in hurt_once" in error and "not retried" in error, error
    assert [e["restart"] for e in events(str(tmp_path / "bug" / "work")) if e["kind"] == "start"] == [0]


@pytest.mark.timeout(400)
def test_a_script_is_local_by_default_and_a_sigterm_reaches_every_rank_then_the_next_run_resumes_bit_equal(
        tmp_path, plain_torchrun, run_temp_dir):
    work = tmp_path / "stop" / "work"
    args = ("torchrun", "--nproc_per_node", "2", "--storage", str(tmp_path), "--name", "stop", SEED,
            "--work_dir", "{run_dir}/work", "--epochs", EPOCHS)
    with ProcessesOfRun(TMPDIR=run_temp_dir) as watch:
        process = _popen(*args, "--step_sleep", "0.1", env={"TMPDIR": run_temp_dir})
        try:
            # Stopped once the script's own checkpoint of epoch 0 is written and epoch 1 is under way.
            wait_for(lambda: os.path.exists(work / "events.jsonl") and any(
                e["kind"] == "epoch_end" for e in events(str(work))), timeout=240, interval=0.3)
            watch.scan()
            training = set(watch.seen) - {process.pid}
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 143, output[-3000:]
    assert _first_line(output).startswith("local mode: one node, 2 rank(s) on this machine"), output[:500]
    assert "run 'stop' stopped by SIGTERM: every rank was sent SIGTERM" in output, output[-3000:]
    assert not os.path.exists(work / "final.json")
    assert len(training) >= 2, f"the two ranks were not seen while they trained: {watch.seen}"
    _nothing_left(run_temp_dir, watch)

    again = run_cli(*args, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert final(str(work)) == plain_torchrun
    assert [e["epoch"] for e in events(str(work)) if e["kind"] == "first_step"][-1] >= 1  # resumed, not restarted


# --- a ctx loop ----------------------------------------------------------------------------------


@pytest.mark.timeout(400)
def test_a_ctx_loop_in_local_mode_survives_a_sigkill_and_a_sigstop_in_place_bit_equal_to_the_ray_path(
        tmp_path, clean_torch, run_temp_dir):
    starts = tmp_path / "starts.jsonl"
    spec = torch_spec("faults", tmp_path, "faulty:torch_loop_three_faults", faults=_faults(tmp_path, 8, 30),
                      starts=str(starts))
    _assert_survives_in_place_to_the_clean_weights(spec, tmp_path, starts, run_temp_dir, clean_torch)


@pytest.mark.timeout(300)
def test_a_bug_in_a_ctx_loop_in_local_mode_fails_once_naming_its_line(tmp_path):
    spec = torch_spec("buggy", tmp_path, "faulty:torch_loop_raises", raise_at=3)
    error = failure_of(run_command(spec, str(tmp_path), mode="local"))
    assert "failed on its first attempt: rank 1: ValueError: bad batch at step 3" in error, error
    assert "tests/helpers/faulty.py:" in error and "not retried" in error, error
    summary = json.loads((tmp_path / "buggy" / "summary.json").read_text())
    assert summary["status"] == "failed" and len(summary["starts"]) == 1
    assert summary["failures"][0]["classification"] == "user"


@pytest.mark.timeout(400)
def test_a_ctx_loop_stopped_by_sigterm_in_local_mode_commits_a_stop_checkpoint_refuses_a_second_driver_and_resumes(
        tmp_path, clean_torch):
    marker = tmp_path / "at-step-12"
    spec = torch_spec("stop", tmp_path, loop="faulty:slow_loop", sleep_s=0.1, mark_at=12, marker=str(marker))

    def while_it_trains(process):
        second = run_cli("run", str(tmp_path / "stop.yaml"), "--local", env={"PYTHONPATH": HELPERS}, timeout=60)
        # The local run serves its metrics itself, with Ray's names and the run's label.
        endpoint = next(line.split()[1] for line in _lines_so_far(process) if line.startswith("metrics: "))
        return second, urllib.request.urlopen(endpoint, timeout=10).read().decode()

    process, _, (second, scraped), stop_uri = _stopped_by_sigterm(tmp_path, spec, marker, while_it_trains)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stdout + second.stderr
    assert "is held by a live driver" in second.stderr and f"pid {process.pid}" in second.stderr, second.stderr
    assert 'ray_orchestrator_global_step{run="stop"}' in scraped, scraped[:2000]

    spec["torch"]["train_loop"] = "jobs.digits_torch:train_loop"  # the same training, without the sleeps
    resumed = run_spec(spec, str(tmp_path), mode="local")
    assert resumed.status == "finished" and resumed.resumed_from["uri"] == stop_uri, resumed.resumed_from
    assert resumed.weights_sha256 == clean_torch.weights_sha256


def _stopped_by_sigterm(tmp_path, spec, marker, while_it_trains=lambda process: None):
    """`spec` run in local mode (as stop.yaml) until `marker` appears; `while_it_trains(process)`
    then, and SIGTERM. The command must exit 143 with the stop checkpoint its newest: the process,
    its output, what `while_it_trains` returned, and that checkpoint's URI."""
    (tmp_path / "stop.yaml").write_text(json.dumps(spec))
    process = _popen("run", str(tmp_path / "stop.yaml"), "--local", env={})
    try:
        wait_for(marker.exists, timeout=240, interval=0.2)
        seen = while_it_trains(process)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 143, output[-3000:]
    store = CheckpointStore(storage.resolve(str(tmp_path / spec["name"])))
    assert store.committed()[-1].manifest.reason == "stop", [(i.step, i.manifest.reason) for i in store.committed()]
    return process, output, seen, store.committed()[-1].uri


_OUTPUT: dict[int, list[str]] = {}


def _lines_so_far(process: subprocess.Popen) -> list[str]:
    """What the process printed up to its 'metrics:' line (read as it comes, kept per process)."""
    lines = _OUTPUT.setdefault(process.pid, [])
    while not any(line.startswith("metrics: ") for line in lines):
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
    return lines


# --- a Lightning module --------------------------------------------------------------------------


@pytest.mark.timeout(400)
def test_a_lightning_module_in_local_mode_survives_a_sigkill_and_a_sigstop_in_place_bit_equal_to_the_ray_path(
        tmp_path, clean_lightning, run_temp_dir):
    starts = tmp_path / "starts.jsonl"
    spec = lightning_spec("faults", tmp_path, "faulty.ThreeFaultsClassifier", faults=_faults(tmp_path, 8, 30),
                          starts=str(starts))
    _assert_survives_in_place_to_the_clean_weights(spec, tmp_path, starts, run_temp_dir, clean_lightning)


@pytest.mark.timeout(300)
def test_a_bug_in_a_lightning_module_in_local_mode_fails_once_naming_its_line(tmp_path):
    # The failing rank never ends by itself: a callback's on_exception stays in a C call that keeps
    # the GIL (its heartbeat thread held), after a last heartbeat saying it trains (it pauses 2 s
    # in the step before raising). It is a rank on its way out with the user's error, not a hang,
    # and its agent ends it after the hang timeout (not failure.finish_timeout_s, 1800 s). Before,
    # this was a hang verdict, and the bug was restarted as one.
    spec = lightning_spec("buggy", tmp_path, "faulty.BuggyClassifier", raise_at=3, pause_s=2.0)
    spec["lightning"]["callbacks"] = [{"class_path": "faulty.SlowToFail", "init_args": {"seconds": 3600}}]
    spec["failure"]["hang_timeout_s"] = HANG_TIMEOUT_S
    error = failure_of(run_command(spec, str(tmp_path), mode="local"))
    assert "failed on its first attempt: rank 1: KeyError" in error and "no such feature at step 3" in error, error
    assert "tests/helpers/faulty.py:" in error, error
    failure = json.loads((tmp_path / "buggy" / "summary.json").read_text())["failures"][0]
    assert failure["classification"] == "user", failure
    assert "had not ended within failure.hang_timeout_s of this error" in failure["ranks"][0]["note"], failure


@pytest.mark.timeout(300)
def test_a_lightning_module_stopped_by_sigterm_in_local_mode_commits_a_stop_checkpoint(tmp_path):
    marker = tmp_path / "at-step-12"
    spec = lightning_spec("stop", tmp_path, "faulty.SlowClassifier", sleep_s=0.1, mark_at=12, marker=str(marker))
    _, output, _, _ = _stopped_by_sigterm(tmp_path, spec, marker)
    assert "stopped by SIGTERM after step" in output, output[-3000:]


# --- what local mode refuses ---------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_local_mode_refuses_what_only_a_cluster_gives_saying_why(tmp_path):
    two_nodes = run_cli("torchrun", "--local", "--nnodes", "2", "--storage", str(tmp_path), SEED, "--work_dir", "w")
    assert two_nodes.returncode == 2 and "asks for 2 nodes (--nnodes 2), which only a Ray cluster gives" in \
        two_nodes.stderr, two_nodes.stderr
    elastic = run_cli("torchrun", "--local", "--nnodes", "1:2", "--storage", str(tmp_path), SEED, "--work_dir", "w")
    assert elastic.returncode == 2 and "an elastic size" in elastic.stderr, elastic.stderr
    named = run_cli("torchrun", "--local", "--address", "127.0.0.1:1", "--storage", str(tmp_path), SEED,
                    "--work_dir", "w")
    assert named.returncode == 2 and "--local runs without Ray, and a Ray cluster was named too" in named.stderr, \
        named.stderr
    spec = torch_spec("too-big", tmp_path)
    spec["scaling"]["num_workers"] = 64
    before = _cpu_of_children()
    too_big = run_command(spec, str(tmp_path))
    refusal_cpu_s = _cpu_of_children() - before
    assert too_big.returncode == 2 and "64 worker(s) x 1 rank(s) cannot run on this machine in local mode" in \
        too_big.stderr, too_big.stderr
    # Refused before any of its 64 ranks started: the command's own start (0.8 CPU-s here), not 64
    # ranks importing torch until they were ended (193 CPU-s, 112 s, before the fix).
    assert refusal_cpu_s < 40, f"the refusal cost {refusal_cpu_s:.0f} CPU-s: ranks were started before it"
    for done in (two_nodes, elastic, named, too_big):
        assert "Traceback" not in done.stderr and "Fix:" in done.stderr
