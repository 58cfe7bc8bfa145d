"""`orchestrator doctor --nodes`: each node's health against its peers, before a long run pays for
a slow one (cli/doctor_checks.py adds these checks to the rest).

- matmul: a bench actor pinned to every node that can hold a worker times back-to-back matmuls on
  its CPUs (as many threads as the node has CPUs) or on each of its GPUs, its best of a few short
  windows. Nodes that share a host (an address) take turns window by window, since they share its
  cores; other hosts measure at once. A node found slow is measured again, with all the others,
  and named only if it stays slow: a burst of another process's load on a host falls on every
  node's windows alike, and a moment of it does not name a healthy node.
- links: the all-reduce check's workers (one per node) send 16 MiB there and back between pairs
  of nodes, a round-robin of up to three rounds (cli/doctor_probes.py), and each node's figure is
  its best pair's: a slow node or link is slow in every pair of its own, a healthy node meets at
  least one healthy peer.

A device or node below `slow_below` (0.7) of its peers' median is named, with its node, host and
address: a warning, which fails the command under --strict (a gate before a launch). A rank on
such a node would hold back every step of a run, as DDP waits for the slowest rank.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.cli.checkpoint_table import text_table
from orchestrator.cli.doctor_probes import DeviceBench
from orchestrator.cli.doctor_report import Check

# The matmul's measure: a node's best of these windows, taken in passes of one window a node;
# while a node would be named slow, up to CONFIRM more passes of every node.
WINDOW_S, WINDOWS, CONFIRM = 0.2, 5, 10
BENCH_TIMEOUT_S = 120.0


@dataclass
class Finding:
    """One measured unit (a node's CPUs, one of its GPUs, or its best link) and how it compares."""

    node: dict[str, Any]
    unit: str  # "cpu", "cuda:0", "link"
    value: float
    peers_median: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.value / self.peers_median if self.peers_median else None


def judge(findings: list[Finding], slow_below: float, least: int = 2) -> list[Finding]:
    """Compare each finding with the median of the others' (not the group's: with two, the group's
    median would halve the gap); the ones below `slow_below` of it, slowest first. Fewer than
    `least` findings name nobody."""
    for finding in findings:
        others = [f.value for f in findings if f is not finding]
        finding.peers_median = statistics.median(others) if len(findings) >= least and others else None
    slow = [f for f in findings if f.ratio is not None and f.ratio < slow_below]
    return sorted(slow, key=lambda f: f.ratio)


def can_hold_a_worker(node: dict[str, Any], use_gpu: bool) -> bool:
    """The nodes a run would train on: a head kept free of work (0 CPUs) may be smaller hardware,
    and naming it would be a false alarm."""
    return node["Resources"].get("GPU" if use_gpu else "CPU", 0) >= 1


def device_findings(nodes: list[dict[str, Any]], measured: dict[str, Any]) -> list[Finding]:
    by_id = {n["NodeID"]: n for n in nodes}
    return [Finding(by_id[node_id], device["device"], device["flops"])
            for node_id, devices in measured.items() if not isinstance(devices, str) for device in devices]


def measure_devices(nodes: list[dict[str, Any]], slow_below: float) -> dict[str, list[dict[str, Any]] | str]:
    """Each node's matmul throughput per device ({node id: [{device, name, flops}]}), or why
    it could not be measured."""
    pinned = {n["NodeID"]: DeviceBench.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        num_gpus=n["Resources"].get("GPU", 0)).remote(max(1, int(n["Resources"].get("CPU", 1))))
        for n in nodes}
    try:
        failed = _each(pinned, lambda actor: actor.ready.remote())
        failed = {node_id: why for node_id, why in failed.items() if isinstance(why, str)}
        by_host: dict[str, list[str]] = {}
        for node in nodes:
            if node["NodeID"] not in failed:
                by_host.setdefault(node["NodeManagerAddress"], []).append(node["NodeID"])
        # One node of each host at a time: nodes on one host would measure each other's load.
        turns = [[node_id for node_id in turn if node_id] for turn in itertools.zip_longest(*by_host.values())]
        measured = in_turns(turns, lambda ids: _each({i: pinned[i] for i in ids},
                                                     lambda actor: actor.measure.remote(WINDOW_S, 1)),
                            lambda best: bool(judge(device_findings(nodes, best), slow_below)))
        return {**measured, **failed}
    finally:
        for actor in pinned.values():
            ray.kill(actor)


def in_turns(turns: list[list[str]], window: Callable[[list[str]], dict[str, Any]],
             anyone_slow: Callable[[dict[str, Any]], bool], windows: int = WINDOWS,
             confirm: int = CONFIRM) -> dict[str, Any]:
    """Each node's best window per device, in passes of one window a node, turn by turn (window
    measures a turn's nodes at once); while `anyone_slow`, up to `confirm` more passes. A node
    that cannot be measured keeps why, and is measured no more."""
    best: dict[str, Any] = {}
    for done in range(windows + confirm):
        if done >= windows and not anyone_slow(best):
            break
        for turn in turns:
            answers = window([node_id for node_id in turn if not isinstance(best.get(node_id), str)])
            for node_id, answer in answers.items():
                best[node_id] = _best(best.get(node_id), answer)
    return best


def _best(kept: list[dict[str, Any]] | None, answer: list[dict[str, Any]] | str) -> list[dict[str, Any]] | str:
    if kept is None or isinstance(answer, str):
        return answer
    fastest = {device["device"]: device for device in kept}
    for device in answer:
        if device["flops"] > fastest.get(device["device"], {"flops": -1.0})["flops"]:
            fastest[device["device"]] = device
    return list(fastest.values())


def _each(actors: dict[str, Any], call: Callable) -> dict[str, Any]:
    refs = {node_id: call(actor) for node_id, actor in actors.items()}
    found: dict[str, Any] = {}
    for node_id, ref in refs.items():
        try:
            found[node_id] = ray.get(ref, timeout=BENCH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a node that cannot be measured is the finding
            found[node_id] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
    return found


def where(node: dict[str, Any], probe: dict[str, Any] | None) -> str:
    head = ", head" if "node:__internal_head__" in node["Resources"] else ""
    host = (probe or {}).get("host", "?")
    return f"node {node['NodeID'][:12]} (host {host}, {node['NodeManagerAddress']}{head})"


def _flops(value: float) -> str:
    return f"{value / 1e12:,.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:,.1f} GFLOP/s"


def _bandwidth(value: float) -> str:
    return f"{value / 1e6:,.0f} MB/s"


SLOW_FIX = ("A rank there would hold back every step of a run, as DDP waits for the slowest rank. Fix: find "
            "what else runs on it (top, nvidia-smi), check its clocks, temperature and links, or keep the run "
            "off it (`ray drain-node`, or replace it); `--strict` makes this warning fail the check.")


def matmul_check(nodes: list[dict[str, Any]], measured: dict[str, Any], probes: dict[str, dict[str, Any]],
                 slow_below: float) -> Check:
    failed = {node_id: why for node_id, why in measured.items() if isinstance(why, str)}
    by_id = {n["NodeID"]: n for n in nodes}
    findings = device_findings(nodes, measured)
    slow = judge(findings, slow_below)
    if failed:
        found = "; ".join(f"{where(by_id[i], probes.get(i))}: {why}" for i, why in failed.items())
        return Check("matmul", False, f"{len(failed)} of {len(nodes)} node(s) could not be measured ({found}). "
                     "Fix: free the node's devices (a run holding its GPUs) or see the versions check.")
    values = [f.value for f in findings]
    spread = f"{_flops(min(values))} to {_flops(max(values))}" if values else "nothing measured"
    units = f"{len(findings)} device(s) on {len(measured)} node(s)"
    if not slow:
        return Check("matmul", True, f"{units}: {spread}, none below {slow_below:g}x of its peers' median")
    named = "; ".join(f"{where(f.node, probes.get(f.node['NodeID']))} {f.unit}: {_flops(f.value)}, {f.ratio:.2f}x "
                      f"its peers' median ({_flops(f.peers_median)})" for f in slow)
    return Check("matmul", True, f"{named}. {SLOW_FIX}", warning=True)


def link_findings(nodes: list[dict[str, Any]], links: dict[str, dict[str, float]]) -> list[Finding]:
    """Each node's best pair: its own link's speed, whatever its peers'."""
    by_id = {n["NodeID"]: n for n in nodes}
    return [Finding(by_id[node_id], "link", max(peers.values())) for node_id, peers in links.items() if peers]


def link_check(nodes: list[dict[str, Any]], links: dict[str, dict[str, float]] | None,
               probes: dict[str, dict[str, Any]], slow_below: float) -> Check:
    if not links:
        return Check("links", True, "fewer than two nodes can hold a worker: no pair to measure")
    findings = link_findings(nodes, links)
    pairs = {tuple(sorted((a, b))) for a, peers in links.items() for b in peers}
    values = [f.value for f in findings]
    spread = f"{_bandwidth(min(values))} to {_bandwidth(max(values))}"
    if len(findings) < 3:
        return Check("links", True, f"{len(pairs)} pair(s): {spread} (a third node is needed to tell which end of "
                     "a slow pair is slow)")
    slow = judge(findings, slow_below, least=3)
    if not slow:
        return Check("links", True, f"{len(pairs)} pair(s) of {len(findings)} nodes, each node's best pair "
                     f"{spread}, none below {slow_below:g}x of its peers' median")
    named = "; ".join(f"{where(f.node, probes.get(f.node['NodeID']))}: at best {_bandwidth(f.value)} with any peer, "
                      f"{f.ratio:.2f}x its peers' median ({_bandwidth(f.peers_median)})" for f in slow)
    return Check("links", True, f"{named}. {SLOW_FIX}", warning=True)


def table(nodes: list[dict[str, Any]], measured: dict[str, Any], links: dict[str, dict[str, float]] | None,
          probes: dict[str, dict[str, Any]]) -> str:
    """One row a device: its matmul throughput and its node's best link."""
    rows = [("node", "host", "device", "matmul", "best link", "peers")]
    for node in nodes:
        node_id = node["NodeID"]
        devices = measured.get(node_id)
        peers = (links or {}).get(node_id) or {}
        link = _bandwidth(max(peers.values())) if peers else "-"
        met = ", ".join(peer[:12] for peer in peers) or "-"
        host = probes.get(node_id, {}).get("host", "?")
        if devices is None or isinstance(devices, str):
            rows.append((node_id[:12], host, "-", devices or "-", link, met))
            continue
        for device in devices:
            rows.append((node_id[:12], host, f"{device['device']} ({device['name']})", _flops(device["flops"]),
                         link, met))
    return text_table(rows)
