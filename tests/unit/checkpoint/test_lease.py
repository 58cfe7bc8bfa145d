"""The run lease: one driver writes a run directory; a dead one is taken over, a live one is not.

Drivers run in processes of their own (tests/helpers/lease_driver.py). A driver "in another container" or
"on another host" runs in a pid namespace (and a UTS namespace, with its own hostname) of its own,
made with `unshare`; those tests are skipped where namespaces cannot be made. Where a test needs a
driver whose pid cannot be checked from here but no namespace, the driver only reports another
hostname (`--seen-as`), as a driver on another host sharing the storage would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, wait_for

from orchestrator import storage
from orchestrator.checkpoint.lease import (
    HEARTBEAT_INTERVAL_S,
    LEASE_TTL_S,
    Holder,
    LeaseLost,
    RunBusy,
    RunLease,
    current_holder,
    fence,
)
from orchestrator.run_dir import RunDir

DRIVER = os.path.join(REPO, "tests", "helpers", "lease_driver.py")
# A pid namespace of its own (its /proc too) for the driver; with --uts, a hostname of its own.
NAMESPACE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount-proc"]
# A TTL short enough that watching a stopped heartbeat for one takes a moment.
SHORT_TTL_S = 0.5
# Seconds within which a holder judged by its pid is answered: well under HEARTBEAT_INTERVAL_S (10 s), the
# longest a watcher waits for a live driver's heartbeat to move, with slack for a loaded machine.
AT_ONCE_S = 5.0


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run([*NAMESPACE, "--uts", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_namespaces = pytest.mark.skipif(not _namespaces_work(), reason="cannot make user+pid+UTS namespaces here "
                                      "(unshare missing, or user namespaces disabled)")


@dataclass
class Driver:
    proc: subprocess.Popen
    out: Path

    def read(self, name: str) -> str | None:
        path = self.out / name
        return path.read_text() if path.exists() else None

    def wait(self, name: str, timeout: float = 60) -> str:
        return wait_for(lambda: self.read(name), timeout=timeout, interval=0.02)

    def won(self) -> tuple[int, str]:
        """(generation, nonce) of the lease this driver took; fails with its outcome otherwise."""
        outcome = self.wait("result")
        assert outcome.startswith("won "), outcome
        _, generation, nonce = outcome.split()
        return int(generation), nonce


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    return RunDir.of(str(tmp_path / "storage"), "run")


@pytest.fixture
def drivers(tmp_path):
    """Start lease_driver.py processes; each is killed by its own pid and reaped when the test ends
    (in a namespace, `unshare --kill-child` takes the driver with it)."""
    started: list[subprocess.Popen] = []

    def start(run_dir: RunDir, name: str, *options: str, namespace: bool = False) -> Driver:
        out = tmp_path / name
        out.mkdir()
        command = [sys.executable, DRIVER, run_dir.location.path if "--stalling" in options else run_dir.uri,
                   str(out), *options]
        if namespace:
            command = [*NAMESPACE, *(["--uts"] if "--hostname" in options else []), *command]
        proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
        started.append(proc)
        return Driver(proc, out)

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def holder_json(generation: int = 1, **fields) -> bytes:
    """A claim or lease.json of another host's driver."""
    holder = dict(host="other-host", pid=4242, pid_started=None, started_at=time.time(), generation=generation,
                  nonce="theirs", heartbeat_at=time.time(), released_at=None)
    return json.dumps({**holder, **fields}).encode()


def write_holder(run_dir: RunDir, generation: int = 1, **fields) -> None:
    """The claim of `generation` and lease.json, as a driver that took the run over left them."""
    storage.write_atomic(run_dir.lease_claims.join(f"{generation:09d}"), holder_json(generation, **fields))
    storage.write_atomic(run_dir.lease, holder_json(generation, **fields))


def lease_file(run_dir: RunDir) -> Holder:
    return Holder.from_json(storage.read_bytes(run_dir.lease))


def this_boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def this_pid_namespace() -> str:
    return str(os.stat("/proc/self/ns/pid").st_ino)


def this_process_started() -> str:
    with open(f"/proc/{os.getpid()}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def timed_acquire(run_dir: RunDir, **options) -> tuple[RunLease, float]:
    """The lease and the seconds taking it took, on this process's monotonic clock."""
    start = time.monotonic()
    lease = RunLease.acquire(run_dir, **options)
    return lease, time.monotonic() - start


# --- taking the lease, and refusing it ---


def test_an_empty_run_dir_gives_generation_1_and_each_takeover_after_a_release_one_more(run_dir):
    with RunLease.acquire(run_dir) as lease:
        assert lease.generation == 1
        assert lease_file(run_dir).nonce == lease.holder.nonce
    assert lease_file(run_dir).released_at is not None
    # Released: taken at once, not after watching its heartbeat for a TTL (60 s).
    lease, took = timed_acquire(run_dir)
    with lease:
        assert lease.generation == 2 and took < LEASE_TTL_S / 4


def test_a_second_driver_is_refused_while_the_first_holds_the_run(run_dir):
    with RunLease.acquire(run_dir).start_heartbeat(0.05):
        with pytest.raises(RunBusy) as busy:
            RunLease.acquire(run_dir)
    message = str(busy.value)
    assert socket.gethostname() in message and f"pid {os.getpid()}" in message
    assert "--set name=" in message and "ray job stop" in message


def test_a_live_driver_on_this_host_is_refused_at_once_without_waiting_for_its_heartbeat(run_dir, drivers):
    # As `orchestrator run` holds a run: its heartbeat beats every HEARTBEAT_INTERVAL_S (10 s).
    holder = drivers(run_dir, "holder", "--beat", str(HEARTBEAT_INTERVAL_S))
    holder.won()
    said: list[str] = []
    start = time.monotonic()
    with pytest.raises(RunBusy) as busy:
        RunLease.acquire(run_dir, on_wait=said.append)
    took = time.monotonic() - start
    assert took < AT_ONCE_S and said == []  # its pid answered: no heartbeat was watched
    message = str(busy.value)
    assert f"host {socket.gethostname()}, pid {holder.proc.pid}" in message and "alive on this host" in message
    assert holder.read("lost") is None  # it still holds the run


def test_a_second_orchestrator_run_of_a_live_run_on_this_host_is_refused_before_it_imports_anything_slow(
        tmp_path, drivers):
    """The command, command start to exit 2: the run's name and storage are read, the live holder's
    pid answers, and the refusal comes before torch, Lightning or the job's module is imported (the
    command's whole CPU time stays under what importing torch alone costs)."""
    storage_dir = tmp_path / "runs"
    holder = drivers(RunDir.of(str(storage_dir), "digits-quickstart"), "holder", "--beat", str(HEARTBEAT_INTERVAL_S))
    holder.won()
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator", "run", "jobs/quickstart.yaml",
                           "--set", f"storage={storage_dir}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and error, done.stderr[-3000:]
    assert "held by a live driver" in error[0] and f"pid {holder.proc.pid}" in error[0]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "lightning", "ray", "jobs.digits"}, sorted(imported & {"torch", "lightning", "ray"})
    assert cpu < 3.0, f"{cpu:.2f} s of CPU for a refusal"


def test_a_lease_held_by_a_killed_process_on_this_host_is_taken_over_at_once(run_dir, drivers):
    driver = drivers(run_dir, "killed", "--beat", str(HEARTBEAT_INTERVAL_S))
    assert driver.won()[0] == 1
    os.kill(driver.proc.pid, signal.SIGKILL)
    driver.proc.wait(timeout=10)
    said: list[str] = []
    lease, took = timed_acquire(run_dir, on_wait=said.append)
    with lease:
        assert lease.generation == 2 and took < AT_ONCE_S and said == []


@pytest.mark.parametrize("started", ["same", "other"])
def test_a_live_pid_on_this_host_is_the_holder_only_if_it_started_when_the_holder_did(run_dir, started):
    # Same host, same kernel, same pid namespace, and no heartbeat that ever moves: the pid names this
    # process, which is alive. Started when the claim says, it is the holder, a hung one perhaps, and its
    # run is not taken over under it; started at another time, the pid was reused and the holder is gone.
    same = started == "same"
    write_holder(run_dir, 4, host=socket.gethostname(), pid=os.getpid(),
                 pid_started=this_process_started() if same else "1", boot_id=this_boot_id(),
                 pid_ns=this_pid_namespace())
    said: list[str] = []
    start = time.monotonic()
    if same:
        with pytest.raises(RunBusy, match=f"pid {os.getpid()}, .*alive on this host"):
            RunLease.acquire(run_dir, ttl_s=SHORT_TTL_S, on_wait=said.append)
    else:
        with RunLease.acquire(run_dir, ttl_s=SHORT_TTL_S, on_wait=said.append) as lease:
            assert lease.generation == 5
    assert time.monotonic() - start < AT_ONCE_S and said == []


def test_the_heartbeat_moves_and_the_status_sees_it(run_dir):
    with RunLease.acquire(run_dir).start_heartbeat(0.05) as lease:
        first, live = current_holder(run_dir)
        assert live and (first.generation, first.nonce) == (1, lease.holder.nonce)
        wait_for(lambda: current_holder(run_dir)[0].heartbeat_at > first.heartbeat_at, timeout=5, interval=0.02)
        lease.check()
    holder, live = current_holder(run_dir)
    assert holder.released_at is not None and not live


def test_a_garbled_lease_file_is_watched_like_a_heartbeat_and_taken_over_once_it_stood_still(run_dir):
    storage.ensure_dir(run_dir.location)
    with open(run_dir.lease.path, "w") as f:
        f.write("{not json")
    lease, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S)
    with lease:
        assert lease.generation == 1 and took >= SHORT_TTL_S


def test_a_claim_whose_driver_died_before_writing_anything_more_is_skipped(run_dir):
    RunLease.acquire(run_dir).release()
    RunLease.acquire(run_dir).release()
    # Generation 3 was claimed on another host by a driver that died right after: nothing else.
    storage.write_atomic(run_dir.lease_claims.join("000000003"), holder_json(3, pid=777))
    said: list[str] = []
    lease, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S, on_wait=said.append)
    with lease:
        assert lease.generation == 4 and took >= SHORT_TTL_S
    # The wait is announced: it can last a TTL (60 s).
    assert len(said) == 1 and "host other-host, pid 777" in said[0] and "watching its heartbeat" in said[0]


def test_a_missing_lease_fences_off_every_writer(run_dir):
    with pytest.raises(LeaseLost, match="missing or unreadable"):
        fence(run_dir, 1, "any")


def test_of_two_drivers_racing_for_a_released_lease_exactly_one_wins(run_dir, drivers, tmp_path):
    RunLease.acquire(run_dir).release()
    go = tmp_path / "go"
    racers = [drivers(run_dir, name, "--go", str(go), "--beat", "0.05") for name in ("a", "b")]
    for racer in racers:
        racer.wait("ready")
    go.touch()
    outcomes = [racer.wait("result") for racer in racers]
    winners = [racer for racer, outcome in zip(racers, outcomes, strict=True) if outcome.startswith("won 2 ")]
    losers = [outcome for outcome in outcomes if outcome.startswith("busy")]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    # The loser names the winner, which is still holding the run.
    assert f"pid {winners[0].proc.pid}" in losers[0]
    holder, live = current_holder(run_dir)
    assert live and holder.pid == winners[0].proc.pid


def test_claims_and_heartbeats_of_old_generations_are_pruned(run_dir):
    for _ in range(6):
        RunLease.acquire(run_dir).release()
    names = sorted(os.path.basename(info.path) for info in storage.list_dir(run_dir.lease_claims))
    assert sorted({name.split(".")[0] for name in names}) == ["000000004", "000000005", "000000006"]


def test_the_lease_works_the_same_on_s3(s3_server):
    run_dir = RunDir.of(s3_server.format(prefix=f"lease-test-{uuid.uuid4().hex[:8]}"), "run")
    first = RunLease.acquire(run_dir).start_heartbeat(0.05)
    assert first.generation == 1
    with pytest.raises(RunBusy, match=f"pid {os.getpid()}"):
        RunLease.acquire(run_dir)
    first.release()
    assert lease_file(run_dir).released_at is not None
    # Generation 2 was taken by a driver on another host that died: its heartbeat stands still.
    write_holder(run_dir, 2)
    with RunLease.acquire(run_dir, ttl_s=SHORT_TTL_S) as lease:
        assert lease.generation == 3
        fence(run_dir, 3, lease.holder.nonce)
        with pytest.raises(LeaseLost, match="generation 3 now holds it"):
            fence(run_dir, 2, "theirs")
        with pytest.raises(LeaseLost, match="generation 3 now holds it"):
            fence(run_dir, 3, "not-the-holders-nonce")


# --- 1. staleness is judged on the observer's own clock, never by comparing two hosts' clocks ---


def test_a_live_driver_is_not_taken_over_by_a_driver_whose_clock_is_ahead(run_dir, drivers):
    # On another host: judged by its heartbeat, not its pid.
    holder = drivers(run_dir, "holder", "--seen-as", "other-host", "--beat", "0.05")
    holder.won()
    with pytest.raises(RunBusy, match=f"host other-host, pid {holder.proc.pid}"):
        RunLease.acquire(run_dir, now=lambda: time.time() + 2 * LEASE_TTL_S)
    assert holder.read("lost") is None  # it still holds the run


@needs_namespaces
def test_a_live_driver_on_another_host_whose_clock_is_behind_is_not_taken_over(run_dir, drivers):
    holder = drivers(run_dir, "holder", "--hostname", "other-host", "--clock-ahead", str(-2 * LEASE_TTL_S),
                     "--beat", "0.05", namespace=True)
    holder.won()
    with pytest.raises(RunBusy, match="host other-host"):
        RunLease.acquire(run_dir)
    assert holder.read("lost") is None


@needs_namespaces
def test_a_dead_driver_on_another_host_whose_clock_was_ahead_is_taken_over_after_one_ttl_of_watching(
        run_dir, drivers):
    holder = drivers(run_dir, "holder", "--hostname", "other-host", "--clock-ahead", "3600", "--beat", "0.05",
                     namespace=True)
    holder.won()
    os.kill(holder.proc.pid, signal.SIGKILL)
    holder.proc.wait(timeout=10)
    lease, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S)
    with lease:
        assert lease.generation == 2 and took >= SHORT_TTL_S


def test_a_dead_lease_whose_heartbeat_time_lies_in_the_future_is_taken_over_after_one_ttl_of_watching(run_dir):
    # Another host whose clock ran an hour ahead left this lease and died.
    write_holder(run_dir, started_at=time.time() + 3600, heartbeat_at=time.time() + 3600)
    lease, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S)
    with lease:
        assert lease.generation == 2 and took >= SHORT_TTL_S


def test_a_driver_of_an_older_version_that_beats_in_lease_json_is_seen_alive(run_dir):
    # Older versions claim a generation, then refresh heartbeat_at in lease.json at every beat.
    write_holder(run_dir)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.05):
            storage.write_atomic(run_dir.lease, holder_json())

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        with pytest.raises(RunBusy, match="host other-host, pid 4242"):
            RunLease.acquire(run_dir, ttl_s=5)  # a heartbeat not watched would be taken over after 5 s
    finally:
        stop.set()
        beating.join(timeout=5)


# --- 2. the pid check only within one kernel and one pid namespace ---


@needs_namespaces
def test_a_live_driver_in_another_pid_namespace_of_this_host_is_not_declared_dead(run_dir, drivers):
    # Host networking: the same hostname, but the driver's pid (1 in its namespace) means another process here.
    holder = drivers(run_dir, "holder", "--beat", "0.05", namespace=True)
    holder.won()
    with pytest.raises(RunBusy, match=f"host {socket.gethostname()}, pid 1"):
        RunLease.acquire(run_dir)
    assert holder.read("lost") is None


@pytest.mark.parametrize("elsewhere", ["host", "boot_id", "pid_ns"])
def test_a_dead_driver_of_another_host_kernel_or_pid_namespace_whose_pid_lives_here_is_watched_for_one_ttl(
        run_dir, elsewhere):
    # Its pid and start time are this process's, but it ran on another host, before a reboot, or in another
    # container (pid namespace), and died: its pid says nothing here, only its heartbeat does.
    here = dict(host=socket.gethostname(), boot_id=this_boot_id(), pid_ns=this_pid_namespace())
    there = dict(host="other-host", boot_id=str(uuid.uuid4()), pid_ns=str(int(this_pid_namespace()) + 1))
    write_holder(run_dir, pid=os.getpid(), pid_started=this_process_started(), **{**here, elsewhere: there[elsewhere]})
    said: list[str] = []
    lease, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S, on_wait=said.append)
    with lease:
        assert lease.generation == 2 and took >= SHORT_TTL_S
    assert len(said) == 1 and "cannot be checked by its pid" in said[0]


@pytest.mark.parametrize("pid", ["alive", "dead"])
def test_a_lease_that_does_not_say_its_kernel_and_pid_namespace_is_not_judged_by_its_pid(run_dir, pid):
    # A lease of an older version: only the hostname, which containers with host networking share.
    alive = pid == "alive"
    write_holder(run_dir, host=socket.gethostname(), pid=os.getpid() if alive else dead_pid(),
                 pid_started=this_process_started() if alive else None)
    lease, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S)
    with lease:
        assert lease.generation == 2 and took >= SHORT_TTL_S


# --- 3. the fence checks the nonce as well as the generation ---


def test_of_two_holders_of_one_generation_only_the_one_the_claim_names_passes_the_fence(run_dir):
    ours = RunLease.acquire(run_dir)
    # An object store has no exclusive create: a second driver's claim of generation 1 landed after
    # ours had been read back, so both drivers think they won (and it wrote lease.json too).
    write_holder(run_dir, 1, host="other-host", pid=4242, nonce="theirs")
    fence(run_dir, 1, "theirs")
    with pytest.raises(LeaseLost, match="generation 1 now holds it \\(host other-host, pid 4242\\)"):
        fence(run_dir, 1, ours.holder.nonce)
    with pytest.raises(LeaseLost):
        ours.check()


# --- 4. an old holder's late write cannot roll a takeover back ---


def test_a_heartbeat_that_stalls_between_its_check_and_its_write_cannot_roll_a_takeover_back(run_dir, drivers):
    # On another host: taken over once its heartbeat stood still (on this host its live pid would refuse us).
    old = drivers(run_dir, "old", "--stalling", "--seen-as", "other-host", "--beat", "0.05")
    _, old_nonce = old.won()
    (old.out / "stall").touch()
    old.wait("stalled")  # its next heartbeat checked that it holds the run, and now hangs in its write
    new = RunLease.acquire(run_dir, ttl_s=SHORT_TTL_S, now=lambda: time.time() + 2 * LEASE_TTL_S)
    assert new.generation == 2
    (old.out / "stall").unlink()  # the old heartbeat's write lands after the takeover
    assert "generation 2 now holds it" in old.wait("lost")
    holder, _ = current_holder(run_dir)
    assert (holder.generation, holder.nonce) == (2, new.holder.nonce)
    new.check()
    fence(run_dir, 2, new.holder.nonce)
    with pytest.raises(LeaseLost, match="generation 2 now holds it"):
        fence(run_dir, 1, old_nonce)
    new.release()


# --- 5. the heartbeat reports a loss at once ---


def test_after_a_takeover_the_old_writer_is_fenced_off_and_its_heartbeat_reports_the_loss(run_dir, monkeypatch):
    with monkeypatch.context() as as_another_host:  # so that its pid, this process's, is not checked
        as_another_host.setattr(socket, "gethostname", lambda: "other-host")
        old = RunLease.acquire(run_dir)  # its heartbeat has not started: to others it stands still
    new, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S)
    assert new.generation == old.generation + 1 and took >= SHORT_TTL_S
    with pytest.raises(LeaseLost, match=f"generation {new.generation} now holds it"):
        fence(run_dir, old.generation, old.holder.nonce)
    fence(run_dir, new.generation, new.holder.nonce)
    reported: list[LeaseLost] = []

    def on_lost(exc: LeaseLost) -> None:
        reported.append(exc)
        old.release()  # what a driver's callback may well do: from the heartbeat's own thread

    old.start_heartbeat(0.05, on_lost=on_lost)
    wait_for(lambda: reported and not old._thread.is_alive(), timeout=5, interval=0.02)
    assert isinstance(reported[0], LeaseLost) and old.lost is reported[0]
    assert f"generation {new.generation} now holds it" in str(reported[0])
    with pytest.raises(LeaseLost):
        old.check()
    old.release()  # again: leaves the new holder's lease as it is
    holder, live = current_holder(run_dir)
    assert live and holder.nonce == new.holder.nonce and holder.released_at is None
    new.check()
    new.release()


def test_a_driver_that_was_stuck_learns_of_the_takeover_at_its_next_beat(run_dir, drivers):
    # On another host, where only its heartbeat tells (on this host its live pid refuses a takeover).
    stuck = drivers(run_dir, "stuck", "--seen-as", "other-host", "--beat", "0.05", "--on-lost")
    stuck.won()
    os.kill(stuck.proc.pid, signal.SIGSTOP)  # alive, but its heartbeat stands still
    try:
        new, took = timed_acquire(run_dir, ttl_s=SHORT_TTL_S)
    finally:
        os.kill(stuck.proc.pid, signal.SIGCONT)
    assert new.generation == 2 and took >= SHORT_TTL_S
    message = stuck.wait("on_lost", timeout=10)
    assert f"generation 2 now holds it (host {socket.gethostname()}, pid {os.getpid()})" in message
    new.release()
