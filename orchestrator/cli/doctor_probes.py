"""What `orchestrator doctor` runs on the cluster's nodes (cli/doctor_checks.py sends them): a probe
task pinned to each node, the marker's removal, and the all-reduce loop each Ray Train worker of
the check runs, with the gloo group it forms as the orchestrator's coordination does."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import statistics
import time
from typing import Any

import ray

from orchestrator import storage

PACKAGES = ("torch", "ray", "lightning")
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def versions() -> dict[str, str]:
    """This process's python and package versions ("-" for a package not installed)."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "-"
    return found


@ray.remote(num_cpus=0)
def probe_node(marker_uri: str | None, write: bool, data_uris: tuple[str, ...] = ()) -> dict[str, Any]:
    """On one node: what it runs, which interfaces it has, whether it sees the storage marker and
    the spec's data inputs."""
    answer: dict[str, Any] = {"host": socket.gethostname(), "versions": versions(),
                              "interfaces": sorted(name for _, name in socket.if_nameindex()),
                              "env": {k: os.environ.get(k) for k in INTERFACE_VARIABLES}, "storage": None,
                              "data": {}, "host_address": host_address()}
    for uri in data_uris:
        try:
            location = storage.resolve(uri)
            if not storage.exists(location):
                answer["data"][uri] = "does not exist here"
        except Exception as exc:  # noqa: BLE001 - any failure to reach the input is the finding
            answer["data"][uri] = f"{type(exc).__name__}: {exc}"
    if marker_uri is not None:
        location = storage.resolve(marker_uri)
        try:
            if write:
                storage.write_atomic(location, json.dumps({"host": answer["host"]}).encode())
            else:
                json.loads(storage.read_bytes(location))
        except FileNotFoundError:
            answer["storage"] = f"{marker_uri} does not exist here"
        except Exception as exc:  # noqa: BLE001 - any failure to reach the storage is the finding
            answer["storage"] = f"{type(exc).__name__}: {exc}"
    return answer


def host_address() -> str:
    """What this host's name resolves to (`hostname -i`): the address gloo offers its peers
    when GLOO_SOCKET_IFNAME is not set."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        return f"unresolved ({exc})"


@ray.remote(num_cpus=0)
def remove_marker(marker_uri: str) -> None:
    location = storage.resolve(marker_uri)
    location.fs.delete_file(location.path)


def allreduce_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    device = ray.train.torch.get_device()

    def timed(tensor: torch.Tensor, times: int) -> float:
        dist.all_reduce(tensor)  # warm-up: connections are set up on first use
        seconds = []
        for _ in range(times):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if tensor.is_cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    latency = timed(torch.ones(config["small"] // 4, device=device), 20)
    bandwidth = timed(torch.ones(config["large"] // 4, device=device), 5)
    timings: dict[str, Any] = {"latency_s": latency, "bandwidth_s": bandwidth}
    if config.get("gloo_timeout_s"):
        timings["gloo"] = gloo_group_timings(config["gloo_timeout_s"], config["small"])
    if ray.train.get_context().get_world_rank() == 0:
        ray.get(config["sink"].put.remote(timings))


def gloo_group_timings(timeout_s: float, size: int) -> dict[str, Any]:
    """On every worker: form a gloo group of the world as the orchestrator's coordination does
    (rank/collectives.py) and time a small all-reduce on it; or the error, in one line."""
    import torch
    import torch.distributed as dist

    from orchestrator.rank.collectives import new_gloo_group

    try:
        start = time.perf_counter()
        group = new_gloo_group(timeout_s, timeout_s)
        formed = time.perf_counter() - start
        tensor = torch.ones(size // 4)
        dist.all_reduce(tensor, group=group)  # warm-up
        seconds = []
        for _ in range(20):
            start = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            seconds.append(time.perf_counter() - start)
        dist.destroy_process_group(group)
        return {"form_s": formed, "latency_s": statistics.median(seconds)}
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        cause = exc.__cause__ or exc
        return {"error": f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}"}


@ray.remote(num_cpus=0)
class Sink:
    """Where rank 0 leaves its timings (Ray Train V2 hands back metrics only with a checkpoint)."""

    def __init__(self) -> None:
        self.value: dict[str, Any] | None = None

    def put(self, value: dict[str, Any]) -> None:
        self.value = value

    def get(self) -> dict[str, Any] | None:
        return self.value
