"""Connecting the driver to Ray: an existing cluster, or an embedded one that cleans up after itself.

Embedded clusters are recorded in a small state file per driver. A driver killed with SIGKILL
cannot shut Ray down, and Ray's dashboard and runtime-env agents then outlive it; the next
embedded start finds records whose driver is gone and ends the processes of that session, found
by their own process ids (their command line names the dead session's directory).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass, field

import ray
from ray.exceptions import AuthenticationError

from orchestrator.cluster import own_address
from orchestrator.cluster.environment import QUIET_RAY_ENV, ray_imported_too_early, ray_temp_root
from orchestrator.cluster.records import reap_orphans, record_path
from orchestrator.errors import UserError
from orchestrator.processes import end_processes, session_pids
from orchestrator.ray_private import TOKEN_AUTH_LOGGER, enable_token_auth, restore_environ, restore_token_auth

log = logging.getLogger(__name__)

# Seconds to wait for a TCP answer from a Ray address before calling it unreachable.
ADDRESS_CHECK_TIMEOUT_S = 5.0
# The node address of an embedded cluster.
LOOPBACK = "127.0.0.1"
# Seconds an embedded cluster's workers left after Ray's shutdown are given to end on SIGTERM.
LEFTOVER_GRACE_S = 2.0

@dataclass
class Connection:
    embedded: bool
    address: str
    session_dir: str
    # Whether every process of this driver's job (the training workers included) has `job_env`:
    # false on a connection the caller made before, which cannot be given an environment.
    job_env_applied: bool = True
    # Joined the warm local cluster of `orchestrator up` (warm.py).
    warm: bool = False
    # What the user should hear about how the connection was made (a stale warm record removed).
    notes: list[str] = field(default_factory=list)
    # The token variables before an embedded cluster's own token was set (None: not set here).
    saved_auth: dict[str, str | None] | None = None


def connect(address: str | None, job_env: dict[str, str] | None = None, job_name: str | None = None) -> Connection:
    """Start an embedded cluster (no address and no RAY_ADDRESS) or connect to `address`.

    `job_env` goes to every process of the job: the training workers, and Ray Train's controller
    (which reads some settings from its own environment). Giving it to the job rather than to
    the workers alone (RunConfig's worker_runtime_env) lets Ray start the workers from its pool
    of idle processes: a worker-level runtime environment makes every (re)start spawn fresh
    processes, seconds slower. An embedded cluster's processes inherit this process's
    environment as Ray starts them; joining a cluster, the tunables of `job_env`
    (`runtime_env_vars`) become the job's runtime environment, less the keys of the `ray job
    submit` job this driver runs in (Ray refuses a runtime_env that shares a key with the job's
    own). The rest of a spec's `env:` (its secrets among them) reaches the agents in their
    config, and each agent sets it for itself and its ranks (agent/worker.py).

    `job_name` names the driver's job on a cluster it joins (the Name column of the dashboard's
    Jobs page); a `ray job submit` job keeps the name its submitter gave (--metadata-json).
    """
    for key, value in QUIET_RAY_ENV.items():
        os.environ.setdefault(key, value)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if ray.is_initialized():
        return Connection(False, "existing", _session_dir(), job_env_applied=False)
    _hide_embedded_auth_notice()
    init_kwargs = dict(
        log_to_driver=False,  # worker output stays in Ray's log files and <run_dir>/logs
        logging_level=logging.WARNING,
    )
    warm, notes = None, []
    if not address:
        from orchestrator.cluster import warm as warm_cluster

        warm = warm_cluster.current(on_stale=notes.append)
        if warm is not None:
            address = warm.address
            enable_token_auth(warm.token)
    if address:
        problem = ray_imported_too_early(address)
        if problem:
            raise UserError(problem)
        env = {k: v for k, v in runtime_env_vars({**own_address.joined(address), **(job_env or {})}).items()
               if k not in _job_runtime_env_keys()}
        if env:
            init_kwargs["runtime_env"] = {"env_vars": env}
        if job_name and "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:
            init_kwargs["job_config"] = ray.job_config.JobConfig(metadata={"job_name": job_name})
        _join(address, init_kwargs)
        return Connection(False, address, _session_dir(), warm=warm is not None, notes=notes)
    reap_orphans()
    saved_auth = _own_token()
    with _environment({**own_address.embedded(), **(job_env or {})}):
        # A cluster of its own: without address="local", ray.init() joins the newest cluster that
        # `ray start` began on this machine, if it still runs (another user's head, a test's): the
        # run would then wait for that cluster's CPUs or import modules from its workers' paths.
        # Loopback only, whatever the order Ray was imported in: nothing on the network reaches it.
        try:
            ray.init(address="local", include_dashboard=False, _node_ip_address=LOOPBACK, **init_kwargs,
                     **short_temp_dir())
        except BaseException:
            if saved_auth is not None:
                restore_token_auth(saved_auth)
            raise
    connection = Connection(True, "embedded", _session_dir(), notes=notes, saved_auth=saved_auth)
    _record(connection)
    return connection


def _own_token() -> dict[str, str | None] | None:
    """Give the embedded cluster a token of its own, in this process's environment, which every
    process of the cluster inherits as Ray starts it; returns the variables as they were.

    Left to itself, ray.init writes ~/.ray/auth_token when it finds none, and each Ray process
    reads that file as it starts. The file is shared by every cluster of the user's: two first
    runs at once on a new machine each write it, and a process the loser starts later (a worker
    of a group restart) carries the other's token, is refused by its own cluster, and the run
    waits for it forever. A token the user chose (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH) or
    RAY_AUTH_MODE=disabled is left as it is."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or \
            os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    return enable_token_auth(secrets.token_hex(32))


# What Ray appends to its temp root for its longest socket: /session_<date>_<time>_<us>_<pid>/sockets/plasma_store.
SOCKET_TAIL_BYTES = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
# The longest path of a Unix socket on Linux (sun_path is 108 bytes with its terminating NUL).
SOCKET_PATH_MAX = 107


def short_temp_dir() -> dict[str, str]:
    """ray.init's temp folder where its default (<TMPDIR>/ray) would make socket paths longer than
    a Unix socket's limit (a deep TMPDIR: Ray would fail with a traceback): a short one in /tmp.
    Called where ray.init runs, with the job's environment (a spec's `env:` may set TMPDIR)."""
    root = os.path.join(ray_temp_root(), "ray")
    if len(root.encode()) + SOCKET_TAIL_BYTES <= SOCKET_PATH_MAX:
        return {}
    return {"_temp_dir": tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp")}


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """`env` in this process's environment for the block (for the processes it starts)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        restore_environ(saved)


# The variables a job's runtime environment may carry: Ray's runtime-env agent logs it and the
# dashboard shows it (the Jobs and Actors APIs), so a value of a spec's `env:` must not be in it
# (WANDB_API_KEY, HF_TOKEN). Only tunables that must be in a process's environment before any of
# the orchestrator's code runs in it: Ray's (RAY_ADDRESS, the settings Ray's workers and Ray
# Train's controller read as they start), and torch's, gloo's and NCCL's, which Ray Train's process
# group among the agents reads as it forms, before the agent sets the rest of the spec's `env:`
# (agent/rank_env.py take_job_env). PYTHONPATH: Ray's workers import the job's modules by it.
RUNTIME_ENV_PREFIXES = ("RAY_", "TORCH_", "GLOO_", "NCCL_")
RUNTIME_ENV_NAMES = frozenset({"PYTHONPATH"})


def runtime_env_vars(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` a Ray runtime environment may be given (RUNTIME_ENV_PREFIXES)."""
    return {k: v for k, v in env.items() if k.startswith(RUNTIME_ENV_PREFIXES) or k in RUNTIME_ENV_NAMES}


def _job_runtime_env_keys() -> set[str]:
    """The env_vars keys of the `ray job submit` job this driver runs in (none outside a job)."""
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}"))
        return set((config.get("runtime_env") or {}).get("env_vars") or {})
    except (ValueError, AttributeError):
        return set()


def check_address(address: str | None) -> None:
    """Fail fast, before any work, on an address no Ray cluster answers at.

    ray.init itself retries an unreachable GCS for minutes, printing C++ warnings meanwhile.
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address or address in ("auto", "local") or address.startswith("ray://"):
        return
    if address.startswith(("http://", "https://")):
        raise UserError(
            f"Ray address '{address}' is an HTTP address (Ray's dashboard / Jobs API), but the driver "
            "joins a cluster by its GCS address. Fix: pass HEAD_IP:6379 (or 'auto' on a cluster node); "
            f"to submit from outside the cluster use `ray job submit --address {address} -- "
            "orchestrator run SPEC` instead."
        )
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise UserError(f"Ray address '{address}' is not of the form HOST:PORT. Fix: pass the head node's "
                        "GCS address, e.g. 10.0.0.1:6379, or 'auto' on a cluster node.")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_CHECK_TIMEOUT_S).close()
    except OSError as exc:
        raise UserError(
            f"no Ray cluster answers at '{address}' ({exc.strerror or exc}). Fix: start one there "
            "(`ray start --head --port=6379`, or `ray up cluster.yaml`), correct the address, or leave "
            "out --address and RAY_ADDRESS to start an embedded local cluster."
        ) from None


def _join(address: str, init_kwargs: dict) -> None:
    """ray.init(address=...), with the usual ways it goes wrong turned into one-paragraph errors."""
    try:
        ray.init(address=address, **init_kwargs)
    except AuthenticationError as exc:
        raise UserError(
            f"the Ray cluster at '{address}' refused this client's authentication token ({_first_line(exc)}). "
            "Fix: export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the contents of ~/.ray/auth_token on "
            "the head node> (or RAY_AUTH_TOKEN_PATH=<a file holding it>)."
        ) from None
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise UserError(
            f"could not connect to a Ray cluster at '{address}': {_first_line(exc)}. Fix: check that the "
            "cluster is up (`ray status --address ADDRESS`) and that ADDRESS is its GCS address "
            "(HEAD_IP:6379), or leave out --address and RAY_ADDRESS to start an embedded local cluster."
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disconnect(connection: Connection, *, process_exits: bool = False) -> None:
    """Shut Ray down if this driver started or joined it; leave a caller's own connection alone.

    `process_exits`: this process ends right after (the CLI, after a finished run). An embedded
    cluster's processes are then ended at once by their pids, instead of Ray's orderly shutdown
    (about 1.5 s here); the caller must leave with os._exit, before Ray notices its cluster gone.
    """
    if connection.address == "existing":
        return
    if process_exits and connection.embedded and connection.session_dir:
        end_processes(session_pids(connection.session_dir), grace_s=0)
    else:
        ray.shutdown()
        if connection.saved_auth is not None:
            restore_token_auth(connection.saved_auth)
        if connection.embedded and connection.session_dir:
            # Ray's shutdown ends the node's own processes; its workers (a run's supervising
            # workers among them) notice their raylet gone a moment later, on their own. The
            # caller may return, or its process exit, before: end them now, and wait.
            end_processes(session_pids(connection.session_dir), grace_s=LEFTOVER_GRACE_S)
    if connection.embedded:
        record_path(os.getpid()).unlink(missing_ok=True)


def _session_dir() -> str:
    """This driver's Ray session directory (where every process of the session keeps its files)."""
    context = ray.get_runtime_context()
    try:
        return os.path.join(context.get_temp_dir(), context.get_session_name())
    except (AttributeError, TypeError):  # connected as a client, no local node
        return ""


def _record(connection: Connection) -> None:
    record_path(os.getpid()).write_text(json.dumps({"pid": os.getpid(), "session_dir": connection.session_dir}))


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def _hide_embedded_auth_notice() -> None:
    """Ray announces token auth on every start; for a private embedded cluster it is noise."""
    for name in ("ray", TOKEN_AUTH_LOGGER):
        logging.getLogger(name).addFilter(_DropMessage("Token authentication is enabled"))
