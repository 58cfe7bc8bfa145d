"""Killing a node of a `ray.cluster_utils.Cluster` the way a machine dies, for the node-loss
tests and the recovery benchmarks: the node's raylet and the training workers it started are
SIGKILLed, found by their own process ids (never by a broad name). Also the background run the
node tests train while the main thread kills and adds nodes."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

from ray.cluster_utils import Cluster

import orchestrator

# Notice a dead node within a few seconds instead of Ray's default of about a minute.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                      "health_check_timeout_ms": 1000}


@contextlib.contextmanager
def loopback_cluster(nodes: int = 3) -> Iterator[Cluster]:
    """A head without CPUs (the driver's side, fast node-death checks) and `nodes` 1-CPU nodes;
    shut down, with this process's Ray connection, at the end."""
    import ray

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_HEALTH_CHECKS})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
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


class BackgroundRun:
    """orchestrator.run on the cluster, in a thread: Cluster.remove_node must be called from the
    main thread, which therefore plays the failing world."""

    def __init__(self, spec: dict, cluster: Cluster, console=None):
        self._outcome: dict = {}
        self._thread = threading.Thread(target=self._train, args=(spec, cluster.address, console), daemon=True)
        self._thread.start()

    def _train(self, spec: dict, address: str, console) -> None:
        try:
            self._outcome["result"] = orchestrator.run(spec, address=address, console=console)
        except BaseException as exc:  # noqa: BLE001 - raised again by result()
            self._outcome["error"] = exc

    def ended(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 400) -> orchestrator.RunResult:
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "the run did not end"
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["result"]
