"""The run lease: one driver writes a run directory; a dead one is taken over, a live one is not."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, wait_for

from orchestrator import storage
from orchestrator.checkpoint.lease import LEASE_TTL_S, Holder, LeaseLost, RunBusy, RunLease, fence
from orchestrator.run_dir import RunDir
from orchestrator.storage import Location

# A driver in its own process: waits for the `go` file, tries to take the lease, writes the outcome
# to `result` (whole, by rename) and then holds the lease until the test kills it.
DRIVER = """
import os, sys, time
from orchestrator.checkpoint.lease import RunBusy, RunLease
from orchestrator.run_dir import RunDir
run_uri, ready, go, result = sys.argv[1:5]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
try:
    outcome = f"won {RunLease.acquire(RunDir.at(run_uri)).generation}"
except RunBusy as exc:
    outcome = f"busy {exc}"
with open(result + ".tmp", "w") as f:
    f.write(outcome)
os.replace(result + ".tmp", result)
if outcome.startswith("won"):
    time.sleep(600)
"""


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    return RunDir.of(str(tmp_path / "storage"), "run")


@pytest.fixture
def drivers(tmp_path):
    """Start DRIVER processes; each is killed by its own pid and reaped when the test ends."""
    started = []

    def start(run_dir: RunDir, name: str, go: str):
        paths = {key: str(tmp_path / f"{name}.{key}") for key in ("ready", "result")}
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, run_dir.uri, paths["ready"], go, paths["result"]],
                                cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
        started.append(proc)
        return proc, paths

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def write_lease(run_dir: RunDir, **fields) -> None:
    """A lease.json as another driver would have left it."""
    write_holder(run_dir.lease, **fields)


def write_claim(run_dir: RunDir, generation: int, **fields) -> None:
    """A claim file as another driver taking the run over would have left it."""
    write_holder(run_dir.lease_claims.join(f"{generation:09d}"), generation=generation, **fields)


def write_holder(loc: Location, **fields) -> None:
    holder = dict(host="other-host", pid=4242, pid_started=None, started_at=time.time(), generation=1,
                  nonce="theirs", heartbeat_at=time.time(), released_at=None)
    storage.write_atomic(loc, json.dumps({**holder, **fields}).encode())


def lease_file(run_dir: RunDir) -> Holder:
    return Holder.from_json(storage.read_bytes(run_dir.lease))


def read_result(path: str) -> str | None:
    return open(path).read() if os.path.exists(path) else None


def test_an_empty_run_dir_gives_generation_1_and_each_takeover_after_a_release_one_more(run_dir):
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 1
        assert lease_file(run_dir).nonce == lease.holder.nonce
    assert lease_file(run_dir).released_at is not None
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 2


def test_a_second_driver_is_refused_while_the_first_holds_the_run(run_dir):
    with RunLease.acquire(run_dir):
        with pytest.raises(RunBusy) as busy:
            RunLease.acquire(run_dir)
    message = str(busy.value)
    assert socket.gethostname() in message and f"pid {os.getpid()}" in message
    assert "--set name=" in message and "ray job stop" in message


def test_a_lease_held_by_a_killed_process_on_this_host_is_taken_over_at_once(run_dir, drivers, tmp_path):
    go = tmp_path / "go"
    go.touch()
    proc, paths = drivers(run_dir, "killed", str(go))
    assert wait_for(lambda: read_result(paths["result"]), timeout=30, interval=0.05) == "won 1"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 2


def test_a_lease_whose_pid_now_belongs_to_another_process_is_taken_over(run_dir):
    write_lease(run_dir, host=socket.gethostname(), pid=os.getpid(), pid_started="1", generation=4)
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 5


def test_another_hosts_lease_is_taken_over_only_once_its_heartbeat_is_older_than_the_ttl(run_dir):
    write_lease(run_dir, heartbeat_at=time.time() - 5)
    with pytest.raises(RunBusy, match="other-host, pid 4242"):
        RunLease.acquire(run_dir)
    write_lease(run_dir, heartbeat_at=time.time() - 2 * LEASE_TTL_S)
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 2


def test_a_garbled_lease_is_refused_while_fresh_and_taken_over_once_old(run_dir):
    storage.ensure_dir(run_dir.location)
    with open(run_dir.lease.path, "w") as f:
        f.write("{not json")
    with pytest.raises(RunBusy, match=r"lease\.json' is unreadable"):
        RunLease.acquire(run_dir)
    old = time.time() - 2 * LEASE_TTL_S
    os.utime(run_dir.lease.path, (old, old))
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 1


def test_a_claim_in_flight_is_respected_and_one_whose_driver_died_is_skipped(run_dir):
    # No lease.json yet, but another host claimed generation 1 just now: it is taking the run over.
    write_claim(run_dir, 1, pid=777)
    with pytest.raises(RunBusy, match="other-host, pid 777"):
        RunLease.acquire(run_dir)
    # That claim went stale without a lease.json ever written: the next generation is taken.
    write_claim(run_dir, 1, pid=777, heartbeat_at=time.time() - 2 * LEASE_TTL_S)
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 2
    # Generation 3 was claimed by a driver that died before writing lease.json: it is skipped.
    write_claim(run_dir, 3, heartbeat_at=time.time() - 2 * LEASE_TTL_S)
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 4


def test_the_heartbeat_refreshes_the_lease(run_dir):
    with RunLease.acquire(run_dir).start_heartbeat(0.05) as lease:
        first = lease_file(run_dir).heartbeat_at
        wait_for(lambda: lease_file(run_dir).heartbeat_at > first, timeout=5, interval=0.02)
        lease.check()


def test_after_a_takeover_the_old_writer_is_fenced_off_and_leaves_the_new_lease_alone(run_dir):
    old = RunLease.acquire(run_dir).start_heartbeat(0.05)
    # Seen from a clock past the TTL, the old holder's heartbeat is stale.
    new = RunLease.acquire(run_dir, now=lambda: time.time() + 2 * LEASE_TTL_S)
    assert new.generation == old.generation + 1
    with pytest.raises(LeaseLost, match=f"generation {new.generation} now holds it"):
        fence(run_dir, old.generation)
    fence(run_dir, new.generation)
    # The old heartbeat notices and stops; once its thread is gone it can never write again.
    wait_for(lambda: old.lost is not None and not old._thread.is_alive(), timeout=5, interval=0.02)
    assert (lease_file(run_dir).generation, lease_file(run_dir).nonce) == (new.generation, new.holder.nonce)
    with pytest.raises(LeaseLost):
        old.check()
    old.release()  # leaves the new holder's lease as it is
    assert lease_file(run_dir).released_at is None
    new.check()
    new.release()


def test_a_missing_lease_fences_off_every_writer(run_dir):
    with pytest.raises(LeaseLost, match="missing or unreadable"):
        fence(run_dir, 1)


def test_of_two_drivers_racing_for_a_dead_lease_exactly_one_wins(run_dir, drivers, tmp_path):
    write_lease(run_dir, heartbeat_at=time.time() - 2 * LEASE_TTL_S)
    go = tmp_path / "go"
    started = [drivers(run_dir, name, str(go)) for name in ("a", "b")]
    for _, paths in started:
        wait_for(lambda paths=paths: os.path.exists(paths["ready"]), timeout=30, interval=0.02)
    go.touch()
    outcomes = [wait_for(lambda paths=paths: read_result(paths["result"]), timeout=30, interval=0.02)
                for _, paths in started]
    winners = [proc for (proc, _), outcome in zip(started, outcomes, strict=True) if outcome == "won 2"]
    losers = [outcome for outcome in outcomes if outcome.startswith("busy")]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    # The loser names the winner, which is still holding the run.
    assert f"pid {winners[0].pid}" in losers[0]
    assert lease_file(run_dir).pid == winners[0].pid


def test_claims_of_old_generations_are_pruned(run_dir):
    for _ in range(6):
        RunLease.acquire(run_dir).release()
    claims = sorted(os.path.basename(info.path) for info in storage.list_dir(run_dir.lease_claims))
    assert claims == ["000000004", "000000005", "000000006"]


def test_the_lease_works_the_same_on_s3(s3_server):
    run_dir = RunDir.of(s3_server.format(prefix=f"lease-test-{uuid.uuid4().hex[:8]}"), "run")
    first = RunLease.acquire(run_dir)
    assert first.generation == 1
    with pytest.raises(RunBusy, match=f"pid {os.getpid()}"):
        RunLease.acquire(run_dir)
    first.release()
    assert lease_file(run_dir).released_at is not None
    write_lease(run_dir, generation=2, heartbeat_at=time.time() - 2 * LEASE_TTL_S)
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 3
        fence(run_dir, 3)
        with pytest.raises(LeaseLost, match="generation 3 now holds it"):
            fence(run_dir, 2)
