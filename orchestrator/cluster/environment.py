"""Keeping a driver's Ray on loopback when its cluster is on loopback, decided before Ray is imported.

On a host with a routable interface (every workstation and cloud VM), `ray.init(address=
"127.0.0.1:PORT")` does not knock at 127.0.0.1: Ray rewrites a loopback host to the machine's
routable address, unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` turned that off when Ray was
imported. A cluster that listens on loopback only (the warm cluster of `orchestrator up`, a head
started with `--node-ip-address=127.0.0.1`) is then unreachable, and the driver retries for
about 13 minutes. The same setting makes an embedded cluster take 127.0.0.1 as its node address,
so it is not reachable from the network either.

So the command line and `orchestrator.run` call `keep_ray_on_loopback` before anything imports
Ray. It sets the variable when the driver's cluster is on loopback (an embedded cluster, the warm
one, or a loopback --address / RAY_ADDRESS) and the user has not set it; a driver of a cluster on
a routable address keeps Ray's own behaviour. `--address auto` is the cluster that Ray's own search
finds (`auto_address`): the newest `ray start` on this machine, a loopback head among them.
This module must not import Ray.
"""

from __future__ import annotations

import os
import sys
import tempfile

ENABLE_CLUSTER_ENV_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# Set when Ray was imported, without the variable, before a loopback driver could set it.
_too_late = False


def cluster_address(address: str | None) -> str | None:
    """The address the driver joins: --address, else RAY_ADDRESS; None: the warm or an embedded cluster."""
    return address or os.environ.get("RAY_ADDRESS") or None


def ray_temp_root() -> str:
    """The folder ray.init makes its own in, read from the environment now as Ray reads it
    (ray._common.utils.get_default_system_temp_dir): RAY_TMPDIR, else TMPDIR on Linux, else /tmp.
    Not tempfile.gettempdir(), which keeps the first value it found for the process's life."""
    if os.environ.get("RAY_TMPDIR"):
        return os.environ["RAY_TMPDIR"]
    if sys.platform.startswith("linux") and os.environ.get("TMPDIR"):
        return os.environ["TMPDIR"]
    return "/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir()


def auto_address() -> str | None:
    """The GCS address Ray's `auto` joins, found as Ray finds it first
    (ray._private.services.get_ray_address_from_environment): RAY_ADDRESS, else what the newest
    `ray start` on this machine wrote into <ray_temp_root()>/ray/ray_current_cluster. None when
    neither names one (Ray then joins any cluster it sees running here, or fails)."""
    if os.environ.get("RAY_ADDRESS") and os.environ["RAY_ADDRESS"] != "auto":
        return os.environ["RAY_ADDRESS"]
    try:
        with open(os.path.join(ray_temp_root(), "ray", "ray_current_cluster")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def named(address: str) -> str:
    """`address` as the run's first line names it: for `auto`, the cluster it stands for."""
    if address != "auto":
        return address
    found = auto_address()
    return f"{found} (--address auto)" if found else "auto (no `ray start` recorded on this machine: Ray's own search)"


def is_loopback(address: str | None) -> bool:
    """Whether the cluster at `address` (None: the warm or an embedded one) listens on loopback."""
    if address is None or address == "local":
        return True
    if address == "auto":
        address = auto_address() or "auto"
    if address == "auto" or "://" in address:
        return False
    host = address.rpartition(":")[0].strip("[]")
    return host in LOOPBACK_HOSTS


def keep_ray_on_loopback(address: str | None) -> None:
    """Before Ray is imported: make a loopback cluster's driver use loopback (see the module's doc)."""
    global _too_late
    if ENABLE_CLUSTER_ENV_VAR in os.environ or not is_loopback(cluster_address(address)):
        return  # the user's own setting wins; a routable cluster keeps Ray's behaviour
    if "ray" in sys.modules:
        _too_late = True
        return
    os.environ[ENABLE_CLUSTER_ENV_VAR] = "0"


def ray_imported_too_early(address: str | None) -> str | None:
    """Why a loopback cluster cannot be joined from this process (Ray was imported without the
    variable), as a one-paragraph error; None when nothing stands in the way."""
    if not _too_late or not is_loopback(address):
        return None
    return (f"this process imported Ray before the orchestrator could keep it on loopback, so Ray would look for "
            f"the cluster at '{address}' on this machine's network address instead and wait for minutes. Fix: "
            f"call orchestrator.run before importing ray, set {ENABLE_CLUSTER_ENV_VAR}=0 in the environment "
            "before Python starts, or run the job with `orchestrator run`.")


# Set before Ray starts so every Ray process inherits them.
QUIET_RAY_ENV = {
    # Ray Train re-prints every worker print() through its own logger: each line showed twice.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # Ray Data progress bars would fill the terminal with carriage returns.
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    # Do not ask for usage stats on an embedded, throwaway cluster.
    "RAY_USAGE_STATS_ENABLED": "0",
}


def worker_env(job_env: dict[str, str]) -> dict[str, str]:
    """The variables every worker (a local run's agent too) gets on top of the driver's: the
    job's `env:`, Ray's quiet switches, and a PYTHONPATH that finds the user's modules."""
    return {**job_env, **QUIET_RAY_ENV, "PYTHONPATH": worker_pythonpath()}


def worker_pythonpath() -> str:
    """Let workers import the user's modules the way the driver does (from the current directory)."""
    # Absolute: Ray may start workers in another directory (a job's unpacked working_dir).
    own = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p) and "site-packages" not in p]
    parts = [os.getcwd(), *own]
    existing = os.environ.get("PYTHONPATH")
    if existing:
        parts.append(existing)
    return os.pathsep.join(dict.fromkeys(parts))
