"""Killing a node of a `ray.cluster_utils.Cluster` the way a machine dies, for the node-loss
tests and the recovery benchmarks: the node's raylet and the training workers it started are
SIGKILLed, found by their own process ids (never by a broad name)."""

from __future__ import annotations

import os
import signal


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
