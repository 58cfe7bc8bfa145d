"""doctor --nodes' verdicts: which node or device is named against its peers, and why a node's
link is its best pair's (cli/doctor_nodes.py)."""

from __future__ import annotations

import pytest

from orchestrator.cli import doctor_nodes
from orchestrator.cli.doctor_nodes import Finding, judge, link_check, link_findings, matmul_check


def _node(name: str, cpus: float = 1) -> dict:
    return {"NodeID": name * 12, "NodeManagerAddress": "10.0.0." + str(ord(name) % 200), "Resources": {"CPU": cpus}}


NODES = [_node(n) for n in "abcd"]
PROBES = {n["NodeID"]: {"host": f"host-{n['NodeID'][0]}"} for n in NODES}


def _devices(flops: dict[str, float]) -> dict[str, list[dict]]:
    return {name * 12: [{"device": "cpu", "name": "1 thread", "flops": value}] for name, value in flops.items()}


def test_a_node_at_a_quarter_of_its_peers_is_named_with_its_host_address_and_ratio():
    check = matmul_check(NODES, _devices({"a": 100e9, "b": 104e9, "c": 25e9, "d": 98e9}), PROBES, 0.7)
    assert check.ok and check.warning
    assert check.line().startswith("WARN  matmul: node cccccccccccc (host host-c, 10.0.0.99) cpu: 25.0 GFLOP/s, "
                                   "0.25x its peers' median (100.0 GFLOP/s).")
    assert "aaaa" not in check.detail and "bbbb" not in check.detail and "Fix:" in check.detail


def test_even_nodes_and_noise_within_the_fraction_name_nobody():
    check = matmul_check(NODES, _devices({"a": 100e9, "b": 80e9, "c": 120e9, "d": 95e9}), PROBES, 0.7)
    assert check.ok and not check.warning
    assert check.detail == "4 device(s) on 4 node(s): 80.0 GFLOP/s to 120.0 GFLOP/s, none below 0.7x of its peers' median"


def test_with_two_nodes_the_slow_one_is_still_named_against_the_other():
    # The group's median of two would sit halfway and hide a node at 0.6x; its peer's does not.
    slow = judge([Finding(NODES[0], "cpu", 60.0), Finding(NODES[1], "cpu", 100.0)], 0.7)
    assert [(f.node["NodeID"][0], round(f.ratio, 2)) for f in slow] == [("a", 0.6)]
    assert judge([Finding(NODES[0], "cpu", 60.0)], 0.7) == []  # nobody to compare with


def test_a_node_that_could_not_be_measured_fails_the_check_by_name():
    measured = {**_devices({"a": 100e9, "b": 100e9}), "c" * 12: "GetTimeoutError: the actor did not start"}
    check = matmul_check(NODES[:3], measured, PROBES, 0.7)
    assert not check.ok and check.line().startswith("FAIL  matmul: 1 of 3 node(s) could not be measured (node "
                                                    "cccccccccccc (host host-c, 10.0.0.99): GetTimeoutError")


def test_each_gpu_is_judged_on_its_own():
    measured = {"a" * 12: [{"device": f"cuda:{i}", "name": "H100", "flops": 700e12} for i in range(4)],
                "b" * 12: [{"device": "cuda:0", "name": "H100", "flops": 690e12},
                           {"device": "cuda:1", "name": "H100", "flops": 300e12}]}
    check = matmul_check(NODES[:2], measured, PROBES, 0.7)
    assert check.warning and "node bbbbbbbbbbbb (host host-b, 10.0.0.98) cuda:1: 300.0 TFLOP/s, 0.43x" in check.detail
    assert "cuda:0" not in check.detail


class _SharedHost:
    """Nodes measured in turns on one clock (a window a tick): `slow` nodes always run at a quarter,
    and while `busy` another process's load halves whichever node runs then."""

    def __init__(self, slow: set[str] = frozenset(), busy: range = range(0), failing: set[str] = frozenset()):
        self.slow, self.busy, self.failing = slow, busy, failing
        self.tick, self.calls = 0, []

    def window(self, node_ids: list[str]) -> dict:
        self.calls.append(list(node_ids))
        answers = {}
        for node_id in node_ids:
            flops = 100e9 * (0.25 if node_id in self.slow else 1) * (0.5 if self.tick in self.busy else 1)
            answers[node_id] = ("RayActorError: the node died" if node_id in self.failing else
                                [{"device": "cpu", "name": "1 thread", "flops": flops}])
        self.tick += 1
        return answers


def _measure(host: _SharedHost, turns: list[list[str]]) -> dict:
    nodes = [n for n in NODES if n["NodeID"] in {i for turn in turns for i in turn}]
    slow = lambda best: bool(judge(doctor_nodes.device_findings(nodes, best), 0.7))  # noqa: E731
    return doctor_nodes.in_turns(turns, host.window, slow)


def test_nodes_of_one_host_take_turns_a_window_at_a_time_so_a_burst_of_load_names_nobody():
    # a's first three windows' worth of time is loaded: measured a node after another, window by
    # window, the burst falls on a, b and c alike, and each one's best window is a quiet one.
    a, b, c, d = (n["NodeID"] for n in NODES)
    host = _SharedHost(busy=range(0, 6))
    measured = _measure(host, [[a, d], [b], [c]])
    assert host.calls == [[a, d], [b], [c]] * doctor_nodes.WINDOWS  # no confirming pass: nobody was slow
    assert {node_id[0]: devices[0]["flops"] for node_id, devices in measured.items()} == {
        "a": 100e9, "b": 100e9, "c": 100e9, "d": 100e9}


def test_a_node_slow_only_for_a_moment_is_measured_again_and_not_named():
    # Load on b's every window of the first passes (ticks 1, 3, ... while a and b alternate).
    a, b = NODES[0]["NodeID"], NODES[1]["NodeID"]
    host = _SharedHost(busy=range(1, 2 * doctor_nodes.WINDOWS, 2))
    measured = _measure(host, [[a], [b]])
    assert len(host.calls) == 2 * (doctor_nodes.WINDOWS + 1)  # one more pass, after which b is no longer slow
    assert matmul_check(NODES[:2], measured, PROBES, 0.7).warning is False


def test_a_node_slow_in_every_window_is_named_after_the_confirming_passes_and_a_failed_one_is_left_alone():
    a, b, c, d = (n["NodeID"] for n in NODES)
    host = _SharedHost(slow={c}, failing={d})
    measured = _measure(host, [[a], [b], [c], [d]])
    # Every confirming pass, as c stays at a quarter.
    assert len(host.calls) == 4 * (doctor_nodes.WINDOWS + doctor_nodes.CONFIRM)
    # d's error is the finding: it is measured no more.
    assert host.calls[3] == [d] and all(call == [] for call in host.calls[7::4])
    check = matmul_check(NODES, measured, PROBES, 0.7)
    assert not check.ok and "dddddddddddd (host host-d, 10.0.0.100): RayActorError: the node died" in check.detail
    measured.pop(d)
    check = matmul_check(NODES[:3], measured, PROBES, 0.7)
    assert check.warning and check.detail.startswith("node cccccccccccc (host host-c, 10.0.0.99) cpu: 25.0 GFLOP/s, "
                                                     "0.25x its peers' median (100.0 GFLOP/s).")


def _links(pairs: dict[tuple[str, str], float]) -> dict[str, dict[str, float]]:
    links: dict[str, dict[str, float]] = {}
    for (a, b), value in pairs.items():
        links.setdefault(a * 12, {})[b * 12] = value
        links.setdefault(b * 12, {})[a * 12] = value
    return links


def test_a_slow_link_names_its_node_not_the_healthy_peers_it_met():
    # d is slow in both of its pairs; a, b and c each met one healthy peer as well.
    links = _links({("a", "b"): 3000e6, ("c", "d"): 400e6, ("a", "c"): 2900e6, ("b", "d"): 450e6})
    assert {f.node["NodeID"][0]: f.value for f in link_findings(NODES, links)} == {
        "a": 3000e6, "b": 3000e6, "c": 2900e6, "d": 450e6}
    check = link_check(NODES, links, PROBES, 0.7)
    assert check.warning and check.detail.startswith("node dddddddddddd (host host-d, 10.0.0.100): at best 450 MB/s "
                                                     "with any peer, 0.15x its peers' median (3,000 MB/s).")
    assert "aaaa" not in check.detail and "cccc" not in check.detail


def test_two_nodes_cannot_tell_which_end_of_a_slow_link_is_slow():
    check = link_check(NODES[:2], _links({("a", "b"): 100e6}), PROBES, 0.7)
    assert check.ok and not check.warning and "a third node is needed" in check.detail


@pytest.mark.parametrize("links, text", [(None, "no pair to measure"), ({}, "no pair to measure")])
def test_no_pair_is_said_plainly(links, text):
    assert text in link_check(NODES[:1], links, PROBES, 0.7).detail
