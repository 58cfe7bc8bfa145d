"""A local run's first ranks (driver/local.py `first_spares`: spares under bootstrap.py --first,
started with the command's start-up environment before their attempt's is known) are the same
as ranks started afresh for a restart: real processes, started and handed their attempt as
local mode does (`_first_ranks` starts them as `first_spares` does, `_attempt` hands them the
environment the agent gives, with a script of the test's own in place of the worker session),
then judged as the agent judges them; a rank started afresh with that environment is the measure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from orchestrator.agent import flight_records
from orchestrator.agent.children import BOOTSTRAP, LocalRanks, Placement
from orchestrator.agent.echo import Echo
from orchestrator.agent.group import AgentGroup
from orchestrator.agent.launcher import RankSetting
from orchestrator.agent.session_ranks import COMMAND, Answers, SessionLauncher, cwd, session_env
from orchestrator.agent.spares import Spares
from orchestrator.rank.spare import SPARE_NICENESS
from orchestrator.spec import validate
from orchestrator.worker_config import LinkAddress, WorkerConfig

HUNG = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: torchrun's variables, from the handover
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
open(os.environ["READY"], "w").close()
time.sleep(300)  # HUNG_LINE
"""

# Lightning's rank as a user's code reads it before `fit` (a model's __init__), then a print and
# the end a killed rank meets (SIGKILL: no exit handler flushes what Python still buffers).
KILLED = """
import json, os, signal
from lightning.fabric.utilities import rank_zero as fabric
from lightning.pytorch.utilities.rank_zero import rank_zero_only
json.dump([rank_zero_only.rank, fabric.rank_zero_only.rank], open(os.environ["SEEN"], "w"))
print("the last line before the kill")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _from_a_users_shell(monkeypatch):
    """This process as a command a user's shell started (the test runner's may say PYTHONUNBUFFERED)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)


def _job(tmp_path, **env: str):
    return validate({"name": "first", "storage": str(tmp_path), "env": env,
                     "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1}}, read_only=True)


def _first_ranks(kind: str, job, script, ranks: int) -> Spares:
    """The first attempt's ranks as `first_spares` starts them (whatever the kind, the job's
    environment is the same), running `script`."""
    spares = Spares(kind, [str(script)], os.getcwd(), first=True)
    for local_rank in range(ranks):
        spares.start(local_rank, session_env(job, os.environ, ranks))
    return spares


def _attempt(tmp_path, job, script, spares: Spares | None, group_rank: int = 0, groups: int = 1) -> LocalRanks:
    """One attempt of one local rank with the environment the agent gives it (SessionLauncher), handed
    to `spares` (the first attempt's) or started afresh, as a restart starts it without a spare."""
    placement = Placement(group_rank, groups, 1, "127.0.0.1", _free_port(), 1, 0, "first")
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    link = LinkAddress(str(scratch / "link"), b"test")
    config = WorkerConfig(spec=job, run_uri=str(tmp_path / "first"), resume_uri=None, monitor=link, log_dir=None,
                          fence=None, storage_nonce=None)
    group = AgentGroup(group_rank, groups, "node", "127.0.0.1", 1, local=True)
    launcher = SessionLauncher(RankSetting(config, group, str(scratch), str(tmp_path / "logs"), Echo(lambda o: None)),
                               Answers(None, on_ray_train=False))
    try:
        env = launcher.env(placement, in_place=False)
    finally:
        launcher.close()
    return LocalRanks([str(script)], os.getcwd(), env, placement, str(scratch), str(tmp_path / "logs"),
                      spares=spares.take() if spares is not None else None)


def _until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.timeout(240)
def test_a_local_runs_first_rank_hung_in_its_first_attempt_gives_its_flight_record_then_its_stacks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HUNG)
    job = _job(tmp_path, READY=str(tmp_path / "ready"))
    spares = _first_ranks("torch", job, script, 1)
    ranks = _attempt(tmp_path, job, script, spares)
    try:
        child = ranks.children[0]
        assert _until(lambda: (tmp_path / "ready").exists() or child.process.poll() is not None, 180), \
            child.last_lines()
        assert child.process.poll() is None, child.last_lines()
        time.sleep(0.5)  # into its sleep
        # As the agent takes them at a hang verdict: the record first, then the stacks.
        records = flight_records.collect(ranks.children, ranks.log_dir, wait_s=30)
        assert child.process.poll() is None, f"the signal ended the rank ({child.process.returncode})"
        assert records.get(0, {}).get("default_pg", {}).get("op") == "gloo:all_reduce", (records, child.last_lines())
        assert (tmp_path / "logs" / "rank-0.flight-recorder.json").exists()
        where = ranks.dump_stacks(wait_s=30)
        line = HUNG.splitlines().index("time.sleep(300)  # HUNG_LINE") + 1
        assert where == {0: f"train.py:{line} in <module>"}, child.last_lines()
    finally:
        ranks.stop()
        spares.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("start", ["first", "restarted"])
def test_a_first_rank_prints_line_by_line_and_has_lightnings_rank_from_the_start_as_a_restarted_one(tmp_path, start):
    script = tmp_path / "model.py"
    script.write_text(KILLED)
    job = _job(tmp_path, SEEN=str(tmp_path / "seen.json"))
    spares = _first_ranks("lightning", job, script, 1) if start == "first" else None
    ranks = _attempt(tmp_path, job, script, spares, group_rank=1, groups=2)  # RANK 1 of 2
    try:
        child = ranks.children[0]
        assert child.process.wait(timeout=180) == -signal.SIGKILL, child.last_lines()
        child.reader.join(timeout=30)
        # rank-zero-only code before `fit` runs on rank 0 alone, as under torchrun; and what the rank
        # printed last is in its log.
        seen = json.loads((tmp_path / "seen.json").read_text())
        logged = "the last line before the kill" in (tmp_path / "logs" / "rank-1.log").read_text()
        assert (seen, logged) == ([1, 1], True)
    finally:
        ranks.stop()
        if spares is not None:
            spares.close()


@pytest.mark.timeout(60)
def test_a_spare_started_with_buffered_output_prints_line_by_line_once_its_attempts_environment_says_so(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text("\n".join(["import os, signal", *KILLED.splitlines()[-2:]]) + "\n")  # the print, the kill
    spare = subprocess.Popen([sys.executable, BOOTSTRAP, "--first", "", str(script)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, _ = spare.communicate(json.dumps({**os.environ, "PYTHONUNBUFFERED": "1"}) + "\n", timeout=50)
    assert spare.returncode == -signal.SIGKILL, output
    assert "the last line before the kill" in output


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup") as f:  # "/autogroup-123 nice 19"
            return int(f.read().split()[-1])
    except OSError:
        return None


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="this kernel has no scheduler autogroups")
@pytest.mark.skipif(os.geteuid() != 0 or os.getpriority(os.PRIO_PROCESS, 0) != 0,
                    reason="needs the privilege to take niceness 0 back (root), from niceness 0")
@pytest.mark.timeout(120)
def test_the_spares_a_local_run_starts_for_its_second_attempt_yield_as_a_session_too(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(120)\n")
    job = _job(tmp_path)
    spares = _first_ranks("torch", job, script, 1)
    ranks = _attempt(tmp_path, job, script, spares)
    try:
        # Its ranks beat themselves: the agent starts the next attempt's spares with the same object.
        assert spares.start_when_settled(ranks, 1, lambda rank: True)
        (second,) = spares.pids
        # As a next attempt's spare started by a Ray run's agent (tests/unit/rank/test_spare.py).
        assert _until(lambda: _session(second) == SPARE_NICENESS, 60), _session(second)
    finally:
        spares.close()
        ranks.stop()


def _blocked(pid: int) -> list[int]:
    """Each thread's blocked signals (SigBlk of /proc/PID/task/TID/status), as bit masks."""
    masks = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            masks += [int(line.split()[1], 16) for line in f if line.startswith("SigBlk:")]
    return masks


@pytest.mark.parametrize("first", [True, False], ids=["first", "next"])
def test_every_thread_of_a_session_ranks_spare_blocks_sigterm_and_the_flight_recorders_signal(tmp_path, first):
    """A process-directed signal goes to any thread that does not block it, and there takes its
    default action, the end of the process: a ctx or Lightning rank takes SIGTERM and the flight
    recorder's signal on threads of its own, so every thread, its own threads too, must block both
    from the start (the SIGTERM thread once started before the flight recorder's mask, and a hang
    verdict's signal ended every ctx and Lightning rank)."""
    spares = Spares("torch", COMMAND, cwd(), first=first)
    try:
        spares.start(0, session_env(_job(tmp_path), os.environ, 1))
        (pid,) = spares.pids
        deadline, masks = time.monotonic() + 60, []
        while time.monotonic() < deadline:  # the bootstrap's threads: SIGTERM's, the recorder's, the handover's
            masks = _blocked(pid)
            if len(masks) >= 3:
                break
            time.sleep(0.05)
        assert len(masks) >= 3, f"the spare started {len(masks)} thread(s) in 60 s"
        # A thread waiting in sigwait shows the signals it waits for unblocked (the kernel lifts
        # them for the wait): each signal may be open in one thread, its own, and in no other.
        for name, signum in (("SIGTERM", signal.SIGTERM), ("the flight recorder's", flight_records.FR_SIGNAL)):
            open_in = [hex(m) for m in masks if not m & (1 << (signum - 1))]
            assert len(open_in) <= 1, f"{name} signal is open in {len(open_in)} threads: {[hex(m) for m in masks]}"
    finally:
        spares.close()
