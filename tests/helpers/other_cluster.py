"""Another Ray cluster on the machine, as a user's own `ray start --head` is: started in Ray's
default temp dir, so it becomes the machine's "newest cluster" (/tmp/ray/ray_current_cluster),
which Ray code that is given no address turns to. Its processes are ended by their own ids."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from conftest import free_port

from orchestrator.processes import end_processes, session_pids

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
POINTER = "/tmp/ray/ray_current_cluster"


@contextlib.contextmanager
def plain_head(env: dict[str, str], prefix: tuple[str, ...] = (), dashboard: bool = False) -> Iterator[dict]:
    """A head without CPUs on loopback, started with `env` (under the command `prefix`); with
    `dashboard`, Ray's dashboard on a free loopback port, answering before this yields. Yields its
    `address` and `dashboard` URL ("" without one)."""
    head_env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray's own loopback-only head, as documented
    port, dashboard_port = str(free_port()), free_port()
    ports = (["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
              f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}"]
             if dashboard else ["--include-dashboard=false"])
    done = subprocess.run([*prefix, RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                           "--num-cpus=0", "--disable-usage-stats", *ports],
                          capture_output=True, text=True, env=head_env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    session = None
    try:
        session = _session_of_gcs_port("/tmp/ray", port)
        url = f"http://127.0.0.1:{dashboard_port}" if dashboard else ""
        if dashboard:
            _wait_until_it_answers(url + "/api/version")
        yield {"address": f"127.0.0.1:{port}", "dashboard": url}
    finally:
        if session is not None:
            end_processes(session_pids(session), grace_s=2)
        with contextlib.suppress(FileNotFoundError):  # Ray's pointer to the newest cluster, now gone
            if port in open(POINTER).read():
                os.unlink(POINTER)


def _wait_until_it_answers(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _session_of_gcs_port(temp_dir: str, port: str) -> str:
    """The session folder of the head whose GCS listens on `port`: Ray writes the port into it.
    (Not session_latest: a cluster that another test starts meanwhile moves that link.)"""
    for path in glob.glob(os.path.join(temp_dir, "session_2*", "gcs_server_port_*")):
        with open(path) as f:
            if f.read().strip() == port:
                return os.path.dirname(path)
    raise AssertionError(f"no session folder in {temp_dir} names GCS port {port}")
