"""Small collectives over the CPU: the orchestrator's own coordination between ranks.

They run over gloo even when training uses NCCL: a CPU tensor cannot go through NCCL, and a
CUDA one would make the step wait for the GPU. Every rank must call each of them, in the same
order (creating the side group is itself collective).

The side group beside NCCL is formed with two timeouts (`configure`, from the spec's `failure:`):
- forming it may take `failure.hang_timeout_s`. It happens before any heartbeat, so nothing else
  would notice a group that never forms; torch's default would wait 30 minutes. The usual cause
  is a host whose hostname resolves to a loopback address (127.0.1.1 in stock Ubuntu's
  /etc/hosts): NCCL finds a routable interface by itself, gloo offers its peers that address.
- once formed, each collective may wait as long as the training process group does
  (`FailureSpec.collective_timeout_s`): a rank waiting here for rank 0's long solo work (a
  checkpoint, an evaluation) is not a hang, and the hang watchdog judges the rest.
torch sets both with one `timeout`, so the group is first formed with the short one (which
proves every pair of ranks connects), then released and formed again with the long one.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch.distributed as dist

from orchestrator.errors import InfrastructureError

# Seconds to form the side group, and for each collective on it; None: torch's default (30 min).
_connect_timeout_s: float | None = None
_timeout_s: float | None = None
_group = None


class GlooGroupError(InfrastructureError):
    """The gloo side group did not form; the message says what to set. Raised from torch's own
    error (a communication error: the failure is retried like a lost connection)."""


def configure(failure) -> None:
    """Take the side group's timeouts from the spec's `failure:` section (a `FailureSpec`).

    Call before the first collective, in every worker (the worker session does)."""

    set_timeouts(failure.hang_timeout_s, failure.collective_timeout_s)


def set_timeouts(connect_timeout_s: float | None, timeout_s: float | None) -> None:
    global _connect_timeout_s, _timeout_s
    _connect_timeout_s, _timeout_s = connect_timeout_s, timeout_s


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def cpu_group():
    """The process group for the orchestrator's coordination: the world's own if it is gloo."""
    global _group
    if _group is None:
        if dist.get_backend() == "gloo":
            _group = dist.group.WORLD
        else:
            _group = new_gloo_group(_connect_timeout_s, _timeout_s)
    return _group


def new_gloo_group(connect_timeout_s: float | None, timeout_s: float | None):
    """A gloo group of the whole world that must form within `connect_timeout_s` and whose
    collectives may each take `timeout_s` (None: torch's default). Collective: every rank calls it.
    """
    if connect_timeout_s is not None and connect_timeout_s != timeout_s:
        try:
            probe = dist.new_group(backend="gloo", timeout=_delta(connect_timeout_s))
        except Exception as exc:  # torch raises DistStoreError, DistNetworkError, RuntimeError
            raise _formation_error(exc, f"within {connect_timeout_s:g} s (failure.hang_timeout_s)") from exc
        dist.destroy_process_group(probe)
    try:
        return dist.new_group(backend="gloo", timeout=_delta(timeout_s))
    except Exception as exc:
        raise _formation_error(exc, "in time" if timeout_s is None else f"within {timeout_s:g} s") from exc


def _delta(seconds: float | None) -> datetime.timedelta | None:
    return None if seconds is None else datetime.timedelta(seconds=seconds)


def _formation_error(exc: BaseException, within: str) -> GlooGroupError:
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError as error:
        address = f"nothing ({error})"
    cause = " ".join(str(exc).split())[:500]
    return GlooGroupError(
        f"the orchestrator's gloo group (its coordination between the {dist.get_world_size()} ranks, beside the "
        f"{dist.get_backend()} process group) did not form {within}: {type(exc).__name__}: {cause}. Unless a rank "
        "reached it that much later than the others, its peers could not connect to it: gloo offers its peers "
        f"the address the host name resolves to unless GLOO_SOCKET_IFNAME names an interface; here {host!r} "
        f"resolves to {address}, and a loopback address (127.0.1.1 in stock Ubuntu's /etc/hosts) cannot be "
        "reached from another node, while NCCL picks a routable interface by itself. Fix: set GLOO_SOCKET_IFNAME "
        "to the interface the nodes reach each other through (the one NCCL_SOCKET_IFNAME names, e.g. eth0) in "
        "the spec's env: or every node's environment, and check that `hostname -i` on every node prints its "
        "routable address; `orchestrator doctor SPEC` checks that the group forms.")


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=cpu_group())
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=cpu_group())
    return out


def broadcast_tensor(tensor) -> None:
    """Rank 0's values into `tensor` on every rank (in place)."""
    if _active():
        dist.broadcast(tensor, src=0, group=cpu_group())
