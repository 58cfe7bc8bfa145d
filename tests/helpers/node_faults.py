"""Killing a node of a `ray.cluster_utils.Cluster` the way a machine dies, for the node-loss
tests and the recovery benchmarks: the node's raylet and the training workers it started are
SIGKILLed, found by their own process ids (never by a broad name). The runs on such a cluster are
`orchestrator run --address` processes (tests/helpers/cli_runs.py), as a user's shell starts them."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from ray.cluster_utils import Cluster

# Every node of a test cluster listens on loopback only, whatever this machine's interfaces are.
LOOPBACK = "127.0.0.1"
# Notice a dead node within a few seconds instead of Ray's default of about a minute.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                      "health_check_timeout_ms": 1000}


@contextlib.contextmanager
def loopback_cluster(nodes: int = 3, cpus: int = 1, *, fast_health_checks: bool = True) -> Iterator[Cluster]:
    """A head without CPUs (the driver's side; fast node-death checks, or Ray's own) and `nodes`
    nodes of `cpus` CPUs; shut down, with this process's Ray connection, at the end."""
    import ray

    head = {"num_cpus": 0, "node_ip_address": LOOPBACK}
    if fast_health_checks:
        head["_system_config"] = FAST_HEALTH_CHECKS
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def children(pid: int) -> list[int]:
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


def training_worker_pids(node) -> list[int]:
    """The RayTrainWorker processes the node's raylet started."""
    raylet = node.all_processes["raylet"][0].process.pid
    pids = []
    for pid in children(raylet):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"RayTrainWorker" in f.read():
                    pids.append(pid)
        except OSError:
            continue
    return pids


def kill_node(cluster, node) -> None:
    """The node's raylet, and the workers it started, die at once (SIGKILL, no clean-up)."""
    workers = training_worker_pids(node)
    cluster.remove_node(node, allow_graceful=False)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def process_tree(pid: int) -> list[int]:
    found = [pid]
    for child in children(pid):
        found += process_tree(child)
    return found


# cgroup v1's cpu controller, else cgroup v2's root (where this machine offers one).
CGROUP_ROOTS = ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup")


@contextlib.contextmanager
def slowed_node(node, share: float) -> Iterator[None]:
    """The node's raylet and every process it started, and those it starts from now on, get at
    most `share` of one core (a CPU quota through a cgroup, as a noisy neighbour or a throttled
    machine would leave them); put back as they were at the end. Skips the test where this
    machine lets no cgroup be made."""
    import pytest

    period_us = 100_000
    group = None
    for root in CGROUP_ROOTS:
        quota = os.path.join(root, "cpu.cfs_quota_us" if root.endswith("/cpu") else "cpu.max")
        path = os.path.join(root, f"orchestrator-test-slow-{os.getpid()}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        limit = str(int(share * period_us))
        try:
            with open(os.path.join(path, os.path.basename(quota)), "w") as f:
                f.write(limit if root.endswith("/cpu") else f"{limit} {period_us}")
        except OSError:
            os.rmdir(path)
            continue
        group = (root, path)
        break
    if group is None:
        pytest.skip("no cgroup with a CPU quota can be made on this machine")
    root, path = group

    def move(pids: list[int], into: str) -> None:
        for pid in pids:
            try:
                with open(os.path.join(into, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except OSError:  # the process ended meanwhile
                continue

    raylet = node.all_processes["raylet"][0].process.pid
    move(process_tree(raylet), path)
    try:
        yield
    finally:
        with open(os.path.join(path, "cgroup.procs")) as f:
            move([int(line) for line in f if line.strip()], root)
        os.rmdir(path)


def drain_for_preemption(cluster: Cluster, node, deadline_s: float) -> None:
    """What a cloud's spot reclaim does through Ray's autoscaler: drain the node with a deadline."""
    import time

    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=cluster.address)
    accepted, why = gcs.drain_node(node.node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                   "spot instance reclaimed (test)", int((time.time() + deadline_s) * 1000))
    assert accepted, why
