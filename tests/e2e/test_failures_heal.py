"""Failures heal: hangs are caught within failure.hang_timeout_s, bugs in the training code fail
the run on its first attempt, a rank that cannot read the group's checkpoint fails the start for
the whole group, and a run that can never be placed says why and gives up.

The faults are real: a worker SIGKILLs or SIGSTOPs itself (frozen, as on a stalled node), a rank waits
forever on a lock, the training code raises, the storage read fails on one rank.
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from cli_runs import failure_of, run_command, run_spec
from conftest import REPO, run_cli
from specs import lightning_spec, torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

# Near the spec's minimum (5 s): each test waits it out twice, and outlasts it once more with a
# legitimately slow evaluation.
HANG_TIMEOUT_S = 6
# The lightning run's SIGKILL: random each run; set ORCHESTRATOR_TEST_KILL_STEP to replay one.
KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_KILL_STEP", random.Random().randint(5, 40)))
# Seconds from a hang's detection to the first step of the restarted group, on a loaded 2-core
# machine (a restart measures 10-20 s here).
RECOVERY_SLACK_S = 60


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _worker_logs(run_dir) -> str:
    """The end of each rank's log and of the driver's, to say why a check failed."""
    return "\n".join(f"--- {path.name}:\n{path.read_text(errors='replace')[-3000:]}"
                     for path in sorted((run_dir / "logs").glob("*.log")))


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(500)
def test_a_frozen_worker_then_a_deadlocked_one_are_each_caught_and_the_run_ends_with_the_clean_weights(
        tmp_path, clean_torch):
    # Rank 1 is SIGSTOPped after step 15 (frozen, as on a stalled node); after the restart, rank 0
    # waits forever on an event after step 40 while its process, and its heartbeat, go on. Each
    # epoch's evaluation takes longer than the hang timeout: legitimately long, not a hang.
    frozen = {"kill_at": 15, "marker": str(tmp_path / "frozen"), "kill_rank": 1}
    stuck = {"kill_at": 40, "marker": str(tmp_path / "stuck"), "kill_rank": 0}
    spec = torch_spec("hangs", tmp_path, "faulty:torch_loop_frozen_then_deadlocked", frozen, stuck=stuck,
                      slow_epoch_end_s=HANG_TIMEOUT_S + 2)
    spec["failure"]["hang_timeout_s"] = HANG_TIMEOUT_S
    result = run_spec(spec, str(tmp_path))

    assert result.status == "finished"
    assert [f["classification"] for f in result.failures] == ["hang", "hang"]
    first, second = (f["hang"] for f in result.failures)
    assert first["what"] == "stopped answering" and first["ranks"] == [1]
    # Every rank of a deadlocked group stops stepping; the message shows where each one stands.
    assert second["what"] == "made no progress" and "faulty.py" in second["message"]
    # Each hang was noticed within the timeout (give or take a heartbeat), counted from the fault.
    for hang, marker in ((first, frozen["marker"]), (second, stuck["marker"])):
        assert HANG_TIMEOUT_S - 1.5 <= hang["time"] - os.path.getmtime(marker) <= HANG_TIMEOUT_S + 5
    # ...and the group was training again soon after.
    events = json.loads((tmp_path / "hangs" / "summary.json").read_text())
    assert [s["restored_step"] for s in events["starts"]] == [None, 10, 40]
    # The flight recorder: the frozen rank gave none; at the deadlock, rank 0 is named as never
    # having entered the all-reduce its peer waits in, and each rank's dump is beside its log.
    first_record, deadlock_record = events["hang_collectives"]
    assert first_record["ranks"] == [] and "rank(s) 1 gave no flight record" in first_record["message"]
    assert deadlock_record["ranks"] == [0] and "rank 0 never entered collective #" in deadlock_record["message"], (
        deadlock_record, _worker_logs(tmp_path / "hangs"))
    assert all((tmp_path / "hangs" / "logs" / f"rank-{rank}.flight-recorder.json").exists() for rank in (0, 1))
    assert result.goodput["lost_s"]["restarts"] <= 2 * (HANG_TIMEOUT_S + RECOVERY_SLACK_S)
    assert result.global_step == clean_torch.global_step
    assert result.weights_sha256 == clean_torch.weights_sha256


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(500)
def test_a_lightning_worker_killed_at_a_random_step_then_one_frozen_are_each_recovered_to_the_clean_weights(
        tmp_path, clean_lightning):
    # Rank 1 is SIGKILLed after a random step (the group restarts from the newest committed
    # checkpoint), then SIGSTOPped 10-20 steps later (frozen, as on a stalled node). The first
    # epoch's validation takes longer than the hang timeout: legitimately long, not a hang.
    killed_marker, frozen_marker = tmp_path / "kill-marker", tmp_path / "frozen-marker"
    freeze_at = KILL_STEP + random.Random().randint(10, 20)
    spec = lightning_spec("killed-then-frozen", tmp_path, "faulty.KilledThenFrozenClassifier",
                          first_kill_at=KILL_STEP, first_marker=str(killed_marker), kill_at=freeze_at,
                          marker=str(frozen_marker), slow_validation_s=HANG_TIMEOUT_S + 2)
    spec["failure"]["hang_timeout_s"] = HANG_TIMEOUT_S
    result = run_spec(spec, str(tmp_path))

    assert killed_marker.exists() and frozen_marker.exists(), "a fault was never injected"
    assert result.status == "finished"
    # One failure each: the slow validation was not taken for a hang.
    assert result.restarts == 2, f"kill at step {KILL_STEP}, freeze at {freeze_at}: {result.failures}"
    _, frozen = result.failures
    # The freeze was judged a hang of rank 1 (it is the agent's child: Ray sees nothing wrong with
    # its worker), within the timeout of the freeze, give or take a heartbeat and a loaded machine.
    assert frozen["classification"] == "hang", frozen
    assert frozen["hang"]["what"] == "stopped answering" and frozen["hang"]["ranks"] == [1], frozen["hang"]
    assert HANG_TIMEOUT_S - 1.5 <= frozen["time"] - frozen_marker.stat().st_mtime <= HANG_TIMEOUT_S + 10, frozen
    assert result.global_step == clean_lightning.global_step
    assert result.weights_sha256 == clean_lightning.weights_sha256, f"kill at step {KILL_STEP}, freeze at {freeze_at}"


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(300)
def test_a_bug_in_the_training_loop_fails_the_run_on_its_first_attempt_with_where_it_was_raised(tmp_path):
    import yaml

    spec = torch_spec("buggy", tmp_path, "faulty:torch_loop_raises", raise_at=3)
    spec["failure"]["max_failures"] = 3
    path = tmp_path / "buggy.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli("run", str(path), env={"PYTHONPATH": os.path.join(REPO, "tests", "helpers")})

    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed on its first attempt: rank 1: ValueError: bad batch at step 3" in done.stderr
    assert "tests/helpers/faulty.py:" in done.stderr and "not retried" in done.stderr
    assert "Traceback" not in done.stderr
    summary = _summary(tmp_path / "buggy")
    assert summary["status"] == "failed" and len(summary["starts"]) == 1
    assert summary["failures"][0]["classification"] == "user"
    assert "ValueError: bad batch at step 3" in (tmp_path / "buggy" / "logs" / "rank-1.log").read_text()


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(300)
def test_a_lightning_training_step_that_raises_fails_the_run_on_its_first_attempt(tmp_path):
    spec = lightning_spec("buggy", tmp_path, "faulty.BuggyClassifier", raise_at=3)
    message = failure_of(run_command(spec, str(tmp_path)))

    assert "failed on its first attempt: rank 1: KeyError" in message
    assert "no such feature at step 3" in message
    assert "tests/helpers/faulty.py:" in message  # where the user's code raised it
    summary = _summary(tmp_path / "buggy")
    assert len(summary["starts"]) == 1 and summary["failures"][0]["classification"] == "user"


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
def test_resume_from_another_runs_checkpoint_that_a_rank_cannot_read_fails_the_start_for_every_rank_and_retries_it(
        tmp_path, clean_torch, monkeypatch):
    # The clean run's checkpoint at step 60, continued to its end in a run of its own; rank 1's
    # first read of it fails as a storage outage would (EIO).
    start = next(i for i in CheckpointStore(storage.resolve(clean_torch.run_dir)).committed() if i.step == 60)
    marker = tmp_path / "unreadable-marker"
    monkeypatch.setenv("PYTHONPATH", os.path.join(REPO, "tests", "helpers", "injected"))
    spec = torch_spec("unreadable", tmp_path)
    spec["resume_from"] = start.uri
    spec["env"] = {"ORCHESTRATOR_TEST_UNREADABLE_RANK": "1", "ORCHESTRATOR_TEST_UNREADABLE_MARKER": str(marker)}
    result = run_spec(spec, str(tmp_path))

    assert marker.exists(), "the fault was never injected"
    assert [f["classification"] for f in result.failures] == ["infrastructure"]
    errors = " ".join(r["error"] for r in result.failures[0]["ranks"])
    assert "rank 1 could not read it" in errors and start.uri in errors and "injected" in errors
    # The retried start resumed every rank from that same checkpoint, and the run ended exactly
    # where the clean run did.
    assert result.resumed_from["uri"] == start.uri
    assert result.resumed_from["reason"] == "resume_from names this checkpoint"
    assert [s["restored_step"] for s in result.starts] == [60]
    assert result.weights_sha256 == clean_torch.weights_sha256


@pytest.mark.timeout(300)
def test_a_run_the_cluster_can_never_hold_says_what_is_missing_and_gives_up_after_the_deadline(tmp_path):
    import yaml

    spec = torch_spec("too-big", tmp_path)
    spec["scaling"]["num_workers"] = 3  # the embedded cluster has 2 CPUs
    spec["failure"]["capacity_timeout_s"] = 10  # the spec's minimum: the whole wait is the test's time
    path = tmp_path / "too-big.yaml"
    path.write_text(yaml.safe_dump(spec))
    # --ray: Ray's wait for capacity (local mode refuses such a run at once: test_local_mode.py).
    done = run_cli("run", str(path), "--ray")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "waiting for capacity" in done.stdout
    assert "gave up waiting for capacity after failure.capacity_timeout_s = 10 s" in done.stderr
    assert "short by {CPU: 1}" in done.stderr and "can hold at most 2" in done.stderr
    assert "Traceback" not in done.stderr
    summary = _summary(tmp_path / "too-big")
    assert summary["status"] == "failed" and summary["goodput"]["lost_s"]["capacity_wait"] >= 5



@pytest.mark.timeout(300)
def test_a_stop_whose_grace_runs_out_ends_the_workers_and_keeps_every_committed_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import yaml

    # Rank 0 notes its live weights after step 10 (weights_at_step.py): what that checkpoint must hold.
    noted = tmp_path / "weights-at-10.pt"
    spec = torch_spec("no-grace", tmp_path, "weights_at_step:slow_loop_noting_weights", sleep_s=0.5, weights_at=10,
                      weights_to=str(noted))
    path = tmp_path / "no-grace.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "tests", "helpers"), "ORCHESTRATOR_STOP_GRACE_S": "0"}
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(path)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in driver.stdout:
            lines.append(line)
            if "checkpoint committed: step 10" in line:
                signalled = time.monotonic()
                driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=120)
    finally:
        driver.kill()
    output = "".join(lines)

    assert driver.returncode == 143, output
    assert time.monotonic() - signalled < 60, "the workers were not ended when the grace ran out"
    assert "grace period ran out" in output
    summary = _summary(tmp_path / "no-grace")
    assert summary["status"] == "stopped"
    store = CheckpointStore(storage.resolve(str(tmp_path / "no-grace")))
    at_10 = next((i for i in store.committed() if i.step == 10), None)
    assert at_10 is not None, [(i.step, i.status) for i in store.scan()]
    verified = store.verify(at_10)
    assert verified.status == "committed", (verified.status, verified.problem)
    # Its weights, read from the file with torch alone, are the rank's own at that step.
    state = torch.load(os.path.join(_local_path(at_10.uri), "state.pt"), map_location="cpu", weights_only=True)
    saved, live = state["objects"]["model"], torch.load(noted, map_location="cpu", weights_only=True)
    assert sorted(saved) == sorted(live), (sorted(saved), sorted(live))
    assert all(torch.equal(saved[name], live[name]) for name in live), "the step-10 checkpoint holds other weights"


def _local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri
