"""`orchestrator up` / `orchestrator down`: a warm local Ray cluster kept between runs.

Iterating on a job means running it many times a day, and an embedded cluster costs Ray's start
and stop on every run. `orchestrator up` starts one local Ray head (loopback only, token auth
with a token of its own, Ray's dashboard on a loopback port unless --no-dashboard) and records
it in the state directory; while it is up,
`orchestrator run` without `--address` or `RAY_ADDRESS` joins it and says so. `orchestrator down`
ends its processes, found by their own process ids (every Ray process of the session holds files
in its session directory), and removes its files: nothing is left behind.

The cluster runs under `ray start --block`, itself under a keeper (`reaper.py`) in a session of
its own: the keeper adopts and reaps every process of the cluster when `down` stops it. A plain
`ray start` exits at once and leaves them to whoever adopts orphans, which on some hosts (a shell or
terminal that is a subreaper, a container whose init does not reap) keeps every stopped raylet and
agent as a zombie under the shell that ran `orchestrator up`.

The record holds the cluster's token, so it is written readable by its owner only. It names the
keeper by its pid and what tells that pid apart from any later process given it (host, boot id, pid
namespace, start time: processes.py): a record outlives a reboot, and a home shared by several hosts
shows it on each. A process is ended by its pid only while it is provably the keeper; else it is
not touched, as a record of an older version (which does not say) is not.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from orchestrator.cluster.environment import QUIET_RAY_ENV
from orchestrator.cluster.records import state_dir
from orchestrator.errors import UserError
from orchestrator.processes import (
    descendants,
    end_processes,
    is_alive,
    kernel_and_pid_namespace,
    pid_means_here,
    pid_started,
    session_pids,
    terminate,
)

RECORD_NAME = "warm-cluster.json"
# Seconds `up` waits for `ray start`, and `down` for the processes to end after SIGTERM. Short:
# once the cluster has run jobs, Ray's own graceful stop of it (`ray start --block` on SIGTERM)
# takes 30 s here, its GCS lingering; a local cluster keeps nothing that SIGKILL would lose.
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 2.0


@dataclass
class WarmCluster:
    address: str
    session_dir: str
    temp_dir: str
    token: str
    started_at: float
    # The keeper (reaper.py over `ray start --block`) that holds the cluster's processes (0 in older records).
    keeper_pid: int = 0
    # Ray's dashboard (and Jobs API), http://127.0.0.1:PORT; "" when started without one.
    dashboard: str = ""
    # What makes keeper_pid the keeper (None in older records: then it is never ended by its pid):
    # its host, its kernel's boot id, its pid namespace, and its start time (/proc/<pid>/stat field 22).
    keeper_host: str | None = None
    keeper_boot_id: str | None = None
    keeper_pid_ns: str | None = None
    keeper_started: str | None = None

    def keeper_not_here(self) -> str | None:
        """Why keeper_pid is not provably this cluster's live keeper; None when it is: the record names
        this host, kernel and pid namespace, and the process of that pid started when the keeper did."""
        if self.keeper_pid <= 0 or self.keeper_started is None:
            return "the record, of an older version, does not say which process is its keeper"
        if not pid_means_here(self.keeper_host, self.keeper_boot_id, self.keeper_pid_ns):
            return (f"its keeper, pid {self.keeper_pid}, was on another host, boot or pid namespace "
                    f"(host {self.keeper_host})")
        if not is_alive(self.keeper_pid) or pid_started(self.keeper_pid) != self.keeper_started:
            return f"its keeper, pid {self.keeper_pid}, has ended"
        return None


def _record_path() -> str:
    return os.path.join(state_dir(), RECORD_NAME)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return True
    except OSError:
        return False


def _recorded() -> WarmCluster | None:
    try:
        with open(_record_path()) as f:
            return WarmCluster(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def current(on_stale: Callable[[str], None] | None = None) -> WarmCluster | None:
    """The warm cluster, if one is up; a record whose cluster is gone is cleaned up, and
    `on_stale` hears of it."""
    warm = _recorded()
    if warm is None:
        return None
    if _answers(warm.address) and session_pids(warm.session_dir):
        return warm
    # Gone: a process is ended only if it is provably the keeper; a pid reused since (after a
    # reboot) or one of another host (a shared home) belongs to someone else.
    not_here = _remove(warm, end_session=False)
    if on_stale is not None:
        ended = (f"its record was removed and no process ended ({not_here})" if not_here
                 else "its keeper was stopped and its record removed")
        on_stale(f"the warm local cluster recorded at {warm.address} (`orchestrator up`) is gone; {ended}, and "
                 "this run goes without it (`orchestrator up` starts a new warm one)")
    return None


def up(num_cpus: int | None = None, dashboard: bool = True) -> tuple[WarmCluster, bool]:
    """Start the warm cluster (or find the running one); returns it and whether it was started now.
    With `dashboard`, Ray's dashboard listens on a free loopback port, answering once this returns."""
    existing = current()
    if existing is not None:
        return existing, False
    # Short: Ray's socket paths live under it and must stay under the OS limit of 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="orch-warm-", dir="/tmp")
    port, dashboard_port, agent_port = _free_port(), _free_port(), _free_port()
    token = secrets.token_hex(32)
    env = {**os.environ, **QUIET_RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    command = [ray_bin if os.path.exists(ray_bin) else "ray", "start", "--head", "--block",
               "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
               # The dashboard's agent on each node takes jobs (`ray job submit`): on a port of its
               # own, not Ray's fixed default, which another Ray on the machine may hold.
               *(["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
                  f"--dashboard-agent-listen-port={agent_port}"] if dashboard else ["--include-dashboard=false"])]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    log_path = os.path.join(temp_dir, "ray-start.log")
    with open(log_path, "w") as log:
        keeper = subprocess.Popen([sys.executable, "-m", "orchestrator.cluster.reaper", *command], env=env,
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # not in the shell's process group: Ctrl-C spares it
    address = f"127.0.0.1:{port}"
    session_dir = os.path.join(temp_dir, "session_latest")
    deadline = time.monotonic() + START_TIMEOUT_S
    dashboard_address = f"127.0.0.1:{dashboard_port}" if dashboard else None
    while keeper.poll() is None and not (_answers(address) and _raylet_up(session_dir)
                                         and (dashboard_address is None or _answers(dashboard_address))):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if keeper.poll() is not None or not _answers(address):
        _stop(keeper.pid, session_dir)
        with open(log_path) as log:
            tail = [line for line in log.read().strip().splitlines() if line.strip()][-1:] or ["no output"]
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise UserError(f"`ray start` could not start the warm local cluster: {tail[0]}. Fix: see `ray start --head` "
                        "on this machine, or run without `orchestrator up` (an embedded cluster per run).")
    session_dir = os.path.realpath(session_dir)  # the link names the session's own folder once Ray made it
    # Read while the keeper is our unreaped child, so its pid cannot have been given to another process.
    boot_id, pid_ns = kernel_and_pid_namespace()
    warm = WarmCluster(address, session_dir, temp_dir, token, time.time(), keeper.pid,
                       f"http://{dashboard_address}" if dashboard_address else "", socket.gethostname(), boot_id,
                       pid_ns, pid_started(keeper.pid))
    fd = os.open(_record_path(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(warm), f)
    return warm, True


def down() -> WarmCluster | None:
    """End the warm cluster's processes and remove its files; the cluster that was up, or None."""
    warm = _recorded()
    if warm is not None:
        _remove(warm, end_session=True)
    return warm


def _remove(warm: WarmCluster, end_session: bool) -> str | None:
    """Remove the cluster's record and stop its keeper's tree if that is provably its live keeper;
    else (returned: why not), with `end_session`, end what holds files of its session (no pid reused
    by another process holds those), e.g. a cluster of an older version. Its files go in every case."""
    not_here = warm.keeper_not_here()
    if not_here is None:
        _stop(warm.keeper_pid, warm.session_dir)
    elif end_session:
        _end_session(warm.session_dir)
    shutil.rmtree(warm.temp_dir, ignore_errors=True)
    try:
        os.unlink(_record_path())
    except FileNotFoundError:
        pass
    return not_here


def _raylet_up(session_dir: str) -> bool:
    """Whether the head's raylet has started (its socket exists): the cluster takes drivers then."""
    return os.path.exists(os.path.join(session_dir, "sockets", "raylet"))


def _stop(keeper_pid: int, session_dir: str) -> None:
    """Stop the cluster: its keeper first, which stops and reaps its processes; then whatever of
    its tree is left (SIGTERM, a grace, SIGKILL), the keeper last, so that it reaps the others.
    `keeper_pid` must be the keeper (our child, or as `WarmCluster.keeper_not_here` finds it).

    Only the keeper's tree is the cluster. A process outside it that holds files in the session is
    a driver that ran on the cluster (Ray keeps a driver's log files open after `ray.shutdown()`):
    a user's notebook or script, theirs to end, not ours."""
    tree = descendants(keeper_pid)
    terminate([keeper_pid], grace_s=STOP_GRACE_S)
    # Left after the grace: still below the keeper, or adopted elsewhere had the keeper ended.
    of_session = set(session_pids(session_dir))
    end_processes(sorted(set(descendants(keeper_pid)) | {p for p in tree if p in of_session}), grace_s=1.0)
    end_processes(descendants(keeper_pid), grace_s=0)  # started meanwhile
    end_processes([keeper_pid], grace_s=1.0)


def _end_session(session_dir: str) -> None:
    """End a cluster known only by its session's files (a record that names no provable keeper)."""
    end_processes(session_pids(session_dir), grace_s=STOP_GRACE_S)
    end_processes(session_pids(session_dir), grace_s=0)  # started meanwhile
