"""The agent's decisions (agent/supervisor.py), with a fake launcher and a fake liveness (launcher.py's
interfaces: each attempt's ranks are real processes of the bootstrap running the test's code, their
beats what the test says) and everything else real: the run monitor in this process, as local mode
has it, its restart budget and hang watchdog, the children, their sessions, the sweeper.

A rank that exits non-zero is restarted in place within the budget; the budget used up, or a
user's error, ends the run; a rank its liveness reports frozen, or a stopped one (SIGSTOP: no beat
is sent for it), is ended with its stacks; a stop is
passed on to the ranks and their ends are a stop; the monitor's abort ends the ranks and the agent."""

from __future__ import annotations

import gc
import os
import time

import pytest

from orchestrator import handles, processes
from orchestrator.agent.children import Child, LocalRanks, Placement, RankProgress
from orchestrator.agent.group import AgentEnded, AgentGroup
from orchestrator.agent.launcher import Launcher, Liveness, RankSetting
from orchestrator.agent.supervisor import Supervisor
from orchestrator.driver import local
from orchestrator.failures import USER, WorkerFailure
from orchestrator.protocol import Beat, Finished, RestartInPlace, Stacks
from orchestrator.rank.heartbeat import TRAINING
from orchestrator.spec import validate
from orchestrator.worker_config import WorkerConfig

RANKS = 2
EXIT_0 = "pass"
RANK_1_EXITS_3 = "import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)"
RANK_1_RAISES = "import os\nif os.environ['RANK'] == '1':\n    raise ValueError('a bug of the user')"
SLEEPS = "import time\ntime.sleep(600)"
STOPS_ITSELF_ON_RANK_1 = "import os, signal, time\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGSTOP)\ntime.sleep(600)"
SAVES_AT_SIGTERM = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(600)"


@pytest.fixture(autouse=True)
def _collected():
    """An agent and its ranks' pipes, held in reference cycles, collected before the next test
    (which may count this process's threads and open files)."""
    yield
    gc.collect()


class FakeLauncher(Launcher):
    """Starts attempt N's ranks running `codes[N-1]` (the last code for later attempts)."""

    def __init__(self, setting: RankSetting, codes: list[str]):
        self.setting, self.codes = setting, codes
        self.starts: list[tuple[int, bool]] = []
        self.pids: list[int] = []
        self.stops = self.closed = 0

    def start(self, placement: Placement, in_place: bool, latest_uri: str | None) -> LocalRanks:
        script = os.path.join(self.setting.scratch, f"attempt-{placement.attempt}.py")
        with open(script, "w") as f:
            f.write(self.codes[min(placement.attempt, len(self.codes)) - 1])
        ranks = LocalRanks([script], os.getcwd(), dict(os.environ), placement, self.setting.scratch,
                           self.setting.log_dir, echo=self.setting.echo)
        self.starts.append((placement.attempt, in_place))
        self.pids += [c.process.pid for c in ranks.children]
        return ranks

    def pass_on_stop(self, ranks: LocalRanks) -> bool:
        import signal

        self.stops += 1
        ranks.forward(signal.SIGTERM)
        return True

    def close(self) -> None:
        self.closed += 1


class FakeLiveness(Liveness):
    """Beats for every running rank: training, idle for as long as `idle[(attempt, rank)]` says (else 0)."""

    def __init__(self, setting: RankSetting, idle: dict[tuple[int, int], float]):
        self.node_id, self.idle, self.attempt = setting.group.node_id, idle, 0

    def new_attempt(self) -> None:
        self.attempt += 1

    def beat(self, child: Child, progress: RankProgress, now: float) -> Beat:
        return Beat(rank=child.rank, step=1, phase=TRAINING, idle_s=self.idle.get((self.attempt, child.rank), 0.0),
                    node_id=self.node_id, pid=child.process.pid)

    def finished_step(self, child: Child, progress: RankProgress) -> int:
        return 1

    def finished(self, ranks: LocalRanks, attempt: int, stopped: bool) -> Finished:
        return Finished(attempt=attempt, stopped=stopped, step=1)


class Agent:
    """A local agent of RANKS ranks under the fakes, and the run monitor it reports to."""

    def __init__(self, tmp_path, codes: list[str], max_failures: int = 3,
                 idle: dict[tuple[int, int], float] | None = None):
        job = validate({"name": "decisions", "storage": str(tmp_path), "script": {"path": "train.py"},
                        "failure": {"max_failures": max_failures, "hang_timeout_s": 5}}, check_imports=False)
        self.monitor = local.start_monitor(job)
        config = WorkerConfig(spec=job, run_uri=str(tmp_path / "decisions"), resume_uri=None, monitor=self.monitor,
                              log_dir=str(tmp_path / "logs"), fence=None, storage_nonce=None, niceness=os.nice(0))

        def kind(setting: RankSetting):
            self.launcher = FakeLauncher(setting, codes)
            return self.launcher, FakeLiveness(setting, idle or {})

        self.supervisor = Supervisor(config, AgentGroup.on_this_machine(RANKS), kind)

    def events(self, kind) -> list:
        return [e for e in handles.get(self.monitor.events_since.remote(0)) if isinstance(e, kind)]

    def left(self) -> list[int]:
        """The ranks' processes still alive."""
        return [pid for pid in self.launcher.pids if processes.is_alive(pid)]


@pytest.mark.timeout(120)
def test_a_rank_that_exits_non_zero_is_restarted_in_place_within_the_budget(tmp_path):
    agent = Agent(tmp_path, [RANK_1_EXITS_3, EXIT_0], max_failures=1)
    agent.supervisor.run()
    assert agent.launcher.starts == [(1, False), (2, True)]
    (restart,) = agent.events(RestartInPlace)
    assert restart.attempt == 2 and restart.failure.rank == 1
    assert [(e.attempt, e.stopped) for e in agent.events(Finished)] == [(2, False)]
    assert agent.left() == [] and agent.launcher.closed >= 1


@pytest.mark.timeout(120)
def test_the_restart_budget_used_up_ends_the_run_with_the_ranks_failure(tmp_path):
    agent = Agent(tmp_path, [RANK_1_EXITS_3], max_failures=1)
    with pytest.raises(WorkerFailure, match=r"^rank 1: "):
        agent.supervisor.run()
    assert agent.launcher.starts == [(1, False), (2, True)]
    assert agent.events(Finished) == [] and agent.left() == []


@pytest.mark.timeout(120)
def test_a_users_error_ends_the_run_at_once_though_the_budget_allows_a_restart(tmp_path):
    agent = Agent(tmp_path, [RANK_1_RAISES, EXIT_0], max_failures=3)
    with pytest.raises(WorkerFailure) as failed:
        agent.supervisor.run()
    assert failed.value.record.kind == USER and "a bug of the user" in str(failed.value)
    assert agent.launcher.starts == [(1, False)] and agent.left() == []


@pytest.mark.timeout(120)
def test_a_rank_its_liveness_reports_frozen_is_ended_with_its_stacks_and_the_ranks_restarted(tmp_path):
    agent = Agent(tmp_path, [SLEEPS, EXIT_0], idle={(1, 1): 1000.0})
    agent.supervisor.run()
    assert agent.launcher.starts == [(1, False), (2, True)]
    (restart,) = agent.events(RestartInPlace)
    assert restart.failure.kind == "hang" and restart.failure.rank == 1
    (stacks,) = agent.events(Stacks)
    assert stacks.attempt == 1 and set(stacks.collectives) == {"0", "1"}  # every rank asked, before its dump
    assert agent.left() == []


@pytest.mark.timeout(120)
def test_a_stopped_rank_gets_no_beat_and_is_ended_as_frozen_while_its_peer_beats(tmp_path):
    agent = Agent(tmp_path, [STOPS_ITSELF_ON_RANK_1, EXIT_0])
    agent.supervisor.run()
    (restart,) = agent.events(RestartInPlace)
    assert restart.failure.kind == "hang" and restart.failure.rank == 1
    assert "stopped answering" in restart.failure.error
    assert agent.launcher.starts == [(1, False), (2, True)] and agent.left() == []


@pytest.mark.timeout(120)
def test_a_stop_is_passed_on_to_the_ranks_and_their_ends_are_a_stop(tmp_path):
    agent = Agent(tmp_path, [SAVES_AT_SIGTERM])
    agent.monitor.request_stop.remote(time.time() + 60)
    agent.supervisor.run()
    assert agent.launcher.stops == 1 and agent.launcher.starts == [(1, False)]
    assert [(e.attempt, e.stopped) for e in agent.events(Finished)] == [(1, True)]
    assert agent.left() == []


@pytest.mark.timeout(120)
def test_the_monitors_abort_ends_the_ranks_and_the_local_agent(tmp_path):
    agent = Agent(tmp_path, [SLEEPS])
    agent.monitor.abort.remote("the run was stopped and its grace period ran out")
    with pytest.raises(AgentEnded, match="grace period ran out"):
        agent.supervisor.run()
    assert agent.launcher.starts == [(1, False)] and agent.launcher.closed >= 1
    assert agent.left() == []
