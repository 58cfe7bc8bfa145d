"""What both harnesses share inside a worker: identity, the group's resume point, saving, reporting.

One `WorkerSession` per worker process. Rank 0 owns the checkpoint writer; every rank takes part
in the collective steps (gathering per-rank state, agreeing that a time-based save is due).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.checkpoint import AsyncCheckpointWriter, CheckpointInfo, CheckpointStore, Manifest, lease, loads_state
from orchestrator.checkpoint.files import CheckpointUnreadable, Payload
from orchestrator.checkpoint.nearest import NearestFirst
from orchestrator.checkpoint.source import CheckpointSource, Keep, Restored
from orchestrator.checkpoint.store_source import StoreSource
from orchestrator.errors import CheckpointError, UserError
from orchestrator.failures import TransientStartError
from orchestrator.protocol import CheckpointCommitted, Finished, Preemption, RankStarted, ResumeFallback, RunWarning
from orchestrator.protocol import Progress as ProgressEvent
from orchestrator.rank.agent_link import AgentLink
from orchestrator.rank.cadence import SaveCadence
from orchestrator.rank.collectives import all_gather_object, broadcast_object
from orchestrator.rank.collectives import configure as configure_collectives
from orchestrator.rank.heartbeat import CHECKPOINT, FINISHING, Heartbeat
from orchestrator.rank.identity import RankIdentity
from orchestrator.rank.metric_values import metric_floats
from orchestrator.rank.rng import capture_rng
from orchestrator.rank.script.bootstrap import mark_failing
from orchestrator.rank.snapshot import SnapshotBuffers
from orchestrator.rank.train_state import Progress
from orchestrator.run_dir import RunDir, storage_marker_problem
from orchestrator.spec import JobSpec
from orchestrator.worker_config import WorkerConfig

log = logging.getLogger("orchestrator.worker")

# Seconds between progress events rank 0 sends to the driver.
PROGRESS_INTERVAL_S = 2.0


@dataclass
class ResumePoint:
    """Rank 0's decision for the group: the checkpoint it resumes from, or why its start fails."""

    uri: str | None
    restored: Restored | None = None
    # Why the group cannot start (every rank raises it): nothing was set aside for it.
    error: str | None = None
    # Why the checkpoint wanted was passed over (a verified corruption); `uri` is the older one taken.
    fallback_cause: str | None = None


def choose_resume_point(store: CheckpointStore, wanted: str | None, keep: Keep | None = None, *,
                        source: CheckpointSource | None = None) -> ResumePoint:
    """The checkpoint a group resumes from: `wanted`, every hash checked, its kept files held.

    `wanted` is read from `source` (the rank's sources, nearest first; the store by default). Only
    a verified fault of `wanted` (a checksum, a missing file, a manifest that does not decode, no
    committed checkpoint there: a CheckpointError) falls back, to the store's newest checkpoint
    that verifies, and sets aside every later one (store.py, "Branches"). A storage error
    (CheckpointUnreadable once its retries are spent, or any other) fails the start and sets
    nothing aside: as far as anyone knows the checkpoint is whole, and the next start, a restart
    or a resubmission resumes from it.
    """
    if wanted is None:
        return ResumePoint(None)
    try:
        return ResumePoint(wanted, (source or StoreSource(store)).open(wanted, keep))
    except CheckpointError as exc:  # verified: partial, corrupt, or not there
        cause = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - storage failed: one announced decision for the whole group
        return ResumePoint(wanted, error=f"rank 0 could not read it: {_unverified(exc)}")
    try:
        selection = store.latest_loadable(keep)
    except Exception as exc:  # noqa: BLE001 - the storage itself fails: retry the start, set nothing aside
        return ResumePoint(wanted, error=f"rank 0 could not read it ({cause}), and looking for an older "
                                         f"checkpoint failed: {_unverified(exc)}")
    if selection.info is None:
        return ResumePoint(wanted, error=f"rank 0 could not read it ({cause}) nor any other committed checkpoint")
    # The group trains again from an older step: every checkpoint after it failed to load,
    # and the replayed saves must replace them, not keep them (store.py, "Branches").
    try:
        store.supersede_after(selection.info.step)
    except Exception as exc:  # noqa: BLE001 - one announced decision for the whole group
        return ResumePoint(wanted, error=f"rank 0 could not set aside the unreadable checkpoints after it: {exc}")
    return ResumePoint(selection.info.uri, Restored(selection.info, selection.files), fallback_cause=cause)


def _unverified(exc: Exception) -> str:
    """An error that says nothing about the checkpoint, and that nothing was set aside for it."""
    if isinstance(exc, CheckpointUnreadable):
        return str(exc)  # says so itself
    return (f"{type(exc).__name__}: {exc}. This is not a verified fault of the checkpoint, so nothing was "
            "skipped or set aside")


class StorageNotShared(UserError):
    """Some worker cannot see the run directory the driver writes: storage is node-local."""


class StopTraining(Exception):
    """Raised in the training loop once the stop checkpoint is handed over: the driver asked the
    run to stop (Ctrl-C, SIGTERM, `ray job stop`). The harness catches it and ends cleanly."""


class WorkerSession:
    def __init__(self, config: WorkerConfig, in_place: bool = False):
        self.config = config
        # Whether this attempt restarted the ranks in place, under the same agents.
        self.in_place = in_place
        self.spec: JobSpec = config.spec
        # The gloo side group beside NCCL must form within failure.hang_timeout_s (collectives.py).
        configure_collectives(self.spec.failure)
        self.run_uri: str = config.run_uri
        self.resume_uri: str | None = config.resume_uri
        self.monitor = AgentLink(config.monitor)  # the run monitor, through this rank's agent
        self.run_dir = RunDir.at(self.run_uri)
        identity = RankIdentity.from_env()
        self.rank, self.world_size, self.local_rank = identity.rank, identity.world_size, identity.local_rank
        self.node_id = identity.node_id
        self.identity = identity
        fence = config.fence
        # Every commit and deletion first checks that the driver that started this group still
        # holds the run: an orphaned group of a driver that was replaced changes nothing.
        self.store = CheckpointStore(self.run_dir.location, fence=None if fence is None else
                                     (lambda: lease.fence(self.run_dir, fence.generation, fence.nonce)))
        # Where the resume choice looks and a restore reads, nearest first (checkpoint/nearest.py).
        self.sources = NearestFirst([StoreSource(self.store)])
        # Sharded state (fsdp on either path): every rank writes its own part of each checkpoint.
        self.sharded = self.spec.sharded
        self.writer = AsyncCheckpointWriter(
            self.store, asynchronous=self.spec.checkpoint.async_save, on_commit=self._on_commit
        ) if self.rank == 0 or self.sharded else None
        self._buffers = SnapshotBuffers()
        self._spec_record = self.spec.to_record()
        self.heartbeat: Heartbeat | None = None
        # A coming preemption is learnt from the agent (Ray Train tells the agent).
        self.cadence = SaveCadence(self.spec.checkpoint, self.rank, self.world_size, self.monitor.preemption_notice,
                                   stop_requested=lambda: bool(self.heartbeat and self.heartbeat.stop_requested))
        # Seconds the training loop spent blocked in saves: gather, snapshot and hand-off.
        self.stall_seconds = 0.0
        self.last_save_step = -1
        # This start of the ranks' number in the run (protocol.py: the attempt, from the monitor),
        # and the checkpoint it started from (None: a fresh start).
        self.attempt = 0
        self.restored_uri: str | None = None
        self._rank0_restored: Restored | None = None
        self._last_progress = 0.0
        self._first_step_reported = False
        self._samples_since = 0
        self._since = time.monotonic()
        _quiet_rank()

    # --- the start of a worker group: one resume point for every rank ---------------------------

    def start(self, keep: Keep | None = None) -> Restored | None:
        """Begin this worker group and load the checkpoint it resumes from.

        Rank 0 alone decides which checkpoint: the newest committed during this run (after a
        restart), else the driver's choice; if that one cannot be read, the newest that verifies,
        announced as such. Every rank then loads exactly that checkpoint (only the files `keep`
        accepts are held in memory). A rank that cannot read it fails the start on every rank,
        with a message naming the checkpoint, the rank and the cause, and the ranks retry the
        start: no rank ever falls back on its own, so no rank resumes at another step.
        """
        self._check_storage_is_shared()
        # Steps only some ranks' own sources hold count when every rank holds them: gathered
        # first, and only when such a source exists (storage is the same on every rank).
        local = None if self.sources.same_on_every_rank else all_gather_object(self.sources.local_steps())
        decision = broadcast_object(self._decide(keep, local) if self.rank == 0 else None)
        restored = None
        error = decision.get("error")
        if self.rank == 0:
            restored = self._rank0_restored
        elif decision["uri"] is not None and error is None:
            try:
                restored = self.sources.open(decision["uri"], keep, verify_all=False)
            except Exception as exc:  # noqa: BLE001 - reported below, by every rank alike
                error = f"rank {self.rank} could not read it: {type(exc).__name__}: {exc}"
        errors = [e for e in all_gather_object(error) if e]
        if errors:
            raise TransientStartError(
                f"the worker group could not resume from checkpoint {decision['uri']}: {errors[0]}. "
                "Every rank starts again (counted against failure.max_failures).")
        self.attempt = decision["attempt"]
        # Which start of the run's ranks this is, for the user's code (logs, records).
        os.environ["ORCHESTRATOR_ATTEMPT"] = str(self.attempt)
        self.heartbeat = Heartbeat(self.monitor, self.attempt, self.rank, node_id=self.node_id,
                                   flush_logs=_flush_logs).start()
        if restored is not None:
            # The state at that step is committed already: saving it again would only rewrite it.
            self.last_save_step = restored.info.step
            self.restored_uri = restored.info.uri
        return restored

    def _check_storage_is_shared(self) -> None:
        """Every rank reads back the marker the driver wrote in the run directory, or the start
        fails on every rank with the nodes that could not: node-local storage on a multi-node
        cluster would give each node its own checkpoints, so restarts would silently start
        fresh and sharded commits would wait for shards they never see."""
        nonce = self.config.storage_nonce
        problem = storage_marker_problem(self.run_dir, nonce) if nonce else None
        seen = all_gather_object((self.rank, socket.gethostname(), self.node_id, problem))
        failed = [entry for entry in seen if entry[3]]
        if not failed:
            return
        where = "; ".join(f"rank {rank} on {host} (node {node[:12]}): {problem}"
                          for rank, host, node, problem in failed[:4])
        raise StorageNotShared(
            f"the run directory {self.run_uri} is not the same storage on every node: {where}. Each node "
            "would keep its own checkpoints, so a restart on another node would start fresh. Fix: set "
            "storage to a path every node mounts (NFS or another shared filesystem) or to an object store "
            "(s3://bucket/prefix, gs://...), then run again.")

    def _decide(self, keep: Keep | None, local: list[list[int]] | None) -> dict[str, Any]:
        """Rank 0: which checkpoint the group resumes from (its files kept in `_rank0_restored`);
        `local`: every rank's steps of its own sources, gathered (None: it has none)."""
        begun = self.monitor.begin_attempt(self.world_size)
        candidate = self._or_newer_held(begun.latest_uri or self.resume_uri, local)
        point = choose_resume_point(self.store, candidate, keep, source=self.sources)
        self._rank0_restored = point.restored
        if point.fallback_cause is not None:
            log.warning("checkpoint %s could not be read (%s); the whole group resumes from %s instead",
                        candidate, point.fallback_cause, point.uri)
            self.monitor.send(ResumeFallback(wanted=candidate, cause=point.fallback_cause, uri=point.uri))
        # A failed decision keeps the checkpoint wanted: the start's error names it.
        return {"attempt": begun.attempt, "uri": point.uri, "error": point.error}

    def _or_newer_held(self, candidate: str | None, local: list[list[int]] | None) -> str | None:
        """`candidate`, or the newest step every rank can get where that is newer: a save killed
        between its commit and its announcement is on storage, newer than what the monitor heard
        of. Safe at every start: before any rank trains, the driver supersedes this run's
        checkpoints past an older resume point, so the newest left is the resume point's or this run's."""
        newest = self.sources.newest_every_rank_can_get(local)
        step = _step_named(candidate) if candidate else -1
        if newest is None or step is None or newest.step <= step:
            return candidate
        log.info("resuming from %s, committed after the last checkpoint announced (%s)", newest.uri, candidate)
        return newest.uri

    def announce(self, restored: Restored | None) -> None:
        self.monitor.send(RankStarted(
            rank=self.rank, world_size=self.world_size, attempt=self.attempt, node_id=self.node_id,
            hostname=socket.gethostname(), pid=os.getpid(), restored_from=restored.info.uri if restored else None,
            restored_step=restored.info.step if restored else None, in_place=self.in_place))

    def note_once(self, message: str) -> None:
        """A statement for the driver's output (how a loader resumes...); printed once per run."""
        self.monitor.send(RunWarning(message=message))

    # --- progress -----------------------------------------------------------------------------

    def count_samples(self, n: int) -> None:
        self._samples_since += n

    def stepped(self, progress: Progress) -> None:
        """After every optimizer step: the heartbeat's progress, and the driver's progress events."""
        self.heartbeat.stepped(progress.step)
        first = not self._first_step_reported
        self._first_step_reported = True
        # The group's first step is always reported: goodput counts from it.
        self.progress(progress, force=first, first_step=first)

    def progress(self, progress: Progress, *, force: bool = False, first_step: bool = False) -> None:
        now = time.monotonic()
        if self.rank != 0 or (not force and now - self._last_progress < PROGRESS_INTERVAL_S):
            return
        # The first event opens the measuring window (start-up is not throughput).
        samples_per_s = None
        if self._samples_since and self._last_progress:
            samples_per_s = self._samples_since * self.world_size / max(now - self._since, 1e-9)
        self._samples_since, self._since, self._last_progress = 0, now, now
        self.monitor.send(ProgressEvent(
            samples_per_s=samples_per_s, attempt=self.attempt, first_step=first_step, stall_s=self.stall_seconds,
            step=progress.step, epoch=progress.epoch, batch_in_epoch=progress.batch_in_epoch,
            consumed=progress.consumed, metrics=metric_floats(progress.metrics)))

    # --- saving -------------------------------------------------------------------------------

    def save_reason(self, step: int) -> str | None:
        """Why to checkpoint after `step` ("preemption", "steps", "seconds"), or None when no save is due.

        Every rank must call it after every optimizer step (time-based decisions are collective).
        """
        reason = self.cadence.reason(step)
        if reason == "preemption" and self.rank == 0:
            self._announce_preemption(step)
        return reason if step != self.last_save_step else None

    def _announce_preemption(self, step: int) -> None:
        notice = self.cadence.preemption
        deadline_ms = getattr(notice, "deadline_ms", None)
        left = f"{max(0.0, deadline_ms / 1000 - time.time()):.0f} s" if deadline_ms else "an unknown time"
        nodes = list(getattr(notice, "preempted_node_ids", []))
        log.warning("node(s) %s will be preempted in %s: checkpointing at step %d", nodes, left, step)
        self.monitor.send(Preemption(step=step, nodes=nodes, seconds_left=left))

    @contextlib.contextmanager
    def stalling(self):
        """Time a block of the training loop that exists only to checkpoint (not a hang either)."""
        start = time.perf_counter()
        try:
            with self.heartbeat.during(CHECKPOINT):
                yield
        finally:
            self.stall_seconds += time.perf_counter() - start

    def gather_for_save(self) -> tuple[list[dict[str, Any]], str]:
        """Every rank's RNG state, in rank order, and the save's token: rank 0's, the same on
        every rank, naming this save's staging folder when the checkpoint is sharded."""
        local: dict[str, Any] = {"rng": capture_rng()}
        if self.sharded:
            local["token"] = uuid.uuid4().hex[:8]
        gathered = all_gather_object(local)
        return [{"rng": entry["rng"]} for entry in gathered], gathered[0].get("token", "")

    def restored_file(self, restored: Restored, fname: str) -> bytes:
        """A file of the checkpoint being resumed: from memory if this rank kept it, else read from
        the nearest source that has it (and checked against its checksum) now."""
        if fname in restored.files:
            return restored.files[fname]
        return self.sources.read(restored.info, fname)

    def restored_state(self, restored: Restored, fname: str) -> Any:
        """A torch-saved file of the checkpoint being resumed, loaded without unpickling objects."""
        return loads_state(self.restored_file(restored, fname), source=f"{restored.info.uri}/{fname}")

    def prepare_snapshot(self, state: Any) -> None:
        """Once training runs, on each rank that writes: get snapshot memory ready in the background."""
        if self.writer is not None:
            self._buffers.prepare(state)

    def snapshot(self, state: Any) -> Any:
        """Copy `state` for the writer, once the previous write no longer reads the buffers."""
        assert self.writer is not None
        self.writer.wait()
        return self._buffers.take(state)

    def commit(self, progress: Progress, reason: str, build_files: Callable[[], dict[str, Payload]],
               token: str = "") -> None:
        """Hand a snapshot to the writer (asynchronous unless checkpoint.async is false).

        Every rank calls it. Unsharded, rank 0 writes the whole checkpoint; sharded, every rank
        writes its own files and rank 0 commits once all are there (`token`: the same on all ranks).
        """
        self.last_save_step = progress.step
        self.cadence.saved()
        if self.writer is None:
            return
        manifest = Manifest(step=progress.step, epoch=progress.epoch, batch_in_epoch=progress.batch_in_epoch,
                            consumed=progress.consumed, world_size=self.world_size, kind=self.spec.kind, files={},
                            metrics=metric_floats(progress.metrics), reason=reason, sharded=self.sharded,
                            strategy=self.spec.strategy, spec=self._spec_record)
        if self.sharded:
            self.writer.save_shard(manifest, token, self.rank, build_files)
        else:
            self.writer.save(manifest, build_files)

    def _on_commit(self, info: CheckpointInfo) -> None:
        """On the writer thread, after each commit: tell the driver, then apply retention.

        A checkpoint that did not read back intact is announced as a warning, not as committed;
        retention then keeps what came before it. Retention problems are warnings too: a save
        never fails for them, and the next pass retries.
        """
        if info.status == "committed":
            self.monitor.send(CheckpointCommitted(uri=info.uri, step=info.step, name=info.name,
                                                         reason=info.manifest.reason if info.manifest else ""))
        else:
            self.monitor.send(RunWarning(message=f"checkpoint {info.uri} was written but does not read "
                                                f"back intact ({info.problem}); the checkpoints before it are kept"))
        best = self.spec.checkpoint.keep_best
        report = self.store.retain(self.spec.checkpoint.keep_last,
                                   (best.k, best.monitor, best.mode) if best else None)
        for problem in report.problems:
            self.monitor.send(RunWarning(message=f"checkpoint retention: {problem}"))

    def failing(self, exc: BaseException) -> None:
        """The training raised `exc`, and the process ends once it is through its handlers: said at
        once, in the heartbeat and to the agent with the error's record (bootstrap.mark_failing),
        so that the time they take (a Lightning logger marking its run failed, a user's
        on_exception) is no rank in training that took no step: a hang verdict there would restart
        a user's bug as a hang instead of failing the run on it. The agent ends a rank still on its
        way out after failure.hang_timeout_s and reports this error."""
        # The global step it was raised at (the last completed; None before the group trained):
        # the same error at the same step after a restart is the data's (monitor/attempts.py).
        if self.heartbeat is not None:
            exc.orchestrator_step = max(self.heartbeat.step, self.last_save_step, 0)
            self.heartbeat.enter(FINISHING)
        mark_failing(exc)

    def abandon(self, exc: BaseException) -> None:
        """The training loop raised `exc`: still commit the checkpoint already handed to the writer.

        Its snapshot was taken before the error, so it is a valid state; losing it would throw
        away work that was promised to the user. Its wait is a checkpoint's, timed by
        failure.checkpoint_timeout_s, not the failing rank's grace. A failure of that write is only
        logged here, so the loop's own exception is the one that reaches the driver.
        """
        if self.writer is not None:
            mark_failing(None)
            if self.heartbeat is not None:
                self.heartbeat.enter(CHECKPOINT)
            try:
                self.writer.close()
            except Exception as problem:  # noqa: BLE001 - the original error matters more
                log.warning("the checkpoint in flight when training failed was not committed: %s", problem)
        self.failing(exc)
        if self.heartbeat is not None:
            self.heartbeat.close()
        _flush_logs()

    def finish(self, progress: Progress, fingerprint: str, extra_metrics: dict[str, float], *,
               stopped: bool = False) -> None:
        """Wait for the last write, then (rank 0) tell the driver how the run ended.

        `stopped`: training ended early because the driver asked it to stop.
        """
        self.heartbeat.enter(FINISHING)
        if self.writer is not None and self.rank != 0:
            self.writer.close()  # this rank's last shard: rank 0's commit waits for it
        if self.writer is not None and self.rank == 0:
            # Training is over here: waiting for the last write is reported, not counted as stall.
            flush_start = time.perf_counter()
            self.writer.close()
            final_flush = time.perf_counter() - flush_start
            stall = self.stall_seconds
            last = self.writer.last_committed
            final_checkpoint = last.uri if last else self.restored_uri
            # Waited for: the worker may be torn down as soon as this function returns, and a
            # call still queued in it would be lost. Calls from one caller arrive in order, so
            # the checkpoint events sent before this one are delivered too.
            self.monitor.send_and_wait(Finished(
                weights_sha256=fingerprint, final_checkpoint=final_checkpoint, attempt=self.attempt,
                checkpoint_stall_s=stall, final_flush_s=final_flush, stopped=stopped,
                metrics={**metric_floats(progress.metrics), **metric_floats(extra_metrics)},
                step=progress.step, epoch=progress.epoch, batch_in_epoch=progress.batch_in_epoch,
                consumed=progress.consumed))
        self.heartbeat.close()
        _flush_logs()


# --- the rank's output: its agent copies it into <run>/logs/rank-N.log ---------------------------

def _quiet_rank() -> None:
    """Keep per-rank chatter out of sight: Lightning's info lines and known harmless warnings."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (".*LeafSpec.*", ".*does not have many workers.*", ".*barebones.*", ".*is not resumable.*",
                    ".*TypedStorage is deprecated.*", ".*torch.utils._pytree.*"):
        warnings.filterwarnings("ignore", message=pattern)


def _flush_logs() -> None:
    """What this rank printed, to its agent's pipe before the process ends."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the agent is gone, or the stream closed


def _step_named(uri: str) -> int | None:
    """The step in a checkpoint URI's folder name (`.../step-000000030`, an object store's query
    string aside); None if it names none."""
    name = uri.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return int(name[len("step-"):]) if name.startswith("step-") and name[len("step-"):].isdigit() else None
