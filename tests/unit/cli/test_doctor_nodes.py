"""doctor --nodes' verdicts: which node or device is named against its peers, and why a node's
link is its best pair's (cli/doctor_nodes.py)."""

from __future__ import annotations

import pytest

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
