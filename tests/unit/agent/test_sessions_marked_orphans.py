"""What a rank starts outside its session (a daemon that called setsid) is found by its agent's mark,
which every rank's process inherits (agent/sessions.py `mark`), and ended with the ranks:
by the sweeper when the agent itself is SIGKILLed, and by an agent that is a subreaper (the Ray
path), which also reaps it and leaves its own other children alone. Processes are counted by the
pids the rank wrote, never by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, wait_for
from orchestrator.processes import is_alive

pytestmark = pytest.mark.timeout(120)

# A rank that starts a daemon in a session of its own, writes its pid and the daemon's, and waits.
DAEMON_RANK = textwrap.dedent("""
    import json, os, subprocess, sys, time
    daemon = subprocess.Popen(["sleep", "600"], start_new_session=True)
    out = os.path.join(sys.argv[1], "pids.json")
    with open(out + ".partial", "w") as f:
        json.dump({"rank": os.getpid(), "daemon": daemon.pid}, f)
    os.replace(out + ".partial", out)
    time.sleep(600)
""")

# An agent in a process of its own, with one such rank (and its sweeper, or as a subreaper).
AGENT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    sys.path.insert(0, {repo!r})
    from orchestrator.agent import sessions
    from orchestrator.agent.children import LocalRanks, Placement, Sweeper
    folder, how = sys.argv[1], sys.argv[2]
    scratch = os.path.join(folder, "scratch")
    os.makedirs(scratch)
    if how == "subreaper":
        sessions.prctl(sessions.PR_SET_CHILD_SUBREAPER, 1)
        own = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL)  # without the mark
    sweeper = Sweeper(scratch) if how == "sweeper" else None
    ranks = LocalRanks([os.path.join(folder, "train.py"), folder], cwd=folder, base_env=dict(os.environ),
                       placement=Placement(0, 1, 1, "127.0.0.1", 29500, 1, 0, "marked"), scratch=scratch,
                       log_dir=os.path.join(folder, "logs"))
    if sweeper:
        sweeper.track(ranks.sessions)
    while not os.path.exists(os.path.join(folder, "pids.json")):
        time.sleep(0.05)
    if how == "sweeper":
        time.sleep(600)
    daemon = json.load(open(os.path.join(folder, "pids.json")))["daemon"]
    ranks.stop()  # the rank's session ends; its daemon, in a session of its own, is orphaned to this process
    adopted = int(open(f"/proc/{{daemon}}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    ended = sessions.end_marked(sessions.mark(scratch), set(), reap=True)
    left = os.path.exists(f"/proc/{{daemon}}")
    print(json.dumps({{"adopted": adopted, "ended": ended, "daemon": daemon, "left": left,
                      "own_running": own.poll() is None}}), flush=True)
    own.kill()
    own.wait()
""")


def _start(tmp_path, how: str) -> subprocess.Popen:
    (tmp_path / "train.py").write_text(DAEMON_RANK)
    (tmp_path / "agent.py").write_text(AGENT.format(repo=REPO))
    return subprocess.Popen([sys.executable, str(tmp_path / "agent.py"), str(tmp_path), how], stdout=subprocess.PIPE,
                            text=True)


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_when_the_agent_is_sigkilled_the_sweeper_ends_a_daemon_its_rank_started_outside_its_session(tmp_path):
    agent = _start(tmp_path, "sweeper")
    pids: dict[str, int] = {}
    try:
        wait_for(lambda: (tmp_path / "pids.json").exists(), timeout=60)
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert is_alive(pids["daemon"])
        agent.kill()
        agent.wait()
        wait_for(lambda: not is_alive(pids["rank"]), timeout=10)  # PR_SET_PDEATHSIG
        wait_for(lambda: not is_alive(pids["daemon"]), timeout=15)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        _kill(pids.values())


def test_an_agent_that_is_a_subreaper_ends_and_reaps_its_ranks_daemon_and_leaves_its_own_child_running(tmp_path):
    agent = _start(tmp_path, "subreaper")
    try:
        out, _ = agent.communicate(timeout=90)
        assert agent.returncode == 0, out
        seen = json.loads(out.splitlines()[-1])
        assert seen["adopted"], seen  # the orphan was this agent's to end and reap
        assert seen["ended"] == [seen["daemon"]], seen
        assert not seen["left"], f"the ended daemon is still listed (a zombie not reaped): {seen}"
        assert seen["own_running"], seen
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if (tmp_path / "pids.json").exists():
            _kill(json.loads((tmp_path / "pids.json").read_text()).values())
