"""The lease gives up after its rounds (orchestrator/checkpoint/lease.py `RunLease.acquire`): when
every generation a driver goes to claim was claimed first by a driver that is gone by the time it
is looked at, it stops after _MAX_ROUNDS rounds with RunBusy, naming the claims' folder and the
fix, instead of claiming on forever; it holds nothing then.

The rivals are claims on the real run folder written as a driver writes one (created exclusively),
each of a real process of this host that has ended. Each is written just before the driver builds
its own claim of that generation: the driver asks `now` for the times it writes into its claim
(twice a claim: its start and its first heartbeat), and the first of those asks is the moment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid

import pytest

from orchestrator.checkpoint.lease import RunBusy, RunLease
from orchestrator.processes import kernel_and_pid_namespace, pid_started
from orchestrator.run_dir import RunDir

ROUNDS = 5  # lease._MAX_ROUNDS, as its message says


def gone_driver() -> dict:
    """Who a driver that has ended was: a real process of this host, started and reaped here."""
    process = subprocess.Popen(["sleep", "60"])
    started = pid_started(process.pid)
    process.kill()
    process.wait()
    boot_id, pid_ns = kernel_and_pid_namespace()
    return {"host": socket.gethostname(), "pid": process.pid, "pid_started": started, "boot_id": boot_id,
            "pid_ns": pid_ns}


def test_a_driver_that_finds_every_generation_claimed_by_gone_drivers_gives_up_after_its_rounds(tmp_path):
    run_dir = RunDir.at(str(tmp_path / "run"))
    claims = run_dir.lease_claims.path
    gone = gone_driver()
    rivals: list[int] = []
    asks = 0

    def now_with_a_rival_first() -> float:
        nonlocal asks
        asks += 1
        if asks % 2 == 1:  # the driver is about to claim generation len(rivals) + 1: a rival takes it first
            generation = len(rivals) + 1
            os.makedirs(claims, exist_ok=True)
            claim = {**gone, "started_at": 1.0, "generation": generation, "nonce": uuid.uuid4().hex,
                     "heartbeat_at": 1.0, "released_at": None}
            fd = os.open(os.path.join(claims, f"{generation:09d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump(claim, f)
            rivals.append(generation)
        return 1000.0 + asks

    with pytest.raises(RunBusy) as refused:
        RunLease.acquire(run_dir, now=now_with_a_rival_first)

    message = str(refused.value)
    assert f"{ROUNDS} lease generations in a row were claimed" in message, message
    assert claims in message and "delete that folder and start again" in message, message
    assert rivals == list(range(1, ROUNDS + 1))
    # The driver claimed nothing: every claim in the folder is a rival's, and none names this process.
    names = sorted(os.listdir(claims))
    assert names == [f"{g:09d}" for g in rivals], names
    for name in names:
        with open(os.path.join(claims, name)) as f:
            assert json.load(f)["pid"] == gone["pid"]
    assert not os.path.exists(run_dir.lease.path), "no lease.json: the run was never taken"
