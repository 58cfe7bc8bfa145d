"""What `orchestrator doctor` runs on the cluster's nodes (cli/doctor_checks.py and
cli/doctor_nodes.py send them): a probe task pinned to each node, the marker's removal, the
all-reduce loop each Ray Train worker of the check runs (with the gloo group it forms as the
orchestrator's coordination does, and with --nodes the point-to-point rounds between pairs of
nodes), and the matmul bench actor of --nodes."""

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

from orchestrator import procfs, storage

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
def probe_node(marker_uri: str | None, write: bool, data_uris: tuple[str, ...] = (),
               job_env: dict[str, str] | None = None) -> dict[str, Any]:
    """On one node: what it runs, which interfaces it has, whether it sees the storage marker and
    the spec's data inputs, with the spec's `env:` set as a run's agent sets it (credentials for
    the storage among it: Ray's runtime environment carries only its tunables, cluster/connection.py)."""
    os.environ.update(job_env or {})
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
    if config.get("pair_nodes") is not None:
        timings["links"] = pair_bandwidths(set(config["pair_nodes"]), config["large"], device)
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


def pair_rounds(members: list[int], rounds: int) -> list[list[tuple[int, int]]]:
    """Up to `rounds` rounds of a round-robin between `members` (the circle method): in each, every
    member is in at most one pair, and no pair repeats, so each member meets `rounds` peers (one
    round sits out when their count is odd)."""
    players: list[int | None] = list(members) + ([None] if len(members) % 2 else [])
    schedule = []
    for _ in range(min(rounds, len(players) - 1)):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        schedule.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return schedule


# Each node meets this many peers (all of them on a smaller cluster): a slow link shows in every
# pair of its node, a healthy node's in one pair at most.
PAIR_ROUNDS = 3
PAIR_REPEATS = 3


def pair_bandwidths(nodes: set[str], size: int, device) -> dict[str, dict[str, float]] | None:
    """On every worker of the check (one per node): the point-to-point bandwidth between pairs of
    the workers on `nodes`, a round at a time (the pairs of a round at once), each pair sending
    `size` bytes there and back. Rank 0 returns {node: {peer node: bytes/s}}, the others None."""
    import ray.train
    import torch
    import torch.distributed as dist

    mine = ray.get_runtime_context().get_node_id()
    everyone: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    rank = dist.get_rank()
    buffer = torch.ones(size // 4, device=device)
    measured: dict[int, float] = {}
    for pairs in pair_rounds([r for r, node in enumerate(everyone) if node in nodes], PAIR_ROUNDS):
        for low, high in pairs:
            if rank in (low, high):
                peer = high if rank == low else low
                seconds = []
                for _ in range(1 + PAIR_REPEATS):  # the first sets the connection up
                    start = time.perf_counter()
                    if rank == low:
                        dist.send(buffer, peer)
                        dist.recv(buffer, peer)
                    else:
                        dist.recv(buffer, peer)
                        dist.send(buffer, peer)
                    if buffer.is_cuda:
                        torch.cuda.synchronize()
                    seconds.append(time.perf_counter() - start)
                measured[peer] = 2 * size / min(seconds[1:])
        dist.barrier()  # one round at a time: a round's pairs do not share a link with the next's
    gathered: list[dict[int, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, measured)
    if rank != 0:
        return None
    return {everyone[r]: {everyone[p]: bw for p, bw in found.items()} for r, found in enumerate(gathered) if found}


# A matmul's side and element type: large enough to keep the device's units busy, small enough to
# take a few milliseconds on one CPU core.
CPU_MATMUL, GPU_MATMUL = 512, 8192


@ray.remote(num_cpus=0)
class DeviceBench:
    """Pinned to one node by doctor --nodes: the matmul throughput of its CPUs (with the node's
    CPU count as threads) or of each of its GPUs, the best of a few short windows, so that a moment
    of another process's load does not count against the node but a lasting one does."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def ready(self) -> list[str]:
        import torch

        torch.set_num_threads(self.threads)
        for device in self._devices():
            self._window(device, 0.0)  # the first call loads the kernels
        return self._devices()

    def measure(self, window_s: float, windows: int) -> list[dict[str, Any]]:
        found = []
        for device in self._devices():
            best = max(self._window(device, window_s) for _ in range(windows))
            found.append({"device": device, "name": self._name(device), "flops": best})
        return found

    def _name(self, device: str) -> str:
        import torch

        if device.startswith("cuda"):
            return torch.cuda.get_device_name(device)
        return f"{self.threads} thread{'s' if self.threads > 1 else ''}, {cpu_model()}"

    def _devices(self) -> list[str]:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [f"cuda:{i}" for i in range(count)] or ["cpu"]

    @staticmethod
    def _window(device: str, seconds: float) -> float:
        """FLOP/s of back-to-back matmuls for at least `seconds`."""
        import torch

        cuda = device.startswith("cuda")
        side = GPU_MATMUL if cuda else CPU_MATMUL
        dtype = torch.bfloat16 if cuda else torch.float32
        a = torch.randn(side, side, device=device, dtype=dtype)
        b = torch.randn(side, side, device=device, dtype=dtype)
        count, start = 0, time.perf_counter()
        while True:
            torch.matmul(a, b)
            count += 1
            if cuda:
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return 2 * side**3 * count / elapsed


def cpu_model() -> str:
    model = procfs.cpu_model()
    return model if model is not None else platform.processor() or platform.machine()


@ray.remote(num_cpus=0)
class Sink:
    """Where rank 0 leaves its timings (Ray Train V2 hands back metrics only with a checkpoint)."""

    def __init__(self) -> None:
        self.value: dict[str, Any] | None = None

    def put(self, value: dict[str, Any]) -> None:
        self.value = value

    def get(self) -> dict[str, Any] | None:
        return self.value
