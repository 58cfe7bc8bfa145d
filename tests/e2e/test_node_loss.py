"""A node lost mid-run: Ray Train restarts the worker group on the nodes that are left, the
workers resume from the newest committed checkpoint, and the run ends with the clean run's weights.

The cluster is real (`ray.cluster_utils.Cluster`, every node on loopback). The node loss runs on
a cluster of its own with Ray's default health checks, which users have, and a spare node for the
lost one's worker; the preemption on the session's shared one (tests/helpers/clusters.py, with
node-death checks of 1 s x 3), where a node like the lost one is added back after the test. The
lost node is killed by its own process ids, its raylet and everything the raylet started, as when
a machine dies.
"""

from __future__ import annotations

import time

import pytest
from cli_runs import BackgroundRun
from clusters import cluster_with_rays_defaults
from conftest import wait_for
from node_faults import drain_for_preemption, kill_node, training_worker_pids
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow


@pytest.fixture
def three_node_cluster(three_nodes):
    """A head without CPUs (the driver's side) and three 1-CPU nodes for two workers (tests/helpers/clusters.py)."""
    return three_nodes


# Seconds Ray's defaults take at most to declare a dead node dead (health checks every 3 s, 5
# failures in a row, each given up to 10 s: 15-30 s after its end, where a raylet that is gone
# refuses each check at once).
RAY_NODE_DEATH_S = 30
# From the kill to the replacement workers' processes on the node that is left: the node's death
# (Ray's defaults, the longest it takes), and a worker group start and restore on a loaded
# machine (about 30 s here), with as much again as slack.
REPLACED_WITHIN_S = 2 * (RAY_NODE_DEATH_S + 30)


def _environ(pid: int) -> dict[str, str]:
    """The environment a process was started with (/proc/PID/environ)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [entry.split(b"=", 1) for entry in f.read().split(b"\0") if b"=" in entry]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


@pytest.mark.timeout(900)
def test_a_node_lost_mid_run_on_a_cluster_with_rays_own_health_checks_is_replaced_in_their_time_with_the_clean_weights(
        tmp_path, clean_torch, monkeypatch):
    # A user's own export of a setting the orchestrator also sets (failure_timeouts.py: 1 s): Ray
    # Train's own default poll of its workers. It wins: it is what reaches the training workers.
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")
    # Two workers on three 1-CPU nodes: the lost node's worker goes to the spare one.
    with cluster_with_rays_defaults(nodes=3, cpus=1) as cluster:
        spec = torch_spec("node-loss-ray-defaults", tmp_path, loop="faulty:slow_loop", sleep_s=0.1)
        run = BackgroundRun(spec, str(tmp_path), address=cluster.address)
        try:
            store = CheckpointStore(storage.resolve(str(tmp_path / spec["name"])))
            wait_for(lambda: store.committed() or run.ended(), timeout=300)
            assert not run.ended(), run.result()
            agents = {node.node_id: training_worker_pids(node) for node in cluster.worker_nodes}
            environments = [_environ(pid) for pids in agents.values() for pid in pids]
            doomed = next(n for n in cluster.worker_nodes if agents[n.node_id])
            left = [n for n in cluster.worker_nodes if n is not doomed]
            before = {pid for node in left for pid in agents[node.node_id]}

            def replacements() -> set[int]:
                return {pid for node in left for pid in training_worker_pids(node)} - before

            kill_node(cluster, doomed)
            killed = time.monotonic()
            wait_for(lambda: len(replacements()) >= 2 or run.ended(), timeout=REPLACED_WITHIN_S, interval=0.5)
            replaced_after = time.monotonic() - killed
            result = run.result()
        finally:
            BackgroundRun.end_all()

    assert len(environments) == 2, agents
    for env in environments:
        assert env.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S") == "2", env.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
        # The orchestrator's own settings travel the same way (failure.hang_timeout_s, 60 s by default).
        assert env.get("RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S") == "60", env
    assert replaced_after < REPLACED_WITHIN_S, replaced_after
    assert result.status == "finished"
    assert result.restarts >= 1
    assert doomed.node_id not in {w["node_id"] for w in result.workers}
    assert {w["node_id"] for w in result.workers} == {node.node_id for node in left}
    assert result.world_sizes_seen == [2]
    assert result.global_step == clean_torch.global_step
    assert result.weights_sha256 == clean_torch.weights_sha256


# Seconds between the preemption notice and the node's end (clouds give 30 s to 2 min).
PREEMPTION_DEADLINE_S = 10


@pytest.mark.timeout(600)
def test_a_preempted_node_is_checkpointed_before_it_goes_and_its_loss_is_not_a_failure(
        three_node_cluster, tmp_path, clean_torch, monkeypatch):
    cluster = three_node_cluster
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")  # Ray's default: 5 s
    marker = tmp_path / "training"
    # Slow enough (63 steps x 0.3 s) that the run outlives the preemption deadline.
    spec = torch_spec("preempted", tmp_path, loop="faulty:slow_loop", sleep_s=0.3, marker=str(marker), mark_at=5)
    # No periodic checkpoints, and no failure budget: the restart must resume from the checkpoint
    # taken on the preemption notice, and must be counted as a preemption, not a failure.
    spec["checkpoint"] = {"every_n_steps": None, "at_epoch_end": False}
    spec["failure"] = {"max_failures": 0}
    run = BackgroundRun(spec, str(tmp_path), address=cluster.address)
    wait_for(lambda: marker.exists() or run.ended(), timeout=240)
    assert not run.ended(), run.result()

    doomed = next(n for n in cluster.worker_nodes if training_worker_pids(n))
    try:
        deadline = time.monotonic() + PREEMPTION_DEADLINE_S
        drain_for_preemption(cluster, doomed, deadline_s=PREEMPTION_DEADLINE_S)
        store = CheckpointStore(storage.resolve(str(tmp_path / "preempted")))
        saved = wait_for(lambda: [i for i in store.committed() if i.manifest.reason == "preemption"] or run.ended(),
                         timeout=PREEMPTION_DEADLINE_S)
        assert not run.ended(), run.result()
        # At the deadline Ray Train restarts the group away from the drained node; then the cloud
        # takes the machine.
        time.sleep(max(0.0, deadline - time.monotonic()) + 2)
    finally:
        kill_node(cluster, doomed)  # drained or not, it goes: the shared cluster gets a fresh node back
    result = run.result()

    assert result.status == "finished"
    assert result.restarts == 1
    assert result.starts[1]["restored_step"] == saved[0].step > 5
    assert doomed.node_id not in {w["node_id"] for w in result.workers}
    assert result.weights_sha256 == clean_torch.weights_sha256
