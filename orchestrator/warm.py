"""`orchestrator up` / `orchestrator down`: a warm local Ray cluster kept between runs.

Iterating on a job means running it many times a day, and an embedded cluster costs Ray's start
and stop on every run. `orchestrator up` starts one local Ray head (loopback only, token auth
with a token of its own, no dashboard) and records it in the state directory; while it is up,
`orchestrator run` without `--address` or `RAY_ADDRESS` joins it and says so. `orchestrator down`
ends its processes, found by their own process ids (every Ray process of the session holds files
in its session directory), and removes its files: nothing is left behind.

The record holds the cluster's token, so it is written readable by its owner only.
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
from dataclasses import asdict, dataclass

from orchestrator.cluster import QUIET_RAY_ENV, end_processes, session_pids, state_dir
from orchestrator.errors import UserError

RECORD_NAME = "warm-cluster.json"
# Seconds `up` waits for `ray start`, and `down` for the processes to end after SIGTERM.
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0


@dataclass
class WarmCluster:
    address: str
    session_dir: str
    temp_dir: str
    token: str
    started_at: float


def _record_path() -> str:
    return os.path.join(state_dir(), RECORD_NAME)


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


def current() -> WarmCluster | None:
    """The warm cluster, if one is up; a record whose cluster is gone is cleaned up."""
    warm = _recorded()
    if warm is None:
        return None
    if _answers(warm.address) and session_pids(warm.session_dir):
        return warm
    _remove(warm)
    return None


def up(num_cpus: int | None = None) -> tuple[WarmCluster, bool]:
    """Start the warm cluster (or find the running one); returns it and whether it was started now."""
    existing = current()
    if existing is not None:
        return existing, False
    # Short: Ray's socket paths live under it and must stay under the OS limit of 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="orch-warm-", dir="/tmp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(32)
    env = {**os.environ, **QUIET_RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    command = [ray_bin if os.path.exists(ray_bin) else "ray", "start", "--head", "--node-ip-address=127.0.0.1",
               f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    session_dir = os.path.realpath(os.path.join(temp_dir, "session_latest"))
    if done.returncode != 0:
        _end(session_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"`ray start` could not start the warm local cluster: {tail[0]}. Fix: see `ray start --head` "
                        "on this machine, or run without `orchestrator up` (an embedded cluster per run).")
    warm = WarmCluster(f"127.0.0.1:{port}", session_dir, temp_dir, token, time.time())
    fd = os.open(_record_path(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(warm), f)
    return warm, True


def down() -> WarmCluster | None:
    """End the warm cluster's processes and remove its files; the cluster that was up, or None."""
    warm = _recorded()
    if warm is not None:
        _remove(warm)
    return warm


def _remove(warm: WarmCluster) -> None:
    _end(warm.session_dir)
    shutil.rmtree(warm.temp_dir, ignore_errors=True)
    try:
        os.unlink(_record_path())
    except FileNotFoundError:
        pass


def _end(session_dir: str) -> None:
    end_processes(session_pids(session_dir), grace_s=STOP_GRACE_S)
    end_processes(session_pids(session_dir), grace_s=0)  # any started meanwhile
