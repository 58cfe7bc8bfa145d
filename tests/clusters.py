"""The loopback multi-node cluster that the node-loss and elastic tests share (tests/test_node_loss.py,
tests/test_elastic.py): a head without CPUs (the driver's side, fast node-death checks) and three
1-CPU nodes, started once for the session instead of once per module or test.

A test may kill or drain a node of it; `three_nodes` then puts the cluster back as it found it,
three live 1-CPU worker nodes, before the next test gets it. The tests that use it run last in
the session (conftest.py orders them), so the cluster is not left idle while the rest of the suite
runs, and it is shut down, with this process's Ray connection, at the end of the session.
"""

from __future__ import annotations

import pytest

WORKER_NODES = 3
# node_faults imports Ray: only once a test asks for the cluster, never for the unit tests that
# conftest.py (which imports this module) serves too.


def add_worker_node(cluster) -> None:
    """A 1-CPU node on loopback, as the fixture's own, alive once this returns."""
    from node_faults import LOOPBACK

    cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()


def restore(cluster) -> None:
    """End any run a test left going on it, remove any node a test left half-dead, then add 1-CPU
    nodes until there are three again."""
    from cli_runs import BackgroundRun

    BackgroundRun.end_all()
    for node in list(cluster.worker_nodes):
        if not node.remaining_processes_alive():
            cluster.remove_node(node, allow_graceful=False)
    while len(cluster.worker_nodes) < WORKER_NODES:
        add_worker_node(cluster)


@pytest.fixture(scope="session")
def shared_loopback_cluster():
    from node_faults import loopback_cluster

    with loopback_cluster(WORKER_NODES) as cluster:
        yield cluster


@pytest.fixture
def three_nodes(shared_loopback_cluster):
    """The shared cluster with three live 1-CPU worker nodes; left so for the next test."""
    cluster = shared_loopback_cluster
    restore(cluster)  # a test that failed half-way may have left it short
    assert len(cluster.worker_nodes) == WORKER_NODES
    yield cluster
    restore(cluster)
