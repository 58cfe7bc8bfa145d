"""What went wrong when a worker group failed, and whether trying again can help.

Ray Train retries every worker error the same way, so a bug in the user's code used to be run
again `max_failures` times before anyone saw it. Here each failure is classified once:

- user: an exception raised by the training code (the model, the loop, the data module) or by
  a setting that breaks every attempt the same way. Retrying cannot help: the run fails at once.
- infrastructure: a lost worker, node or connection, a collective that timed out, a storage
  error, an OOM-killed process. Retried against `failure.max_failures`.
- hang: a rank stopped answering or stopped making progress for `failure.hang_timeout_s`.
  Retried like an infrastructure failure.
- taken_over: another driver took the run over (`LeaseLost`): this one stops, nothing is retried.

Two faults of a node are infrastructure, and the failure names the node and what to do:
- A GPU hardware fault (an uncorrectable ECC error, a lost GPU): the node is to be drained.
- A DataLoader worker killed by SIGKILL: most likely the kernel's OOM killer, the node out of
  memory (torch's two texts for it: see _KILLED_WORKER). Memory use differs from attempt to attempt
  (the page cache, the node's other processes, where the restarted group lands), so it is retried
  every time, until `failure.max_failures`, never judged by its step. A DataLoader worker killed by
  any other signal, or that exited with a status, stays the user's: a segmentation fault, an abort
  or a floating-point exception comes from native code the worker ran on the user's data, a bus
  error from /dev/shm too small for the batches (torch's text says so): each comes back every time.

One refinement needs more than one exception: an error that may or may not pass (an OSError
without errno: a corrupt Parquet page, S3's AccessDenied, an unreadable image; or a GPU fault)
carries the global step it was raised at and a signature. The first one is retried. The same
signature at the same step after a restart is no hiccup: exact resume replayed the same batch into
the same error, so the controller calls it the user's (their data) and stops. A GPU fault counts so
only when it came back on another node.

A worker's exception is classified where it was raised (the worker still has its traceback);
errors of workers that died are classified on Ray Train's controller (monitor/classifier.py).
When one rank's bug makes its peers see only communication errors, the run fails as that bug.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import signal
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InfrastructureError, LeaseLost, OrchestratorError, UserError

log = logging.getLogger(__name__)

USER, INFRASTRUCTURE, HANG, STOPPED, TAKEN_OVER = "user", "infrastructure", "hang", "stopped", "taken_over"
GPU = "gpu"  # FailureRecord.fault of a GPU hardware fault
MEMORY = "memory"  # FailureRecord.fault of a DataLoader worker SIGKILLed (the node out of memory)

# Text of the errors torch.distributed raises when a peer or the network fails (gloo and NCCL).
_COMMUNICATION_MARKERS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "timed out waiting",
    "socket timeout", "processgroupgloo", "processgroupnccl", "nccl error", "nccl communicator",
    "watchdog caught collective operation timeout", "no route to host", "connection refused",
    "read error", "unhandled system error", "remote process exited",
)
# Of those, the ones that say a peer went away: a rank seeing them is the consequence of its failure.
_LOST_PEER_MARKERS = ("closed by peer", "reset by peer", "broken pipe", "remote process exited", "connection refused")
# OSErrors a retry may get past (a storage or network hiccup); the rest (a missing file, a
# permission, a full disk) are the user's to fix.
_TRANSIENT_ERRNOS = {errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EPIPE, errno.ESTALE,
                     errno.EAGAIN, errno.EBUSY}
_USER_OSERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
# CUDA's own texts (cudaGetErrorString) and the driver's for faults of the GPU or its node rather
# than of the program: uncorrectable ECC / NVLink errors, an Xid-class kernel failure, a GPU that
# fell off the bus or is held elsewhere. A device-side assert, an illegal memory access or
# instruction, a misaligned address and out-of-memory are left to the program (NVIDIA's Xid 13/31
# guidance names the application first for those), as is every CUDA error not listed.
_GPU_FAULT_MARKERS = ("uncorrectable ecc error", "uncorrectable nvlink error", "unspecified launch failure",
                      "gpu is lost", "fallen off the bus", "cuda-capable device(s) is/are busy or unavailable",
                      "cuda error: unknown error", "cuda error: system not yet initialized")
# The same faults by cudaError_t, which torch.AcceleratorError carries as `error_code`.
_GPU_FAULT_CODES = {214, 220, 719, 46, 999, 802}
# torch's errors for a DataLoader worker that died. The first is torch/csrc/DataLoader.cpp's, from
# the SIGCHLD handler torch installs only in the main thread; it names the signal by strsignal(3).
# The second is dataloader.py's `_try_get_data`, which finds the dead worker itself in any thread
# (in a Ray Train worker, the training runs in a thread): its text has no signal, but its frame
# holds the dead workers' processes in `failed_workers`, each with its exitcode (-signal).
_KILLED_WORKER = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: ([^.]+)\.")
_EXITED_WORKER = re.compile(r"DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly")
_SIGNALS_BY_TEXT = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}


def classify(exc: BaseException) -> str:
    """USER, INFRASTRUCTURE or TAKEN_OVER for an exception raised in a worker (its cause chain too)."""
    return _verdict(exc)[0]


def _verdict(exc: BaseException) -> tuple[str, BaseException]:
    """The classification, and the link of the cause chain that decided it."""
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, WorkerFailure):
            return link.kind, link
        if isinstance(link, LeaseLost):  # a newer driver holds the run: not an error of this one's
            return TAKEN_OVER, link
        if isinstance(link, UserError):  # raised on purpose with a fix to apply (e.g. a full disk)
            return USER, link
        if _is_infrastructure(link):
            return INFRASTRUCTURE, link
        link = link.__cause__ or link.__context__
    return USER, exc


def is_gpu_fault(exc: BaseException) -> bool:
    """Whether an exception is a fault of the GPU hardware or its driver (see _GPU_FAULT_MARKERS)."""
    if not isinstance(exc, RuntimeError):
        return False
    if getattr(exc, "error_code", None) in _GPU_FAULT_CODES:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _GPU_FAULT_MARKERS)


def dataloader_worker_signal(exc: BaseException) -> signal.Signals | None:
    """The signal that killed a DataLoader worker, where `exc` is torch's error for it; else None."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    killed = _KILLED_WORKER.search(text)
    if killed:
        return _SIGNALS_BY_TEXT.get(killed.group(1).strip())
    if not _EXITED_WORKER.search(text):
        return None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_try_get_data":
            codes = [getattr(w, "exitcode", None) for w in tb.tb_frame.f_locals.get("failed_workers", ())]
            signals = [signal.Signals(-code) for code in codes if isinstance(code, int) and code < 0]
            # Several workers may have died at once: one SIGKILLed says enough about the node.
            return signal.SIGKILL if signal.SIGKILL in signals else next(iter(signals), None)
        tb = tb.tb_next
    return None


def is_memory_kill(exc: BaseException) -> bool:
    """Whether an exception is torch's for a DataLoader worker killed by SIGKILL (the OOM killer)."""
    return dataloader_worker_signal(exc) == signal.SIGKILL


def _fault(exc: BaseException) -> str:
    """FailureRecord.fault of an infrastructure error: GPU, MEMORY or none."""
    return GPU if is_gpu_fault(exc) else MEMORY if is_memory_kill(exc) else ""


def _is_infrastructure(exc: BaseException) -> bool:
    if isinstance(exc, WorkerFailure):
        return exc.kind != USER
    if isinstance(exc, InfrastructureError):  # raised on purpose: a start that could not read, a side group...
        return True
    # Ray is not imported here (a torchrun script's child process classifies its own errors without
    # it); an exception of Ray's can only exist where Ray was imported.
    ray = sys.modules.get("ray")
    if ray is not None and isinstance(exc, ray.exceptions.RayError):
        return not isinstance(exc, ray.exceptions.RayTaskError)  # a task error wraps user code
    try:
        from torch.distributed import DistError
    except ImportError:  # pragma: no cover - torch without distributed
        DistError = ()
    if DistError and isinstance(exc, DistError):
        return True
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, _USER_OSERRORS):
        return exc.errno in _TRANSIENT_ERRNOS or exc.errno is None
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(marker in text for marker in _COMMUNICATION_MARKERS) or is_gpu_fault(exc) or is_memory_kill(exc)
    return False


def lost_peer(error: str) -> bool:
    """Whether an error's text says a peer went away (gloo's, NCCL's, a socket's)."""
    return any(marker in error.lower() for marker in _LOST_PEER_MARKERS)


def raised_at(exc: BaseException) -> str:
    """Where an exception comes from, as `file:line in function`: the innermost frame of the
    user's own code (not Python's, a library's or the orchestrator's), else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    own = [f for f in frames if is_user_file(f.filename)]
    frame = (own or frames)[-1]
    return f"{_short_path(frame.filename)}:{frame.lineno} in {frame.name}"


_LIBRARY_DIRS = tuple(os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                      sysconfig.get_paths()["platlib"]})
_OWN_DIR = os.path.dirname(os.path.realpath(__file__))


def is_user_file(filename: str) -> bool:
    """Whether a source file is the user's own (not Python's, a library's, or the orchestrator's)."""
    path = os.path.realpath(filename)
    # A compiled module's frames name a source that is not there (pyarrow's "pyarrow/error.pxi").
    if filename.startswith("<") or path.startswith(_OWN_DIR + os.sep) or not os.path.exists(path):
        return False
    return not any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS) and "site-packages" not in path


def _short_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


@dataclass
class FailureRecord:
    """One rank's part in a failure, as summary.json lists it."""

    rank: int
    kind: str  # user | infrastructure | hang | taken_over
    error: str  # "ValueError: bad value"
    where: str = ""  # "jobs/foo.py:42 in train_loop"
    # Where the rank ran (from its worker group's start), when known.
    node_id: str = ""
    pid: int = 0
    hostname: str = ""
    # The global step the error was raised at (the last one completed); None where unknown.
    step: int | None = None
    # Of an error a retry may get past: a digest of its type, text and place, to recognise it
    # when it comes back after a restart.
    signature: str = ""
    # GPU for a GPU hardware fault (the node is to be drained).
    fault: str = ""
    # The same error at the same step as an earlier attempt: the data's (or the code's), not a hiccup.
    repeated: bool = False
    # What to do about it, when there is more to say than the error (how to drain a node).
    note: str = ""

    def describe(self) -> str:
        where = f" at {self.where}" if self.where else ""
        return f"rank {self.rank}: {self.error}{where}"


class WorkerFailure(OrchestratorError):
    """What a worker raises instead of the training code's exception: the same error, classified,
    with where it was raised. It pickles without the original (which may not pickle)."""

    def __init__(self, message: str, record: FailureRecord):
        super().__init__(message)
        self.record = record

    @classmethod
    def from_exception(cls, exc: BaseException, rank: int, step: int | None = None) -> WorkerFailure:
        """`step`: the global step the error was raised at (None before the group trained)."""
        if isinstance(exc, WorkerFailure):
            return exc
        kind, link = _verdict(exc)
        # A lost lease arrives wrapped (a background write's error): its own text names the new holder.
        error, where = error_line(link if kind == TAKEN_OVER else exc), raised_at(exc)
        record = FailureRecord(rank=rank, kind=kind, error=error, where=where, step=step)
        if kind == INFRASTRUCTURE:
            record.fault = _fault(link)
            if _unexplained(link) or record.fault == GPU:
                record.signature = _signature(link, where)
        return cls(f"rank {rank}: {error} (raised at {where})", record)

    @property
    def kind(self) -> str:
        return self.record.kind

    def __reduce__(self):
        return (self.__class__, (self.message, self.record))


def error_line(exc: BaseException) -> str:
    """`Type: text` of an exception, its text cut to the line that says what went wrong: CUDA's
    "CUDA error: ..." line (the lines after it are debugging advice), else the last line (a
    traceback carried in the text, as from a DataLoader worker, ends with the error). torch's "DataLoader
    worker ... exited unexpectedly" gets the signal that killed the worker, where it is known."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    cuda = [line for line in lines if line.startswith("CUDA error:")]
    line = f"{type(exc).__name__}: {(cuda or lines)[0 if cuda else -1]}"
    killed = dataloader_worker_signal(exc) if _EXITED_WORKER.search(line) else None
    return f"{line} (killed by {killed.name}: {signal.strsignal(killed)})" if killed else line


def _unexplained(exc: BaseException) -> bool:
    """An OSError that says nothing of its cause (no errno, not a connection or a timeout): retried
    once as a possible hiccup, but it may as well be the data (a damaged Parquet page, S3's
    AccessDenied, PIL's UnidentifiedImageError). An errno or a network error stays retried."""
    return isinstance(exc, OSError) and exc.errno is None and not isinstance(exc, (ConnectionError, TimeoutError))


def _signature(exc: BaseException, where: str) -> str:
    return hashlib.sha256(f"{error_line(exc)}|{where}".encode()).hexdigest()[:16]


class TransientStartError(InfrastructureError):
    """A worker group could not start from its checkpoint (a rank could not read it); retried."""


class RunStoppedOnController(OrchestratorError):
    """Raised on Ray Train's controller to end a run the driver is stopping."""


class _EndedOnController(OrchestratorError):
    """Raised on Ray Train's controller to end the run at once, with the records of the ranks that did."""

    def __init__(self, message: str, records: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.records = records or []

    def __reduce__(self):
        return (self.__class__, (self.message, self.records))


class UserCodeFailed(_EndedOnController):
    """The training code itself failed, or an error came back at the same step after a restart
    (`repeated` records): retrying cannot help."""


class RestartsExhausted(_EndedOnController):
    """A torchrun script's run used up failure.max_failures with in-place restarts and group restarts
    together (Ray Train counts only the latter)."""


class RunTakenOver(_EndedOnController):
    """A newer driver took the run over (LeaseLost): this one stops, and retrying is not its to do."""


def record_of(rank: int, exc: BaseException) -> FailureRecord:
    """The record of an error one rank raised, as it reached the controller: its classification,
    its line, and which fault an infrastructure error is."""
    kind, link = _verdict(exc)
    return FailureRecord(rank, kind, error_line(exc), fault=_fault(link) if kind == INFRASTRUCTURE else "")


def mark_repeats(records: list[FailureRecord], earlier: list[dict[str, Any]]) -> None:
    """Make the user's each infrastructure record whose error an earlier attempt of the run raised
    at the same step (`earlier`: those attempts' records, as dicts).

    Exact resume replays the same batches, so an error that a restart brings back at the very step
    it was raised at before is deterministic: the data (or the code) at that step, which no retry
    gets past. A GPU fault follows its node instead: it counts only when raised on another node.
    """
    for record in records:
        if record.kind != INFRASTRUCTURE or not record.signature or record.step is None:
            continue
        for before in earlier:
            if before.get("signature") != record.signature or before.get("step") != record.step:
                continue
            if record.fault == GPU and not (record.node_id and before.get("node_id")
                                            and record.node_id != before["node_id"]):
                continue
            record.kind, record.repeated = USER, True
            record.note = (f"raised at the same step ({record.step}) before a restart from the newest checkpoint "
                           "too: the restart replayed the same batch into the same error, so it is deterministic "
                           "(the data at that step, the code, or access to storage), not a passing hiccup")
            break


def drain_advice(record: FailureRecord) -> str:
    """For a GPU hardware fault: which node, and how to keep Ray from placing work on it again."""
    if not record.node_id:
        return ("a GPU hardware fault; its node is unknown here: find the host in this rank's log, drain that "
                "node (`ray drain-node --node-id NODE_ID --reason DRAIN_NODE_REASON_PREEMPTION --reason-message "
                "'GPU fault'`) and have its GPU checked")
    host = f" (host {record.hostname})" if record.hostname else ""
    return (f"a GPU hardware fault on node {record.node_id}{host}: the group restarts from the newest checkpoint, "
            "and Ray may place it on that node again. Drain the node so that it takes no new work: `ray drain-node "
            f"--node-id {record.node_id} --reason DRAIN_NODE_REASON_PREEMPTION --reason-message 'GPU fault'` "
            "(from any node of the cluster), then have its GPU checked (nvidia-smi -q -d ECC; Xid lines in dmesg)")


def memory_advice(record: FailureRecord) -> str:
    """For a DataLoader worker killed by SIGKILL: that the node ran out of memory, which node, and
    how to need less memory."""
    host = f" (host {record.hostname})" if record.hostname else ""
    node = f"node {record.node_id}{host}" if record.node_id else "its node (unknown here: see the rank's log)"
    return (f"a DataLoader worker of rank {record.rank} was killed by SIGKILL, most likely by the kernel's OOM killer: "
            f"{node} ran out of memory (`dmesg` or `journalctl -k` there names the killed process). It is retried "
            "from the newest checkpoint; if it comes back, need less memory per node: fewer DataLoader workers "
            "(num_workers of the rank's DataLoader: ctx.data_loader(), ctx.data() or the LightningDataModule's), a "
            "smaller prefetch_factor, a smaller batch (data.<source>.batch_size) or data.<source>.window (row groups "
            "each loader worker keeps decoded), fewer workers per node (scaling.resources_per_worker with a "
            "`memory` amount in bytes makes Ray place fewer on each node), or nodes with more memory")


def overall(records: list[FailureRecord], hang: dict[str, Any] | None, stopping: bool) -> str:
    """One classification for a failure of the group, from its ranks' records."""
    kinds = {r.kind for r in records}
    if stopping:
        return STOPPED
    for kind in (TAKEN_OVER, USER):  # a peer's communication error is the consequence, not the cause
        if kind in kinds:
            return kind
    return HANG if hang or HANG in kinds else INFRASTRUCTURE
