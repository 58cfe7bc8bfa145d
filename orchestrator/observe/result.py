"""The typed outcome of a run, and summary.json, its form on disk."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator import storage
from orchestrator.failures import FailureKind, StrEnum
from orchestrator.observe.goodput import describe as goodput_line
from orchestrator.protocol import (
    CheckpointCommitted,
    Event,
    Failure,
    Finished,
    HangCollectives,
    Progress,
    RankStarted,
    RestartInPlace,
    SlowestRank,
    Straggler,
)
from orchestrator.storage import Location

SUMMARY_NAME = "summary.json"


class RunStatus(StrEnum):
    """How a run ended (RunResult.status)."""

    FINISHED = "finished"
    FAILED = "failed"
    # By a signal: Ctrl-C, SIGTERM, ray job stop.
    STOPPED = "stopped"
    # The run had finished before this command: nothing was trained.
    ALREADY_FINISHED = "already_finished"
    # Another driver took the run over (a failure classified FailureKind.TAKEN_OVER).
    TAKEN_OVER = "taken_over"


# The status by the short name the driver imports.
TAKEN_OVER = RunStatus.TAKEN_OVER

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    name: str
    # A RunStatus: finished | failed | stopped | already_finished | taken_over.
    status: str
    run_dir: str
    world_size: int
    global_step: int
    # Epochs completed (an epoch interrupted part-way counts as not completed).
    epochs: int
    metrics: dict[str, float] = field(default_factory=dict)
    final_checkpoint: str | None = None
    weights_sha256: str | None = None
    wall_seconds: float = 0.0
    resumed_from: dict[str, Any] = field(default_factory=dict)
    # One entry per worker of the last worker group: rank, node_id, hostname, pid.
    workers: list[dict[str, Any]] = field(default_factory=list)
    world_sizes_seen: list[int] = field(default_factory=list)
    # Worker-group starts after the first one (failures Ray Train recovered from).
    restarts: int = 0
    # Every worker-group start, in order: its world size and the step it resumed from (None: fresh).
    starts: list[dict[str, Any]] = field(default_factory=list)
    checkpoints_committed: int = 0
    # Seconds the training loop was blocked by checkpointing (snapshot, gathers, hand-off).
    checkpoint_stall_s: float = 0.0
    # Seconds spent after training waiting for the last checkpoint write to commit.
    final_flush_s: float = 0.0
    # Every failure, in order: when, its classification (user | infrastructure | hang | stopped |
    # exit) and each failing rank's error and where it was raised; in_place: the ranks restarted
    # in their agents (else the whole worker group failed, and Ray Train restarted it).
    failures: list[dict[str, Any]] = field(default_factory=list)
    # wall_s, productive_s, lost_s by cause, recomputed_steps, goodput (see goodput.py).
    goodput: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # lightning | torch | script. A script keeps its own checkpoints: global_step is then the
    # optimizer steps of its last start, and a worker is one rank.
    kind: str = ""
    # The straggler warnings of the run (monitor/stragglers.py), and its slowest rank at the end:
    # rank, node_id, host, work_s (its own work a step), peers_median_s, ratio.
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    slowest_rank: dict[str, Any] | None = None
    # At each hang, the ranks whose last collective differed from their peers' (flight recorder):
    # attempt, ranks, message (monitor/collectives.py).
    hang_collectives: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary_path(self) -> str:
        return self.run_dir.rstrip("/") + "/" + SUMMARY_NAME

    @property
    def checkpoint(self) -> str | None:
        return self.final_checkpoint

    @classmethod
    def from_events(cls, job, run_dir: Location, events: list[Event], choice, *, wall_seconds: float,
                    error: BaseException | None, stopped_by: str | None = None,
                    goodput: dict[str, Any] | None = None, slowest: SlowestRank | None = None) -> RunResult:
        by_attempt: dict[int, list[RankStarted]] = {}
        for event in events:
            if isinstance(event, RankStarted):
                by_attempt.setdefault(event.attempt, []).append(event)
        attempts = [by_attempt[a] for a in sorted(by_attempt)]
        finished = next((e for e in reversed(events) if isinstance(e, Finished)), None)
        progress = next((e for e in reversed(events) if isinstance(e, Progress)), None)
        checkpoints = [e for e in events if isinstance(e, CheckpointCommitted)]
        source = finished or progress
        last = sorted(attempts[-1], key=lambda e: e.rank) if attempts else []
        return cls(
            name=job.name,
            status=_status(error, finished, stopped_by, events),
            run_dir=run_dir.uri,
            world_size=last[0].world_size if last else job.scaling.num_workers * job.ranks_per_worker,
            global_step=int(source.step) if source else 0,
            epochs=int(source.epoch) if source else 0,
            metrics=dict(source.metrics) if source else {},
            final_checkpoint=((finished.final_checkpoint if finished else None)
                              or (checkpoints[-1].uri if checkpoints else None)),
            weights_sha256=finished.weights_sha256 if finished else None,
            wall_seconds=round(wall_seconds, 3),
            resumed_from=choice.to_dict(),
            workers=[{"rank": e.rank, "node_id": e.node_id, "hostname": e.hostname, "pid": e.pid} for e in last],
            world_sizes_seen=_changes([a[0].world_size for a in attempts]),
            restarts=max(0, len(attempts) - 1),
            starts=[{"attempt": a[0].attempt, "world_size": a[0].world_size, "restored_step": a[0].restored_step,
                     "restored_from": a[0].restored_from} for a in attempts],
            checkpoints_committed=len(checkpoints),
            # Every attempt's stall (goodput sums them), not only the last one's.
            checkpoint_stall_s=round(float((goodput or {}).get("lost_s", {}).get("checkpoint_stall")
                                           or (finished.checkpoint_stall_s if finished else 0.0)), 4),
            final_flush_s=round(float(finished.final_flush_s if finished else 0.0), 4),
            failures=[_failure_entry(e) for e in events if isinstance(e, (Failure, RestartInPlace))],
            goodput=goodput or {},
            error=_error_line(error, stopped_by),
            kind=job.kind,
            stragglers=[e.to_record() for e in events if isinstance(e, Straggler)],
            slowest_rank=asdict(slowest) if slowest else None,
            hang_collectives=[e.to_record() for e in events if isinstance(e, HangCollectives)],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, run_dir: Location) -> RunResult | None:
        loc = run_dir.join(SUMMARY_NAME)
        if not storage.exists(loc):
            return None
        try:
            raw = json.loads(storage.read_bytes(loc))
            known = {f for f in cls.__dataclass_fields__}
            return cls(**{k: v for k, v in raw.items() if k in known})
        except (ValueError, TypeError):
            return None

    def describe(self) -> str:
        if self.kind == "script":
            return (
                f"run '{self.name}' {self.status}: {self.world_size} ranks, {self.restarts} restart(s), "
                f"{self.global_step} optimizer steps in the last start, {self.wall_seconds:.1f} s\n"
                f"  logs: {self.run_dir.rstrip('/')}/logs/rank-N.log\n"
                + (f"  {goodput_line(self.goodput)}\n" if self.goodput else "")
                + f"  summary: {self.summary_path}"
            )
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(self.metrics.items()))
        return (
            f"run '{self.name}' {self.status}: {self.world_size} workers, step {self.global_step}, "
            f"{self.epochs} epoch(s), {self.wall_seconds:.1f} s\n"
            f"  metrics: {metrics or '-'}\n"
            f"  final checkpoint: {self.final_checkpoint}\n"
            f"  weights_sha256: {self.weights_sha256}\n"
            + (f"  {goodput_line(self.goodput)}\n" if self.goodput else "")
            + f"  summary: {self.summary_path}"
        )


def _changes(values: list[int]) -> list[int]:
    """The values in order, each repeat of the one before left out: [3, 3, 2, 3] -> [3, 2, 3]."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def _status(error: BaseException | None, finished: Finished | None, stopped_by: str | None,
            events: list[Event]) -> RunStatus:
    if stopped_by or (finished is not None and finished.stopped):
        return RunStatus.STOPPED
    if error is not None and any(isinstance(e, Failure) and e.classification == FailureKind.TAKEN_OVER
                                 for e in events):
        return RunStatus.TAKEN_OVER
    return RunStatus.FAILED if error is not None or finished is None else RunStatus.FINISHED


def _error_line(error: BaseException | None, stopped_by: str | None) -> str | None:
    if stopped_by:
        return f"stopped by {stopped_by}"
    if error is None:
        return None
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[-1] if text else ''}"


def write_summary(run_dir: Location, result: RunResult) -> None:
    """summary.json; not for a run taken over: the run directory, and its summary, are the newer driver's."""
    if result.status == TAKEN_OVER:
        log.warning("%s is left to the driver that took run '%s' over", result.summary_path, result.name)
        return
    storage.write_atomic(run_dir.join(SUMMARY_NAME), json.dumps(result.to_dict(), indent=2, sort_keys=True).encode())


def _failure_entry(event: Failure | RestartInPlace) -> dict[str, Any]:
    """summary.json's record of a failure: of the whole group, or of a rank restarted in place."""
    if isinstance(event, Failure):
        return {**{k: v for k, v in event.to_record().items() if k != "kind"}, "in_place": False}
    failure = event.failure
    return {"time": event.time, "classification": failure.kind, "ranks": [failure.to_dict(summary=True)],
            "hang": failure.hang, "exhausted": False, "in_place": True}
