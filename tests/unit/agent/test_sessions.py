"""Nothing a torchrun script's rank starts outlives it (no Ray): a rank is ended with every process
of its session, one that ignores SIGTERM is SIGKILLed, a rank dies with its agent, and the
sweeper ends every rank's helpers when the agent itself is SIGKILLed. Processes are counted by
the pids the script wrote, never by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO, wait_for

from orchestrator.agent.children import TERM_GRACE_S, LocalRanks, Placement
from orchestrator.processes import is_alive

pytestmark = pytest.mark.timeout(120)

# A rank that starts a `sleep` and a fork Pool worker, writes their pids (and its own), and waits.
HELPERS = textwrap.dedent("""
    import json, multiprocessing, os, signal, subprocess, sys, time
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleeper = subprocess.Popen(["sleep", "600"])
    pool = multiprocessing.get_context("fork").Pool(1)
    worker = pool.apply(os.getpid)
    out = os.path.join(sys.argv[1], f"pids-{os.environ['RANK']}.json")
    with open(out + ".partial", "w") as f:
        json.dump({"rank": os.getpid(), "helpers": [sleeper.pid, worker]}, f)
    os.replace(out + ".partial", out)
    time.sleep(600)
""")


def _placement(k: int) -> Placement:
    return Placement(group_rank=0, group_world_size=1, local_world_size=k, master_addr="127.0.0.1",
                     master_port=29500, attempt=1, max_restarts=0, run_id="helpers")


def _pids(folder, k: int) -> list[dict]:
    wait_for(lambda: all(os.path.exists(os.path.join(folder, f"pids-{r}.json")) for r in range(k)), timeout=60)
    return [json.load(open(os.path.join(folder, f"pids-{r}.json"))) for r in range(k)]


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_rank_is_ended_with_every_process_it_started_even_after_it_died_itself(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HELPERS)
    ranks = LocalRanks([str(script), str(tmp_path)], cwd=str(tmp_path), base_env=dict(os.environ),
                       placement=_placement(2), scratch=str(tmp_path / "scratch"), log_dir=str(tmp_path / "logs"))
    helpers: list[int] = []
    try:
        seen = _pids(tmp_path, 2)
        helpers = [pid for s in seen for pid in s["helpers"]]
        os.kill(seen[1]["rank"], signal.SIGKILL)  # rank 1 dies: its helpers are orphaned, still running
        wait_for(lambda: ranks.children[1].process.poll() is not None, timeout=10)
        assert is_alive(seen[1]["helpers"][0])  # its `sleep` (a Pool worker notices its parent's end itself)
        ranks.stop()
        assert [pid for pid in helpers if is_alive(pid)] == []
        assert all(c.process.returncode is not None for c in ranks.children)
    finally:
        ranks.stop()  # first: a Pool whose worker is killed starts another
        _kill_all(helpers)


def test_a_rank_that_ignores_sigterm_is_sigkilled_after_the_grace(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HELPERS)
    ranks = LocalRanks([str(script), str(tmp_path)], cwd=str(tmp_path), base_env={**os.environ, "IGNORE_TERM": "1"},
                       placement=_placement(1), scratch=str(tmp_path / "scratch"), log_dir=str(tmp_path / "logs"))
    seen = [{"rank": ranks.children[0].process.pid, "helpers": []}]
    try:
        seen = _pids(tmp_path, 1)
        started = time.monotonic()
        ranks.stop()
        took = time.monotonic() - started
        assert ranks.children[0].process.returncode == -signal.SIGKILL
        assert TERM_GRACE_S <= took < TERM_GRACE_S + 20
        # SIGKILL is sent; on a loaded machine a process may take a moment to be scheduled and die.
        wait_for(lambda: not is_alive(seen[0]["rank"]) and not any(is_alive(pid) for pid in seen[0]["helpers"]),
                 timeout=10)
    finally:
        ranks.stop()
        _kill_all([seen[0]["rank"], *seen[0]["helpers"]])


# An agent in a process of its own: its ranks (and, with the sweeper, their helpers) must go with it.
AGENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from orchestrator.agent.children import LocalRanks, Placement, Sweeper
    folder, with_sweeper = sys.argv[1], sys.argv[2] == "sweeper"
    placement = Placement(0, 1, 2, "127.0.0.1", 29500, 1, 0, "agent")
    sweeper = Sweeper(folder) if with_sweeper else None
    ranks = LocalRanks([os.path.join(folder, "train.py"), folder], cwd=folder, base_env=dict(os.environ),
                       placement=placement, scratch=os.path.join(folder, "scratch"), log_dir=os.path.join(folder, "logs"))
    if sweeper:
        sweeper.track(ranks.sessions)
    print("up", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("with_sweeper", [True, False], ids=["sweeper", "ranks-alone"])
def test_when_the_agent_is_sigkilled_its_ranks_die_with_it_and_the_sweeper_ends_their_helpers(tmp_path, with_sweeper):
    (tmp_path / "train.py").write_text(HELPERS)
    (tmp_path / "agent.py").write_text(AGENT.format(repo=REPO))
    agent = subprocess.Popen([sys.executable, str(tmp_path / "agent.py"), str(tmp_path),
                              "sweeper" if with_sweeper else "none"], stdout=subprocess.PIPE, text=True)
    ranks: list[int] = []
    helpers: list[int] = []
    try:
        seen = _pids(tmp_path, 2)
        ranks = [s["rank"] for s in seen]
        helpers = [pid for s in seen for pid in s["helpers"]]
        agent.kill()
        agent.wait()
        # PR_SET_PDEATHSIG: each rank is SIGKILLed the moment its agent dies.
        wait_for(lambda: not any(is_alive(pid) for pid in ranks), timeout=10)
        if with_sweeper:
            wait_for(lambda: not any(is_alive(pid) for pid in helpers), timeout=15)
        else:  # without it, what the ranks started is orphaned and runs on: the sweeper's reason to be
            time.sleep(1)
            assert all(is_alive(s["helpers"][0]) for s in seen)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        _kill_all(ranks)  # first: a Pool whose worker is killed starts another
        _kill_all(helpers)
