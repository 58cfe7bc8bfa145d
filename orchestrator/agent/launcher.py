"""What the agent (supervisor.py) needs of a kind of rank, as two interfaces, so that it never asks
which kind it runs (torchelastic's PContext in spirit):
- a `Launcher` starts each attempt's ranks (their command, directory and environment), looks after
  what they need beside them while they run, passes the run's stop on, and closes what it holds;
- a `Liveness` speaks for the ranks to the run monitor: their starts, a beat for each running one,
  its progress and its end, where the rank does not say them itself.

A torchrun script's ranks: rank_start.py `ScriptLauncher`, script_liveness.py `ScriptLiveness`;
a ctx or Lightning job's: session_ranks.py `SessionLauncher`, `SessionLiveness`. kinds.py `for_job`
picks them, the one place that asks the job's kind.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.agent.children import Child, LocalRanks, Placement, RankProgress
from orchestrator.agent.group import AgentGroup
from orchestrator.protocol import Beat, Event, Finished
from orchestrator.protocol import Progress as ProgressEvent
from orchestrator.worker_config import WorkerConfig


@dataclass(frozen=True)
class RankSetting:
    """What an agent's launcher and liveness share: its config and group, its scratch folder, the
    folder of its ranks' logs, and where rank 0's output goes (to the driver's console)."""

    config: WorkerConfig
    group: AgentGroup
    scratch: str
    log_dir: str
    echo: Callable[[str], None]
    hostname: str = field(default_factory=socket.gethostname)


class Launcher(ABC):
    """Starts each attempt's ranks, and holds what they need beside them."""

    @abstractmethod
    def start(self, placement: Placement, in_place: bool, latest_uri: str | None) -> LocalRanks:
        """This node's ranks of the attempt at `placement`, started (`in_place`: a restart on the
        same agents; `latest_uri`: the newest checkpoint committed in the run, or None)."""

    def look(self, ranks: LocalRanks, attempt: int) -> set[int] | None:
        """Called at each look at the running ranks. The processes besides the ranks' sessions
        that the sweeper must now end with them, when they changed; else None."""
        return None

    @abstractmethod
    def pass_on_stop(self, ranks: LocalRanks) -> bool:
        """The run is asked to stop: tell the ranks as this kind is told. True when the agent now
        waits for every rank to end (the attempt's end is then a stop, not a failure)."""

    @property
    def kept(self) -> set[int]:
        """Sessions of processes this launcher keeps for a later attempt: not the ranks' orphans."""
        return set()

    def close(self) -> None:
        """Nothing it holds outlives the agent."""
        return None


class Liveness(ABC):
    """Speaks for the running ranks to the run monitor, where they do not speak themselves."""

    def new_attempt(self) -> None:
        """A new attempt's ranks started: what was measured of the last is forgotten."""
        return None

    def started(self, ranks: LocalRanks, placement: Placement, in_place: bool) -> list[Event]:
        """The events that announce the attempt's ranks (none for ranks that announce themselves)."""
        return []

    def look(self, ranks: LocalRanks) -> None:
        """Before each round of beats: what they are measured from."""
        return None

    @abstractmethod
    def beat(self, child: Child, progress: RankProgress, now: float) -> Beat | None:
        """The beat for a running, not stopped, child (None: it beats itself, or nothing is sent)."""

    @abstractmethod
    def finished_step(self, child: Child, progress: RankProgress) -> int:
        """The step a finished child's beat says."""

    def told_to_end(self, ranks: LocalRanks) -> bool:
        """Whether a rank ended because its own heartbeat was told to (the run monitor ended the ranks)."""
        return False

    def progress(self, ranks: LocalRanks, attempt: int, now: float) -> ProgressEvent | None:
        """Rank 0's progress, for the driver, when due (None: not due, or rank 0 reports its own)."""
        return None

    def finished(self, ranks: LocalRanks, attempt: int, stopped: bool) -> Finished | None:
        """Rank 0's end, for the driver (None: rank 0 reported its own)."""
        return None

