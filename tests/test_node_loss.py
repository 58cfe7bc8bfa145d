"""A node lost mid-run: Ray Train restarts the worker group on the nodes that are left, the
workers resume from the newest committed checkpoint, and the run ends with the clean run's weights.

The cluster is real (`ray.cluster_utils.Cluster`, every node on loopback); the lost node is killed
by its own process ids, its raylet and everything the raylet started, as when a machine dies.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import ray
from conftest import wait_for
from ray.cluster_utils import Cluster
from specs import torch_spec

import orchestrator
from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

# Notice a dead node within a few seconds instead of Ray's default of about a minute.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                      "health_check_timeout_ms": 1000}


@pytest.fixture
def three_node_cluster():
    """A head without CPUs (the driver's side) and three 1-CPU nodes for two workers."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_HEALTH_CHECKS})
    for _ in range(3):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _training_worker_pids(node) -> list[int]:
    raylet = node.all_processes["raylet"][0].process.pid
    pids = []
    for pid in _children(raylet):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"RayTrainWorker" in f.read():
                    pids.append(pid)
        except OSError:
            continue
    return pids


def _kill_node(cluster: Cluster, node) -> None:
    """The node's raylet, and the workers it started, die at once (SIGKILL, no clean-up)."""
    workers = _training_worker_pids(node)
    cluster.remove_node(node, allow_graceful=False)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(600)
def test_a_node_lost_mid_run_is_replaced_and_the_run_ends_with_the_clean_weights(
        three_node_cluster, tmp_path, clean_torch):
    cluster = three_node_cluster
    spec = torch_spec("node-loss", tmp_path, loop="faulty:slow_loop", sleep_s=0.1)
    outcome: dict = {}

    def train():
        try:
            outcome["result"] = orchestrator.run(spec, address=cluster.address, console=None)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the assertions below
            outcome["error"] = exc

    # Cluster.remove_node must be called from the main thread, so the driver runs in another.
    driver = threading.Thread(target=train, daemon=True)
    driver.start()
    store = CheckpointStore(storage.resolve(str(tmp_path / "node-loss")))
    wait_for(lambda: store.committed() or "error" in outcome, timeout=240)
    assert "error" not in outcome, outcome.get("error")
    doomed = next(n for n in cluster.worker_nodes if _training_worker_pids(n))
    _kill_node(cluster, doomed)
    driver.join(timeout=400)
    assert not driver.is_alive(), "the run did not end after the node was lost"

    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.status == "finished"
    assert result.restarts >= 1
    assert doomed.node_id not in {w["node_id"] for w in result.workers}
    assert result.world_sizes_seen == [2]
    assert result.global_step == clean_torch.global_step
    assert result.weights_sha256 == clean_torch.weights_sha256
