"""Placement on a multi-node local cluster: `spread` puts workers on different nodes, `pack` on one."""

from __future__ import annotations

import pytest
import ray
from cli_runs import run_spec
from node_faults import LOOPBACK
from ray.cluster_utils import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_node_cluster():
    """A head without CPUs (so it hosts no worker) and two 2-CPU nodes, all on loopback."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK})
    nodes = [cluster.add_node(num_cpus=2, node_ip_address=LOOPBACK) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, {n.node_id for n in nodes}
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


def tiny_spec(name, storage_dir, placement):
    return {
        "name": name, "storage": str(storage_dir),
        "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 3, "config": {"hidden": 16}},
        "scaling": {"num_workers": 2, "placement": placement},
    }


@pytest.mark.timeout(300)
@pytest.mark.parametrize("placement,distinct_nodes", [("spread", 2), ("pack", 1)])
def test_workers_land_where_the_placement_says(three_node_cluster, tmp_path, placement, distinct_nodes):
    cluster, worker_nodes = three_node_cluster
    result = run_spec(tiny_spec(placement, tmp_path, placement), str(tmp_path), address=cluster.address)
    assert result.status == "finished"
    nodes = [w["node_id"] for w in result.workers]
    assert len(nodes) == 2
    assert set(nodes) <= worker_nodes
    assert len(set(nodes)) == distinct_nodes
