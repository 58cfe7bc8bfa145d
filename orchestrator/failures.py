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
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any

from orchestrator.errors import InfrastructureError, LeaseLost, OrchestratorError, UserError

log = logging.getLogger(__name__)

try:
    from enum import StrEnum  # the kinds, faults, phases, actions and states of the wire (protocol.py)
except ImportError:  # Python 3.10: the same, a member reads as its value in JSON, logs and f-strings
    class StrEnum(str, Enum):
        __str__, __format__ = str.__str__, str.__format__


class FailureKind(StrEnum):
    """What a rank's failure was (the module docstring), and the classification of a group's."""

    USER = "user"
    INFRASTRUCTURE = "infrastructure"
    HANG = "hang"
    TAKEN_OVER = "taken_over"
    # A torchrun script's own non-zero exit status (sys.exit): restarted, as under torchrun.
    EXIT = "exit"
    # A group's classification alone: it failed while the driver was stopping the run.
    STOPPED = "stopped"


class Fault(StrEnum):
    """Which fault of its node an infrastructure failure is (FailureRecord.fault)."""

    NONE = ""
    GPU = "gpu"  # a GPU hardware fault: the node is to be drained
    MEMORY = "memory"  # a DataLoader worker SIGKILLed: the node out of memory


# The kinds and faults by the short names the modules import.
USER, INFRASTRUCTURE, HANG, TAKEN_OVER, EXIT, STOPPED = (
    FailureKind.USER, FailureKind.INFRASTRUCTURE, FailureKind.HANG, FailureKind.TAKEN_OVER, FailureKind.EXIT,
    FailureKind.STOPPED)
GPU, MEMORY = Fault.GPU, Fault.MEMORY

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


def classify(exc: BaseException) -> FailureKind:
    """USER, INFRASTRUCTURE or TAKEN_OVER for an exception raised in a worker (its cause chain too)."""
    return _verdict(exc)[0]


def _verdict(exc: BaseException) -> tuple[FailureKind, BaseException]:
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


def _fault(exc: BaseException) -> Fault:
    """FailureRecord.fault of an infrastructure error: GPU, MEMORY or none."""
    return GPU if is_gpu_fault(exc) else MEMORY if is_memory_kill(exc) else Fault.NONE


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


# Metadata of the FailureRecord fields only a rank's agent sets, for the run monitor's verdict on
# an attempt (monitor/attempts.py): not in summary.json.
_AGENTS = {"agents": True}


@dataclass
class FailureRecord:
    """One rank's failure, the same type end to end: written by the rank (its bootstrap's failure
    file), completed by its agent (agent/outcome.py), weighed by the run monitor, raised to Ray
    Train's controller (WorkerFailure) and listed in summary.json. Between processes it travels
    as itself (pickled by Ray) or as `to_dict()` JSON, read back by `from_dict`."""

    rank: int
    kind: FailureKind
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
    # GPU for a GPU hardware fault (the node is to be drained), MEMORY for a node out of memory.
    fault: Fault = Fault.NONE
    # The same error at the same step as an earlier attempt: the data's (or the code's), not a hiccup.
    repeated: bool = False
    # What to do about it, when there is more to say than the error (how to drain a node).
    note: str = ""
    # The rank's log, where its agent knows it (summary.json lists it only then).
    log: str = ""
    # The agent's, for the monitor: whether the failure decides its attempt at once (a signal
    # death, a user error, a hang) or waits for a peer's report that may be its cause; the rank's
    # last lines of output; a hang's verdict (protocol.Hang's record).
    decisive: bool = field(default=False, metadata=_AGENTS)
    last_lines: list[str] = field(default_factory=list, metadata=_AGENTS)
    hang: dict[str, Any] | None = field(default=None, metadata=_AGENTS)

    def __post_init__(self) -> None:
        self.kind, self.fault = FailureKind(self.kind), Fault(self.fault)

    def describe(self) -> str:
        where = f" at {self.where}" if self.where else ""
        return f"rank {self.rank}: {self.error}{where}"

    def to_dict(self, summary: bool = False) -> dict[str, Any]:
        """The record as JSON keeps it; with `summary`, a rank as summary.json lists it: without
        the agent's fields, and its log only where known."""
        data = asdict(self)  # kind and fault are str-valued: JSON writes their values
        agents = {f.name for f in fields(self) if f.metadata.get("agents")} if summary else set()
        return {k: v for k, v in data.items() if k not in agents and (v or k != "log" or not summary)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureRecord:
        """The record of `to_dict()`'s JSON (keys it does not know are left out)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def for_group(self, kind: FailureKind, note: str) -> FailureRecord:
        """The record an agent raises for its group's failure (WorkerFailure: Ray Train's
        controller classifies it), as `kind` with `note`: without the agent's own fields."""
        agents = {f.name: f.default if f.default_factory is MISSING else f.default_factory()
                  for f in fields(self) if f.metadata.get("agents") or f.name == "log"}
        return replace(self, kind=kind, note=note, **agents)


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
    def kind(self) -> FailureKind:
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


def record_of(rank: int, exc: BaseException) -> FailureRecord:
    """The record of an error one rank raised, as it reached the controller: its classification,
    its line, and which fault an infrastructure error is."""
    kind, link = _verdict(exc)
    return FailureRecord(rank, kind, error_line(exc), fault=_fault(link) if kind == INFRASTRUCTURE else "")


def mark_repeats(records: list[FailureRecord], earlier: list[FailureRecord]) -> None:
    """Make the user's each infrastructure record whose error an earlier attempt of the run raised
    at the same step (`earlier`: those attempts' records).

    Exact resume replays the same batches, so an error that a restart brings back at the very step
    it was raised at before is deterministic: the data (or the code) at that step, which no retry
    gets past. A GPU fault follows its node instead: it counts only when raised on another node.
    """
    for record in records:
        if record.kind != INFRASTRUCTURE or not record.signature or record.step is None:
            continue
        for before in earlier:
            if before.signature != record.signature or before.step != record.step:
                continue
            if record.fault == GPU and not (record.node_id and before.node_id and record.node_id != before.node_id):
                continue
            record.kind, record.repeated = USER, True
            record.note = (f"raised at the same step ({record.step}) before a restart from the newest checkpoint "
                           "too: the restart replayed the same batch into the same error, so it is deterministic "
                           "(the data at that step, the code, or access to storage), not a passing hiccup")
            break


def overall(records: list[FailureRecord], hang: dict[str, Any] | None, stopping: bool) -> FailureKind:
    """One classification for a failure of the group, from its ranks' records."""
    kinds = {r.kind for r in records}
    if stopping:
        return STOPPED
    for kind in (TAKEN_OVER, USER):  # a peer's communication error is the consequence, not the cause
        if kind in kinds:
            return kind
    return HANG if hang or HANG in kinds else INFRASTRUCTURE
