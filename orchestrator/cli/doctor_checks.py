"""The preflight checks of `orchestrator doctor` (cli/doctor.py), run from the command's process;
what runs on the nodes is cli/doctor_probes.py.

What goes wrong between nodes is found before a run pays for it:
- versions: python, torch, ray and lightning must be the same on the driver and every node;
- storage: the spec's storage is written from one node and read back on every other (a local
  path on a multi-node cluster is the classic mistake: each node keeps its own checkpoints);
- capacity: the spec's workers fit the nodes' CPUs, GPUs and custom resources;
- network interface: the interface NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names exists on every
  node (set in the node's environment or in the spec's `env:`);
- all-reduce: a small all-reduce across the nodes, one worker on each, through Ray Train's own
  worker group and process group (gloo; NCCL across the GPU nodes when the spec uses GPUs),
  with its latency and bandwidth;
- gloo group (a spec with GPUs, or `--check-gloo`): in the same workers, a separate gloo group
  forms between the nodes within the spec's failure.hang_timeout_s, as the orchestrator's
  coordination does beside NCCL (rank/collectives.py). NCCL finds a routable interface by
  itself; gloo uses the address the host name resolves to unless GLOO_SOCKET_IFNAME is set, so a
  GPU cluster can pass the NCCL all-reduce and still fail every run's start here.

Each node is probed by a zero-CPU task pinned to it, so a busy cluster is probed too.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator import storage
from orchestrator.cli import doctor_nodes
from orchestrator.cli.checkpoint_table import text_table
from orchestrator.cli.doctor_probes import (
    INTERFACE_VARIABLES,
    PACKAGES,
    Sink,
    allreduce_loop,
    probe_node,
    remove_marker,
    versions,
)
from orchestrator.cli.doctor_report import SLOW_BELOW, Check, Report
from orchestrator.cluster import connection as cluster
from orchestrator.cluster.capacity import fmt, worker_resources, workers_that_fit
from orchestrator.cluster.environment import QUIET_RAY_ENV
from orchestrator.errors import InfrastructureError
from orchestrator.spec import DEFAULT_STORAGE, FailureSpec, JobSpec

# Seconds each node gets to answer its probe, and the all-reduce to finish.
PROBE_TIMEOUT_S = 120.0
ALLREDUCE_TIMEOUT_S = 300.0
# The all-reduce's two sizes: latency on a tiny tensor, bandwidth on a larger one.
LATENCY_BYTES, BANDWIDTH_BYTES = 4, 16 * 2**20
# The gloo group gets the spec's failure.hang_timeout_s to form (what a run gives it), at most this.
MAX_GLOO_TIMEOUT_S = 100.0


def interface_problem(variable: str, value: str | None, interfaces: list[str]) -> str | None:
    """Whether `value` (NCCL's syntax: prefixes, `=` for exact names, `^` to exclude) selects an
    interface among `interfaces`; None if it does or is unset."""
    if not value:
        return None
    exclude = value.startswith("^")
    names = [n for n in value.lstrip("^").split(",") if n]

    def matches(interface: str, name: str) -> bool:
        exact = name.startswith("=") or variable == "GLOO_SOCKET_IFNAME"  # gloo takes whole names
        return interface == name.lstrip("=") if exact else interface.startswith(name)

    chosen = [i for i in interfaces if any(matches(i, n) for n in names) != exclude]
    return None if chosen else f"{variable}={value} selects none of its interfaces ({', '.join(interfaces)})"


def diagnose(spec: JobSpec | None, address: str | None = None, *, storage_uri: str | None = None,
             check_gloo: bool = False, node_health: bool = False, strict: bool = False,
             slow_below: float = SLOW_BELOW) -> Report:
    """Every check on the cluster at `address` (or an embedded one); the storage checked is
    `storage_uri`, else the spec's, else none. The gloo group is checked when the spec uses GPUs
    (training over NCCL, coordination over gloo) or when `check_gloo` asks for it; each node's
    matmul and links against its peers' with `node_health` (cli/doctor_nodes.py), and a node
    slower than `slow_below` of them fails the report under `strict`."""
    storage_uri = storage_uri or (spec.storage or DEFAULT_STORAGE if spec else None)
    # A malformed URI fails before Ray starts (and a relative path under `ray job submit`).
    root = storage.resolve_root(storage_uri) if storage_uri else None
    check_gloo = check_gloo or bool(spec and spec.scaling.use_gpu)
    env = {**(spec.env if spec else {}), **QUIET_RAY_ENV}
    connection = cluster.connect(address, job_env=env)
    try:
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")),
                       key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"]))
        marker = root.join(".orchestrator-doctor", f"{uuid.uuid4().hex}.json").uri if root else None
        data_uris = _data_uris(spec)
        probes = _probe_all(nodes, marker, data_uris, spec.env if spec else None)
        checks = [_versions_check(probes)]
        if root is not None:
            checks.append(_storage_check(storage_uri, probes))
        if data_uris:
            checks.append(_data_check(data_uris, probes))
        if spec is not None:
            checks.append(_capacity_check(spec, nodes))
        checks += _interface_checks(probes)
        tables = [_table(nodes, probes, storage_checked=marker is not None)]
        if not node_health:
            checks += _allreduce_checks(spec, nodes, probes, check_gloo)[0]
            return Report(tables, checks, strict)
        use_gpu = bool(spec and spec.scaling.use_gpu)
        reachable = _reachable(probes)
        workers = [n for n in nodes if n["NodeID"] in reachable and doctor_nodes.can_hold_a_worker(n, use_gpu)]
        measured = doctor_nodes.measure_devices(workers, slow_below)  # before the all-reduce's workers start beside it
        allreduce, timings = _allreduce_checks(spec, nodes, probes, check_gloo, [n["NodeID"] for n in workers])
        links = timings.get("links") if timings else None
        checks += [*allreduce, doctor_nodes.matmul_check(workers, measured, probes, slow_below)]
        checks.append(doctor_nodes.link_check(workers, links, probes, slow_below) if timings else
                      Check("links", False, "not measured: the all-reduce check failed (above)"))
        tables.append(doctor_nodes.table(workers, measured, links, probes))
        return Report(tables, checks, strict)
    finally:
        cluster.disconnect(connection)


def _pinned(node: dict[str, Any]):
    return NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)


def _probe_all(nodes: list[dict[str, Any]], marker: str | None, data_uris: tuple[str, ...] = (),
               job_env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each node's probe; the first node writes the marker, the others then read it."""
    probes: dict[str, dict[str, Any]] = {}

    def run(batch: list[dict[str, Any]], write: bool) -> None:
        refs = {n["NodeID"]: probe_node.options(scheduling_strategy=_pinned(n)).remote(marker, write, data_uris,
                                                                                  job_env)
                for n in batch}
        for node_id, ref in refs.items():
            try:
                probes[node_id] = ray.get(ref, timeout=PROBE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - an unreachable node is the finding
                probes[node_id] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"}

    run(nodes[:1], write=True)
    written = marker is not None and nodes and probes[nodes[0]["NodeID"]].get("storage") is None
    run(nodes[1:], write=False)
    if written:
        try:
            removal = remove_marker.options(scheduling_strategy=_pinned(nodes[0])).remote(marker)
            ray.get(removal, timeout=PROBE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a marker left behind is harmless
            pass
    return probes


def _node_name(node: dict[str, Any]) -> str:
    head = " (head)" if "node:__internal_head__" in node["Resources"] else ""
    return f"{node['NodeID'][:12]}{head}"


def _table(nodes: list[dict[str, Any]], probes: dict[str, dict[str, Any]], storage_checked: bool) -> str:
    header = ("node", "host", "address", "CPU", "GPU", "python", *PACKAGES, "storage", *INTERFACE_VARIABLES)
    mine = versions()
    rows = [header, ("driver", socket.gethostname(), "-", "-", "-", mine["python"], *(mine[p] for p in PACKAGES), "-",
             *(os.environ.get(v) or "-" for v in INTERFACE_VARIABLES))]
    for node in nodes:
        probe = probes[node["NodeID"]]
        resources = node["Resources"]
        if "error" in probe:
            rows.append((_node_name(node), "?", node["NodeManagerAddress"], "", "", f"unreachable: {probe['error']}",
                         *[""] * (len(header) - 6)))
            continue
        seen = ("ok" if probe["storage"] is None else "FAIL") if storage_checked else "-"
        rows.append((_node_name(node), probe["host"], node["NodeManagerAddress"], f"{resources.get('CPU', 0):g}",
                     f"{resources.get('GPU', 0):g}", probe["versions"]["python"],
                     *(probe["versions"][p] for p in PACKAGES), seen,
                     *(probe["env"].get(v) or "-" for v in INTERFACE_VARIABLES)))
    return text_table(rows)


def _reachable(probes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {node_id: p for node_id, p in probes.items() if "error" not in p}


def _versions_check(probes: dict[str, dict[str, Any]]) -> Check:
    mine = versions()
    unreachable = [node_id[:12] for node_id, p in probes.items() if "error" in p]
    differ = {}
    for node_id, probe in _reachable(probes).items():
        for name, value in probe["versions"].items():
            if value != mine[name]:
                differ.setdefault(name, []).append(f"{value} on node {node_id[:12]}")
    if differ or unreachable:
        parts = [f"{name} is {mine[name]} on the driver but {', '.join(found)}" for name, found in differ.items()]
        if unreachable:
            parts.append(f"node(s) {', '.join(unreachable)} did not answer within {PROBE_TIMEOUT_S:g} s")
        return Check("versions", False, "; ".join(parts) + ". Fix: install the same versions everywhere (the "
                     "cluster's setup_commands or image, and the machine you submit from), then run doctor again.")
    summary = ", ".join(f"{k} {v}" for k, v in mine.items())
    return Check("versions", True, f"{summary} on the driver and all {len(probes)} node(s)")


def _storage_check(where: str, probes: dict[str, dict[str, Any]]) -> Check:
    reachable = _reachable(probes)
    failed = {node_id: p["storage"] for node_id, p in reachable.items() if p["storage"]}
    if not failed:
        return Check("storage", True, f"{where} is written from one node and read back on all {len(reachable)}")
    first = next(iter(probes))
    if first in failed:
        return Check("storage", False, f"{where} could not be written from node {first[:12]}: {failed[first]}. "
                     "Fix: point the spec's storage at a location every node can write (a shared mount or an "
                     "object store such as s3://bucket/prefix) with credentials on every node.")
    where_not = "; ".join(f"node {node_id[:12]}: {problem}" for node_id, problem in failed.items())
    return Check("storage", False, f"{where} written from node {first[:12]} is not visible on every node ("
                 f"{where_not}). Each node would keep its own checkpoints, so a restart on another node would "
                 "start fresh. Fix: set storage to a path every node mounts (NFS or another shared filesystem) "
                 "or to an object store (s3://bucket/prefix, gs://...).")


def _data_uris(spec: JobSpec | None) -> tuple[str, ...]:
    if spec is None or spec.data is None:
        return ()
    sources = (spec.data.train, spec.data.val, spec.data.test)
    return tuple(dict.fromkeys(source.path for source in sources if source is not None))


def _data_check(uris: tuple[str, ...], probes: dict[str, dict[str, Any]]) -> Check:
    reachable = _reachable(probes)
    problems: dict[str, list[str]] = {}
    for node_id, probe in reachable.items():
        for uri, problem in probe["data"].items():
            problems.setdefault(f"{uri} {problem}", []).append(node_id[:12])
    if not problems:
        return Check("data", True, f"{', '.join(uris)} visible on all {len(reachable)} node(s)")
    found = "; ".join(f"{_where(nodes, len(reachable))}: {problem}" for problem, nodes in problems.items())
    return Check("data", False, f"the spec's data inputs are not visible everywhere ({found}). Every worker reads "
                 "its share itself. Fix: put the data on a shared mount or an object store (s3://bucket/prefix) "
                 "and point data.*.path there.")


def _capacity_check(spec: JobSpec, nodes: list[dict[str, Any]]) -> Check:
    scaling = spec.scaling
    per_worker = worker_resources(spec)
    wanted = scaling.num_workers
    least = scaling.min_workers if scaling.elastic else wanted
    fits = workers_that_fit(per_worker, (n["Resources"] for n in nodes), wanted)
    totals: dict[str, float] = {}
    for node in nodes:
        for key in per_worker:
            totals[key] = totals.get(key, 0.0) + node["Resources"].get(key, 0.0)
    asked = f"{wanted} worker(s) x {fmt(per_worker)}"
    if fits >= wanted:
        return Check("capacity", True, f"{asked} fit the cluster's {len(nodes)} node(s) ({fmt(totals)} in all)")
    if fits >= least:
        return Check("capacity", True, f"{asked}: the nodes hold {fits} of them now, within the elastic range "
                     f"[{least}, {wanted}]; the run starts with {fits} and grows when nodes join")
    short = {k: per_worker[k] * least - v for k, v in totals.items() if v < per_worker[k] * least}
    lacking = f" (short by {fmt(short)} in all)" if short else " (no single node holds a whole worker)"
    return Check("capacity", False, f"the spec asks for {asked}, and the cluster's {len(nodes)} node(s) hold at most "
                 f"{fits} such worker(s): they have {fmt(totals)} in all{lacking}. Fix: lower scaling.num_workers "
                 "or scaling.resources_per_worker (or scaling.use_gpu), or add nodes with those resources.")


def _where(nodes: list[str], of: int) -> str:
    return f"on all {of} nodes" if len(nodes) == of > 1 else f"on node(s) {', '.join(nodes)}"


def _interface_checks(probes: dict[str, dict[str, Any]]) -> list[Check]:
    checks = []
    reachable = _reachable(probes)
    for variable in INTERFACE_VARIABLES:
        problems: dict[str, list[str]] = {}  # the same finding on many nodes is said once
        values = set()
        for node_id, probe in reachable.items():
            value = probe["env"].get(variable)
            values.add(value or "")
            problem = interface_problem(variable, value, probe["interfaces"])
            if problem:
                problems.setdefault(problem, []).append(node_id[:12])
        if problems:
            found = "; ".join(f"{_where(nodes, len(reachable))}: {problem}" for problem, nodes in problems.items())
            checks.append(Check(f"interface ({variable})", False, found + ". Fix: set "
                                f"{variable} (in the spec's env: or the nodes' environment) to an interface every "
                                "node has, the one on the network the nodes reach each other through."))
        elif values - {""}:
            checks.append(Check(f"interface ({variable})", True,
                                f"{variable}={'/'.join(sorted(values - {''}))} selects an interface on every node"))
    return checks


def _allreduce_checks(spec: JobSpec | None, nodes: list[dict[str, Any]], probes: dict[str, dict[str, Any]],
                      check_gloo: bool, pair_nodes: list[str] | None = None
                      ) -> tuple[list[Check], dict[str, Any] | None]:
    """The all-reduce's checks and its workers' timings (None when it failed); with `pair_nodes`,
    the workers on those nodes also time their links in pairs."""
    reachable = [n for n in nodes if n["NodeID"] in _reachable(probes)]
    use_gpu = bool(spec and spec.scaling.use_gpu)
    if use_gpu:
        reachable = [n for n in reachable if n["Resources"].get("GPU", 0) >= 1]
    backend = "nccl" if use_gpu else "gloo"
    name = f"all-reduce ({backend})"
    if use_gpu and not reachable:
        return [Check(name, False, "no node has a GPU to run it on. Fix: see the capacity check.")], None
    gloo_timeout_s = min((spec.failure if spec else FailureSpec()).hang_timeout_s, MAX_GLOO_TIMEOUT_S)
    try:
        timings = _allreduce(len(reachable), use_gpu, gloo_timeout_s if check_gloo else None, pair_nodes)
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        text = [line for line in str(exc).strip().splitlines() if line.strip()]
        return [Check(name, False, f"{len(reachable)} worker(s), one per node, failed: {text[-1] if text else exc}. "
                      "Fix: check that the nodes reach each other on every port (firewalls, security groups), and "
                      "the interface variables above.")], None
    workers = len(reachable)
    if workers == 1:
        checks = [Check(name, True, "1 worker on the only node: its process group starts (no other node to "
                        "measure against)")]
    else:
        bus = 2 * (workers - 1) / workers * BANDWIDTH_BYTES / timings["bandwidth_s"]
        checks = [Check(name, True, f"{workers} worker(s), one per node: latency {timings['latency_s'] * 1e3:.2f} ms "
                        f"({LATENCY_BYTES} B), bus bandwidth {bus / 1e6:,.0f} MB/s ({BANDWIDTH_BYTES // 2**20} MiB)")]
    if check_gloo:
        checks.append(gloo_check(timings.get("gloo") or {"error": "rank 0 did not report it"}, backend,
                                 gloo_timeout_s, [(n, probes[n["NodeID"]]) for n in reachable]))
    return checks, timings


def gloo_check(outcome: dict[str, Any], backend: str, timeout_s: float,
               nodes: list[tuple[dict[str, Any], dict[str, Any]]]) -> Check:
    """The verdict on the gloo group the workers tried to form: `outcome` is rank 0's report
    ({"form_s", "latency_s"} or {"error"}); `nodes` the nodes it ran on, with their probes."""
    name = "gloo group"
    workers = len(nodes)
    beside = "beside the NCCL process group" if backend == "nccl" else "beside the training process group"
    if "error" not in outcome and workers == 1:
        return Check(name, True, f"1 worker on the only node: a separate gloo group {beside} forms (no other node "
                     "to connect to)")
    if "error" not in outcome:
        return Check(name, True, f"{workers} worker(s), one per node: a separate gloo group {beside} formed in "
                     f"{outcome['form_s']:.2f} s; all-reduce latency {outcome['latency_s'] * 1e3:.2f} ms "
                     f"({LATENCY_BYTES} B)")
    loopback = [f"node {node['NodeID'][:12]}: host name {probe['host']!r} resolves to {probe['host_address']} "
                f"(Ray reaches it at {node['NodeManagerAddress']})"
                for node, probe in nodes if _is_loopback(probe.get("host_address"))
                and not _is_loopback(node["NodeManagerAddress"]) and not probe["env"].get("GLOO_SOCKET_IFNAME")]
    found = f" On {'; '.join(loopback)}: gloo offers that loopback address to its peers." if loopback else ""
    return Check(name, False, f"{workers} worker(s), one per node, could not form a gloo group {beside} within "
                 f"{timeout_s:g} s (failure.hang_timeout_s): {outcome['error']}. The orchestrator coordinates the "
                 f"ranks over gloo even when training uses NCCL, so every start of a run would fail this way.{found} "
                 "Fix: "
                 "set GLOO_SOCKET_IFNAME (in the spec's env: or every node's environment) to the interface the nodes "
                 "reach each other through (the one NCCL_SOCKET_IFNAME names, e.g. eth0), and check that "
                 "`hostname -i` on every node prints its routable address, not 127.0.1.1 (/etc/hosts).")


def _is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def _allreduce(workers: int, use_gpu: bool, gloo_timeout_s: float | None = None,
               pair_nodes: list[str] | None = None) -> dict[str, Any]:
    """One worker per node through Ray Train (STRICT_SPREAD), timing all-reduces; with
    `gloo_timeout_s`, also a separate gloo group that must form within it; with `pair_nodes`,
    the links between pairs of those nodes."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    scratch = tempfile.mkdtemp(prefix="orchestrator-doctor-")
    sink = Sink.remote()
    # A byte of memory: Ray refuses empty bundles, and the CPUs may all be taken by a run.
    resources = {"GPU": 1.0} if use_gpu else {"memory": 1.0}
    trainer = TorchTrainer(
        allreduce_loop, train_loop_config={"small": LATENCY_BYTES, "large": BANDWIDTH_BYTES, "sink": sink,
                                            "gloo_timeout_s": gloo_timeout_s, "pair_nodes": pair_nodes},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=int(ALLREDUCE_TIMEOUT_S / 2)),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources,
                                     placement_strategy="STRICT_SPREAD"),
        run_config=RunConfig(name=f"doctor-{int(time.time())}", storage_path=scratch),
    )
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="doctor-allreduce", daemon=True)
    thread.start()
    thread.join(ALLREDUCE_TIMEOUT_S)
    shutil.rmtree(scratch, ignore_errors=True)
    timings = ray.get(sink.get.remote(), timeout=30)
    ray.kill(sink)
    if thread.is_alive():
        raise TimeoutError(f"it did not finish within {ALLREDUCE_TIMEOUT_S:g} s (a hang at the process group's start "
                           "is the usual sign of a wrong interface or blocked ports)")
    if "error" in outcome:
        raise outcome["error"]
    if timings is None:
        raise InfrastructureError("rank 0 of the all-reduce check finished without reporting its timings")
    return timings
