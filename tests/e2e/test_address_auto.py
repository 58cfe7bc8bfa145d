"""`orchestrator run SPEC --address auto` on a node of a cluster a user started with `ray start
--head` (docs/cluster.md, "From a node of the cluster"): the run joins that cluster, and its first
line says so, naming the cluster's address.

Ray's `auto` is the address the newest `ray start` wrote into `<RAY_TMPDIR or /tmp>/ray/
ray_current_cluster`, a file shared by everything on the machine: the head here has a RAY_TMPDIR of
its own, which the run is given too, so this test neither reads another test's cluster (the shared
loopback cluster writes /tmp/ray's) nor changes what theirs read. The head is on loopback with a
token of its own, and its processes are ended by their own process ids.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml
from conftest import REPO, free_port, wait_for
from specs import torch_spec

from orchestrator.processes import end_processes, session_pids

pytestmark = pytest.mark.slow

BIN = os.path.dirname(sys.executable)


@pytest.fixture
def users_head():
    """A one-node head started as a user starts one, `ray start --head`, with its own RAY_TMPDIR
    (short: Ray's socket paths live under it); yields (its GCS address, the environment a shell on
    that node has, its session folder)."""
    tmp_root = tempfile.mkdtemp(prefix="ra-", dir="/tmp")
    gcs = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "RAY_TMPDIR": tmp_root,
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    session_dir = os.path.join(tmp_root, "ray", "session_latest")
    try:
        # On loopback only: without the variable Ray rewrites 127.0.0.1 to this host's routable
        # address (orchestrator/cluster/environment.py); the run's own shell does not set it.
        started = subprocess.run(
            [os.path.join(BIN, "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
             f"--port={gcs.rpartition(':')[2]}", "--num-cpus=2", "--include-dashboard=false",
             f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
            env={**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}, capture_output=True, text=True, timeout=180,
            cwd=REPO)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        session_dir = os.path.realpath(session_dir)
        # What `auto` will find: this head, in this head's own temp folder.
        with open(os.path.join(tmp_root, "ray", "ray_current_cluster")) as f:
            assert f.read().strip() == gcs
        yield gcs, env, session_dir
    finally:
        end_processes(session_pids(session_dir), grace_s=5)
        wait_for(lambda: not session_pids(session_dir), timeout=30)
        shutil.rmtree(tmp_root, ignore_errors=True)


@pytest.mark.timeout(400)
def test_address_auto_joins_the_cluster_ray_start_began_on_this_node_and_the_first_line_names_it(
        users_head, tmp_path):
    gcs, env, session_dir = users_head
    spec = torch_spec("auto", tmp_path)
    spec["torch"]["max_steps"] = 5  # a few steps: the point is where they run
    spec["scaling"]["num_workers"] = 1
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**env, "PYTHONPATH": os.path.join(REPO, "tests", "helpers")}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(path), "--address", "auto"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("on Ray") and gcs in first, first

    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 5, summary
    # Its worker ran on that head's node: Ray names the node's files in its session folder by the
    # node's id (gcs_server_port_<node id>), which summary.json records for each worker.
    head_node = next(name.rpartition("_")[2] for name in os.listdir(session_dir) if name.startswith("gcs_server_port_"))
    assert [w["node_id"] for w in summary["workers"]] == [head_node], (summary["workers"], head_node)
