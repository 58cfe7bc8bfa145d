"""What went wrong when a worker group failed, and whether trying again can help.

Ray Train retries every worker error the same way, so a bug in the user's code used to be run
again `max_failures` times before anyone saw it. Here each failure is classified once:

- user: an exception raised by the training code (the model, the loop, the data module) or by
  a setting that breaks every attempt the same way. Retrying cannot help: the run fails at once.
- infrastructure: a lost worker, node or connection, a collective that timed out, a storage
  error, an OOM-killed process. Retried against `failure.max_failures`.
- hang: a rank stopped answering or stopped making progress for `failure.hang_timeout_s`.
  Retried like an infrastructure failure.

A worker's exception is classified where it was raised (the worker still has its traceback);
errors of workers that died are classified on Ray Train's controller (`FailureClassifier`).
When one rank's bug makes its peers see only communication errors, the run fails as that bug.
"""

from __future__ import annotations

import errno
import logging
import os
import sysconfig
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import ray
import ray.train

from orchestrator.errors import OrchestratorError, UserError

log = logging.getLogger(__name__)

USER, INFRASTRUCTURE, HANG, STOPPED = "user", "infrastructure", "hang", "stopped"

# Text of the errors torch.distributed raises when a peer or the network fails (gloo and NCCL).
_COMMUNICATION_MARKERS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "timed out waiting",
    "socket timeout", "processgroupgloo", "processgroupnccl", "nccl error", "nccl communicator",
    "watchdog caught collective operation timeout", "no route to host", "connection refused",
    "read error", "unhandled system error", "remote process exited",
)
# OSErrors a retry may get past (a storage or network hiccup); the rest (a missing file, a
# permission, a full disk) are the user's to fix.
_TRANSIENT_ERRNOS = {errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EPIPE, errno.ESTALE,
                     errno.EAGAIN, errno.EBUSY}
_USER_OSERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


def classify(exc: BaseException) -> str:
    """USER or INFRASTRUCTURE for an exception raised in a worker, looking down its cause chain."""
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, UserError):  # raised on purpose with a fix to apply (e.g. a full disk)
            return USER
        if _is_infrastructure(link):
            return INFRASTRUCTURE
        link = link.__cause__ or link.__context__
    return USER


def _is_infrastructure(exc: BaseException) -> bool:
    if isinstance(exc, WorkerFailure):
        return exc.kind != USER
    if isinstance(exc, TransientStartError):
        return True
    if isinstance(exc, ray.exceptions.RayError):
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
        return any(marker in text for marker in _COMMUNICATION_MARKERS)
    return False


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
    if filename.startswith("<") or path.startswith(_OWN_DIR + os.sep):
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
    kind: str  # user | infrastructure | hang
    error: str  # "ValueError: bad value"
    where: str = ""  # "jobs/foo.py:42 in train_loop"
    # Where the rank ran (from its worker group's start), when known.
    node_id: str = ""
    pid: int = 0

    def describe(self) -> str:
        where = f" at {self.where}" if self.where else ""
        return f"rank {self.rank}: {self.error}{where}"


class WorkerFailure(OrchestratorError):
    """What a worker raises instead of the training code's exception: the same error, classified,
    with where it was raised. It pickles without the original (which may not pickle)."""

    def __init__(self, message: str, rank: int = 0, kind: str = USER, error: str = "", where: str = ""):
        super().__init__(message)
        self.record = FailureRecord(rank=rank, kind=kind, error=error, where=where)

    @classmethod
    def from_exception(cls, exc: BaseException, rank: int) -> WorkerFailure:
        if isinstance(exc, WorkerFailure):
            return exc
        text = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {text[-1]}" if text else type(exc).__name__
        kind, where = classify(exc), raised_at(exc)
        return cls(f"rank {rank}: {error} (raised at {where})", rank=rank, kind=kind, error=error, where=where)

    @property
    def kind(self) -> str:
        return self.record.kind

    def __reduce__(self):
        r = self.record
        return (self.__class__, (self.message, r.rank, r.kind, r.error, r.where))


class TransientStartError(OrchestratorError):
    """A worker group could not start from its checkpoint (a rank could not read it); retried."""


class RunStoppedOnController(OrchestratorError):
    """Raised on Ray Train's controller to end a run the driver is stopping."""


class UserCodeFailed(OrchestratorError):
    """Raised on Ray Train's controller to end the run at once: the training code itself failed."""

    def __init__(self, message: str, records: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.records = records or []

    def __reduce__(self):
        return (self.__class__, (self.message, self.records))


_DIED = "the worker process died or became unreachable"


def describe_ray_error(rank: int, exc: BaseException, hang_timeout_s: float) -> FailureRecord:
    """Classify an error that reached Ray Train's controller for one rank."""
    if isinstance(exc, WorkerFailure):
        return exc.record
    name = type(exc).__name__
    if name == "WorkerHealthCheckTimeoutError":
        return FailureRecord(rank, HANG, f"the worker stopped answering for more than {hang_timeout_s:g} s")
    if name == "WorkerHealthCheckFailedError":
        cause = getattr(exc, "health_check_failure", None)
        what = _DIED
        if isinstance(cause, ray.exceptions.RayActorError):
            what += f" ({type(cause).__name__}: its node was lost, it was killed, e.g. out of memory, or it froze)"
        return FailureRecord(rank, INFRASTRUCTURE, what)
    text = str(exc).strip().splitlines()
    error = f"{name}: {text[-1]}" if text else name
    return FailureRecord(rank, classify(exc), error)


class FailureClassifier(ray.train.UserCallback):
    """Runs on Ray Train's controller each time workers fail, before it decides to retry.

    Records the failure (its classification per rank) with the run monitor, and ends the run at
    once when the training code itself raised: Ray Train treats an exception raised here as a
    controller error it does not retry.
    """

    def __init__(self, monitor, hang_timeout_s: float):
        self.monitor = monitor
        self.hang_timeout_s = hang_timeout_s

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        records = [describe_ray_error(rank, exc, self.hang_timeout_s)
                   for rank, exc in sorted(worker_exceptions.items())]
        try:
            view = ray.get(self.monitor.failure_context.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the classification still stands without the monitor's view
            view = {"hang": None, "stopping": False, "places": {}}
        verdict, stopping = view["hang"], view["stopping"]
        for record in records:
            place = view["places"].get(record.rank) or {}
            record.node_id, record.pid = place.get("node_id", ""), place.get("pid", 0)
            if verdict and record.error.startswith(_DIED):
                # The watchdog's verdict made this worker end itself (runtime/heartbeat.py).
                record.kind, record.error = HANG, "ended by the hang watchdog: " + verdict["message"]
        user = [r for r in records if r.kind == USER]
        if stopping:
            kind = STOPPED
        elif user:
            kind = USER
        elif verdict or any(r.kind == HANG for r in records):
            kind = HANG
        else:
            kind = INFRASTRUCTURE
        payload = {"classification": kind, "ranks": [asdict(r) for r in records], "hang": verdict}
        try:
            ray.get(self.monitor.push.remote("failure", **payload), timeout=10)
        except Exception as exc:  # noqa: BLE001 - recording must not change the outcome
            log.warning("could not record the failure with the run monitor: %s", exc)
        if stopping:  # the driver is stopping the run: a failure now is no reason to start again
            raise RunStoppedOnController("the run was asked to stop; the worker group is not restarted")
        if user:
            raise UserCodeFailed("; ".join(r.describe() for r in user), [asdict(r) for r in user])
