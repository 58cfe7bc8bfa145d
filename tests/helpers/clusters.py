"""The loopback multi-node cluster that the node-loss and elastic tests share (tests/e2e/test_node_loss.py,
tests/e2e/test_elastic.py): a head without CPUs (the driver's side, fast node-death checks) and three
1-CPU nodes, started once for the session instead of once per module or test.

A test may kill or drain a node of it; `three_nodes` then puts the cluster back as it found it,
three live 1-CPU worker nodes, before the next test gets it. The tests that use it run one after
another (conftest.py orders them, and keeps them on one worker under pytest -n), and the cluster
is shut down, with this process's Ray connection, after the last of them.

`cluster_with_rays_defaults` is the one node-loss test's own cluster with Ray's health checks, as
users have them.
"""

from __future__ import annotations

import contextlib

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


def uses_shared_cluster(item) -> bool:
    return "shared_loopback_cluster" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def shared_loopback_cluster(request):
    """Started for the first test that asks for it and shut down after the last one this process
    runs, not at the end of the session: under pytest -n they all run, as one unit of work, on one
    worker (conftest.py), which goes on to other tests without four idle nodes beside them."""
    shared = _Shared(remaining=sum(1 for item in request.session.items if uses_shared_cluster(item)))
    yield shared
    shared.close()


class _Shared:
    def __init__(self, remaining: int):
        self.remaining = remaining
        self._stack: contextlib.ExitStack | None = None
        self._cluster = None

    def cluster(self):
        if self._cluster is None:
            from node_faults import loopback_cluster

            self._stack = contextlib.ExitStack()
            self._cluster = self._stack.enter_context(loopback_cluster(WORKER_NODES))
        return self._cluster

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()  # the cluster's nodes, and this process's connection to it
        self._stack = self._cluster = None

    def done_with_one_test(self) -> None:
        self.remaining -= 1
        if self.remaining <= 0:
            self.close()


@pytest.fixture
def three_nodes(shared_loopback_cluster):
    """The shared cluster with three live 1-CPU worker nodes; left so for the next test."""
    cluster = shared_loopback_cluster.cluster()
    restore(cluster)  # a test that failed half-way may have left it short
    assert len(cluster.worker_nodes) == WORKER_NODES
    yield cluster
    restore(cluster)
    shared_loopback_cluster.done_with_one_test()


def cluster_with_rays_defaults(nodes: int = 2, cpus: int = 2):
    """A head without CPUs (the driver's side) and `nodes` nodes of `cpus` CPUs, on loopback, with
    Ray's own health checks (no `_system_config`): a node that dies is declared dead when Ray's
    defaults say, 15-30 s later, as on a user's cluster. Its own, not the shared one (whose head has
    fast checks); shut down, with this process's Ray connection, at the end."""
    from node_faults import loopback_cluster

    return loopback_cluster(nodes, cpus, fast_health_checks=False)
