"""What the ranks, the node agents, the run monitor and the driver tell each other, typed.

Every message is a dataclass: a rank's or an agent's heartbeat (`Beat`) and the monitor's reply
(`BeatReply`); the start of an attempt (`AttemptBegun`); the monitor's other answers (the attempt's
state, its `Verdict`, the view Ray Train's controller classifies by, the stragglers); and the
events the driver turns into its console lines, summary.json, goodput and metrics. Events are sent
with `RunMonitor.push(event)`, which stamps `time` on the monitor's clock, and come back as the same
objects. A rank's failure is one type everywhere, failures.FailureRecord; phases and actions, as
failure kinds, are str-valued enums: JSON and logs read their plain values.

One word for one start of the ranks: an **attempt**. The first start of a run is attempt 1; every
restart, in place or of the whole group, is the next one (`TORCHELASTIC_RESTART_COUNT` is
`attempt - 1` for a script's ranks, `ORCHESTRATOR_ATTEMPT` is `attempt` for every rank).

Nothing here imports torch or Ray: the driver, the monitor actor and the ranks all read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchestrator.failures import EXIT, FailureKind, FailureRecord, StrEnum, lost_peer


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
    # The rank failure that decided it.
    failure: FailureRecord

    def to_record(self) -> dict[str, Any]:
        return {**super().to_record(), "failure": self.failure.to_dict()}


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
    classification: FailureKind
    # Each failed rank's record.
    ranks: list[FailureRecord]
    hang: dict[str, Any] | None = None
    exhausted: bool | str | None = None

    def to_record(self) -> dict[str, Any]:
        """As summary.json lists it: each rank's record in its summary form (FailureRecord.to_dict)."""
        return {**super().to_record(), "ranks": [r.to_dict(summary=True) for r in self.ranks]}


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

class Phase(StrEnum):
    """What a rank's training thread does (a beat's phase). TRAINING is timed by
    failure.hang_timeout_s; STARTING (up to the group's first optimizer step), CHECKPOINT and
    FINISHING have limits of their own; the rest are not timed (monitor/watchdog.py)."""

    STARTING = "starting"
    TRAINING = "training"
    CHECKPOINT = "checkpoint"
    VALIDATION = "validation"
    EPOCH_END = "epoch_end"
    FINISHING = "finishing"
    # A torchrun script's rank says only this much (the watchdog judges it by its liveness): it
    # has taken no optimizer step yet, or it exited 0.
    WORKING = "working"
    FINISHED = "finished"


@dataclass
class Beat:
    """A rank's heartbeat, about once a second (sent by its own thread, or by its agent)."""

    rank: int
    step: int
    phase: Phase
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


@dataclass(frozen=True)
class PreemptionNotice:
    """Ray Train's notice that nodes of the group are about to be preempted, as an agent answers
    its ranks' question (None: no notice)."""

    deadline_ms: int | None
    preempted_node_ids: list[str] = field(default_factory=list)


# --- the run monitor's answers ----------------------------------------------------------------------

@dataclass(frozen=True)
class AttemptState:
    """The attempt starting now, the restarts so far and allowed (failure.max_failures, -1:
    unlimited), and the newest checkpoint committed in this run (a ctx job's rank 0 resumes from it)."""

    attempt: int
    restarts: int
    max_restarts: int
    latest_uri: str | None = None


@dataclass(frozen=True)
class RankPlace:
    """Where a rank of the current attempt ran (its RankStarted)."""

    node_id: str = ""
    pid: int = 0
    hostname: str = ""


@dataclass(frozen=True)
class FailureContext:
    """What Ray Train's controller needs from the run monitor to classify a failure of the current
    group (monitor/classifier.py)."""

    # The driver is stopping the run: a failure now is no reason to start again.
    stopping: bool = False
    # rank -> where it ran.
    places: dict[int, RankPlace] = field(default_factory=dict)
    # Another driver took the run over: why (LeaseLost's text).
    taken_over: str | None = None
    # The restarts failure.max_failures allows are used up: the sentence that says so.
    restarts_exhausted: str | None = None
    # The earlier failures' records of errors a retry could get past (an error back at the same
    # step is the data's).
    earlier: list[FailureRecord] = field(default_factory=list)


@dataclass(frozen=True)
class SlowestRank:
    """The slowest training rank now, against its peers' median (monitor/stragglers.py)."""

    rank: int
    node_id: str
    host: str
    work_s: float
    peers_median_s: float
    ratio: float | None


@dataclass(frozen=True)
class StragglerTotals:
    """The seconds the group waited for its slowest rank (goodput), and the slowest rank now
    (summary.json's slowest_rank; None with fewer than two)."""

    wait_s: float
    slowest: SlowestRank | None


# --- the verdict on an attempt whose ranks restart in place (monitor/attempts.py) --------------------

class Action(StrEnum):
    """What every node's agent does with its ranks once an attempt is decided: go on waiting,
    restart them in place, fail the run, or finish (every rank exited 0). STOP is the agent's own:
    the driver's stop reached every rank and they exited."""

    WAIT = "wait"
    RESTART = "restart"
    FAIL = "fail"
    FINISH = "finish"
    STOP = "stop"


# The run monitor's actions by the short names the agent imports.
WAIT, RESTART, FAIL, FINISH = Action.WAIT, Action.RESTART, Action.FAIL, Action.FINISH


@dataclass(frozen=True)
class Verdict:
    """The decision on an attempt (Action), with what decided it."""

    action: Action
    # The rank failure that decided it.
    failure: FailureRecord | None = None
    # RESTART: the attempt that starts now, and the restarts so far with it.
    attempt: int = 0
    restarts: int = 0
    # FAIL: the restarts failure.max_failures allows were used up.
    exhausted: bool = False
    # FAIL without a failure: why (an agent of a group that Ray Train replaced).
    reason: str = ""


def cause_order(failure: FailureRecord) -> tuple[bool, bool, bool, int]:
    """Which of an attempt's rank failures is its cause, least first: a signal death or a hang
    (decisive), then a rank that exited on its own (sys.exit), whose peers' communication errors
    follow from it, then an error that does not say a peer went away (its peers' do), then the
    lowest rank."""
    return (not failure.decisive, failure.kind != EXIT, lost_peer(failure.error), failure.rank)
