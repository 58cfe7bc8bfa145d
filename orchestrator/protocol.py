"""What the ranks, the node agents, the run monitor and the driver tell each other, typed.

Every message is a dataclass: a rank's or an agent's heartbeat (`Beat`) and the monitor's reply
(`BeatReply`); the start of an attempt (`AttemptBegun`); and the events the driver turns into its
console lines, summary.json, goodput and metrics. Events are sent with `RunMonitor.push(event)`,
which stamps `time` on the monitor's clock, and come back as the same objects.

One word for one start of the ranks: an **attempt**. The first start of a run is attempt 1; every
restart, in place or of the whole group, is the next one (`TORCHELASTIC_RESTART_COUNT` is
`attempt - 1` for a script's ranks, `ORCHESTRATOR_ATTEMPT` is `attempt` for every rank).

Nothing here imports torch or Ray: the driver, the monitor actor and the ranks all read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchestrator.failures import lost_peer


@dataclass(kw_only=True)
class Event:
    """An event for the driver. `kind` names it in summary.json and in `to_record()`."""

    kind: ClassVar[str] = ""
    # When the run monitor received it (seconds since the epoch, the monitor's clock).
    time: float = 0.0

    def to_record(self) -> dict[str, Any]:
        """The event as plain JSON-able data, `kind` first (summary.json's `failures`)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(kw_only=True)
class RankStarted(Event):
    """One rank of an attempt is up (and loaded the checkpoint it resumes from, if any)."""

    kind: ClassVar[str] = "rank_started"
    rank: int
    world_size: int
    attempt: int
    node_id: str = ""
    hostname: str = ""
    pid: int = 0
    restored_from: str | None = None
    restored_step: int | None = None
    # Restarted by its node's agent in the same Ray Train worker (no new placement).
    in_place: bool = False


@dataclass(kw_only=True)
class _AtStep(Event):
    """Where rank 0's training stands: what Progress and Finished both say."""

    attempt: int
    step: int
    epoch: int = 0
    batch_in_epoch: int = 0
    consumed: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    # The median time between rank 0's optimizer steps (a script's, timed by its bootstrap).
    step_time_s: float | None = None


@dataclass(kw_only=True)
class Progress(_AtStep):
    """Rank 0's progress, every couple of seconds and at the attempt's first optimizer step."""

    kind: ClassVar[str] = "progress"
    samples_per_s: float | None = None
    first_step: bool = False
    # Seconds the training loop has spent blocked in saves during this attempt.
    stall_s: float = 0.0
    # A torchrun script's: only its step count is known.
    script: bool = False


@dataclass(kw_only=True)
class CheckpointCommitted(Event):
    kind: ClassVar[str] = "checkpoint"
    uri: str
    step: int
    name: str = ""
    reason: str = ""


@dataclass(kw_only=True)
class RunWarning(Event):
    """A statement for the driver's output, said once per run however many attempts repeat it."""

    kind: ClassVar[str] = "warning"
    message: str


@dataclass(kw_only=True)
class Straggler(Event):
    """A rank whose own work a step stayed well above its peers' (monitor/stragglers.py)."""

    kind: ClassVar[str] = "straggler"
    rank: int
    attempt: int
    node_id: str = ""
    host: str = ""
    pid: int = 0
    # The median seconds of its own work a step, its peers' median of theirs, and the ratio.
    work_s: float
    peers_median_s: float
    ratio: float
    message: str


@dataclass(kw_only=True)
class ResumeFallback(Event):
    """The checkpoint wanted was verified unreadable: the attempt resumes from an older one."""

    kind: ClassVar[str] = "resume_fallback"
    wanted: str
    cause: str
    uri: str | None


@dataclass(kw_only=True)
class Preemption(Event):
    kind: ClassVar[str] = "preemption"
    step: int
    nodes: list[str]
    seconds_left: str


@dataclass(kw_only=True)
class Stacks(Event):
    """Where each hung rank was when the hang was found (its whole stacks are in its log); every
    agent sends one on a hang verdict, empty or not, so the monitor knows when all have."""

    kind: ClassVar[str] = "stacks"
    attempt: int
    ranks: dict[str, str]
    # Each answering rank's last collective per process group, from its flight recorder
    # (agent/flight_records.py): rank -> {group: {seq, op, state, sizes}}.
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(kw_only=True)
class HangCollectives(Event):
    """The ranks whose last collective differs from their peers' at a hang (monitor/collectives.py)."""

    kind: ClassVar[str] = "hang_collectives"
    attempt: int
    ranks: list[int]
    message: str


@dataclass(kw_only=True)
class RestartInPlace(Event):
    """The run monitor restarts every rank in place: `attempt` is the one that starts now."""

    kind: ClassVar[str] = "restart_in_place"
    attempt: int
    restarts: int
    max_restarts: int
    # The rank whose failure decided it: rank, kind, error, where, node_id...
    failure: dict[str, Any]


@dataclass(kw_only=True)
class Hang(Event):
    """The hang watchdog's verdict on an attempt (monitor/watchdog.py): which ranks, and why."""

    kind: ClassVar[str] = "hang"
    attempt: int
    # "stopped answering", "made no progress", "stayed in the checkpoint phase"...
    what: str
    ranks: list[int]
    nodes: list[str]
    message: str


@dataclass(kw_only=True)
class Failure(Event):
    """A failure of the whole group, classified on Ray Train's controller (monitor/classifier.py)."""

    kind: ClassVar[str] = "failure"
    classification: str
    # Each failed rank's FailureRecord, as data.
    ranks: list[dict[str, Any]]
    hang: dict[str, Any] | None = None
    exhausted: bool | str | None = None


@dataclass(kw_only=True)
class StopRequested(Event):
    kind: ClassVar[str] = "stop_requested"
    deadline: float


@dataclass(kw_only=True)
class Finished(_AtStep):
    """Rank 0: training is over and every checkpoint is committed (or the run stopped, `stopped`)."""

    kind: ClassVar[str] = "finished"
    weights_sha256: str | None = None
    final_checkpoint: str | None = None
    checkpoint_stall_s: float = 0.0
    final_flush_s: float = 0.0
    stopped: bool = False


@dataclass(kw_only=True)
class Output:
    """Lines rank 0 printed, for the driver's console: buffered apart, never kept as an event."""

    rank: int
    lines: list[str]


# --- heartbeats ---------------------------------------------------------------------------------

@dataclass
class Beat:
    """A rank's heartbeat, about once a second (sent by its own thread, or by its agent)."""

    rank: int
    step: int
    phase: str
    # Seconds, on the worker's own clock, since its last step or the start of its phase.
    idle_s: float
    node_id: str = ""
    pid: int = 0
    # Where the training thread is (file:line in function), for the hang message.
    frame: str = ""
    # A script's rank: seconds since its Python stack last moved, and since it last showed any
    # sign of life (a step, its stack, its CPU time). None for the ctx and Lightning paths.
    stack_idle_s: float | None = None
    active_idle_s: float | None = None
    # The median seconds of the rank's own work in a step (its bootstrap's _StepWork): what tells
    # a slow rank from its peers, who wait for it in the next collective (monitor/stragglers.py).
    work_s: float | None = None
    # When the monitor received it (the monitor's clock).
    received: float = 0.0


@dataclass(frozen=True)
class BeatReply:
    """The monitor's answer to a beat: end this rank now (a hang, a lost lease, a stop's grace
    run out), or the driver asked the run to stop (the next step saves and ends)."""

    abort: str | None = None
    stop: bool = False


@dataclass(frozen=True)
class AttemptBegun:
    """The monitor's answer to the start of an attempt: its number, and the newest checkpoint
    committed during this run (None: none yet; the driver's choice then holds)."""

    attempt: int
    latest_uri: str | None = None


# --- the verdict on an attempt whose ranks restart in place (monitor/attempts.py) --------------------

WAIT, RESTART, FAIL, FINISH, STOPPED = "wait", "restart", "fail", "finish", "stopped"


@dataclass(frozen=True)
class Verdict:
    """What every node's agent does with its ranks once an attempt is decided: go on waiting,
    restart them in place as `attempt`, fail the run, or finish (every rank exited 0). STOPPED is
    the agent's own: the driver's stop reached every rank and they exited."""

    action: str
    # The rank failure that decided it (its record: rank, kind, error, where, node_id...).
    failure: dict[str, Any] | None = None
    # RESTART: the attempt that starts now, and the restarts so far with it.
    attempt: int = 0
    restarts: int = 0
    # FAIL: the restarts failure.max_failures allows were used up.
    exhausted: bool = False
    # FAIL without a failure: why (an agent of a group that Ray Train replaced).
    reason: str = ""


def cause_order(failure: dict[str, Any]) -> tuple[bool, bool, bool, int]:
    """Which of an attempt's rank failures is its cause, least first: a signal death or a hang
    (decisive), then a rank that exited on its own (sys.exit), whose peers' communication errors
    follow from it, then an error that does not say a peer went away (its peers' do), then the
    lowest rank."""
    return (not failure.get("decisive"), failure.get("kind") != "exit", lost_peer(failure.get("error", "")),
            failure["rank"])
