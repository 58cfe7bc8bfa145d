"""`orchestrator doctor`: preflight checks on a real 3-node loopback cluster, --nodes naming a node
held to a quarter of a core, the reading of NCCL's interface syntax, and the verdict on a gloo
group that did not form."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from conftest import run_cli
from node_faults import slowed_node
from specs import torch_spec

from orchestrator.cli.doctor_checks import gloo_check, interface_problem

LOOPBACK_ONLY = ["lo"]
TWO = ["eth0", "ib0", "lo"]


@pytest.mark.parametrize("variable, value, interfaces, selects", [
    ("NCCL_SOCKET_IFNAME", "eth", TWO, True),        # a prefix
    ("NCCL_SOCKET_IFNAME", "=eth", TWO, False),      # an exact name
    ("NCCL_SOCKET_IFNAME", "=eth0", TWO, True),
    ("NCCL_SOCKET_IFNAME", "ens,ib", TWO, True),     # any of a list
    ("NCCL_SOCKET_IFNAME", "^lo,docker", TWO, True),  # all but these
    ("NCCL_SOCKET_IFNAME", "^lo", LOOPBACK_ONLY, False),
    ("NCCL_SOCKET_IFNAME", "ib", LOOPBACK_ONLY, False),
    ("GLOO_SOCKET_IFNAME", "eth", TWO, False),       # gloo takes whole names
    ("GLOO_SOCKET_IFNAME", "eth0", TWO, True),
    ("NCCL_SOCKET_IFNAME", None, LOOPBACK_ONLY, True),  # unset: the library chooses
])
def test_an_interface_variable_is_read_with_ncclS_syntax(variable, value, interfaces, selects):
    problem = interface_problem(variable, value, interfaces)
    assert (problem is None) == selects
    if problem:
        assert f"{variable}={value}" in problem and ", ".join(interfaces) in problem


def _node(node_id: str, address: str) -> dict:
    return {"NodeID": node_id, "NodeManagerAddress": address, "Resources": {"GPU": 1.0}}


def _probe(host: str, host_address: str, gloo_ifname: str | None = None) -> dict:
    return {"host": host, "host_address": host_address, "env": {"GLOO_SOCKET_IFNAME": gloo_ifname}}


def test_a_gloo_group_that_did_not_form_names_the_node_whose_host_name_resolves_to_loopback():
    # Stock Ubuntu: each host's /etc/hosts maps its own name to 127.0.1.1; Ray reaches the nodes
    # at 10.0.0.x and NCCL finds eth0 by itself, but gloo offers 127.0.1.1 to its peers.
    nodes = [(_node("a" * 32, "10.0.0.1"), _probe("gpu-a", "127.0.1.1")),
             (_node("b" * 32, "10.0.0.2"), _probe("gpu-b", "127.0.1.1", gloo_ifname="eth0")),
             (_node("c" * 32, "10.0.0.3"), _probe("gpu-c", "10.0.0.3"))]
    check = gloo_check({"error": "DistNetworkError: Connect timeout"}, "nccl", 60.0, nodes)
    assert not check.ok and check.name == "gloo group"
    assert "3 worker(s), one per node, could not form a gloo group beside the NCCL process group within 60 s" \
        in check.detail
    assert "DistNetworkError: Connect timeout" in check.detail
    # Only the node that offers a loopback address without GLOO_SOCKET_IFNAME is named.
    assert f"node {'a' * 12}: host name 'gpu-a' resolves to 127.0.1.1 (Ray reaches it at 10.0.0.1)" in check.detail
    assert "gpu-b" not in check.detail and "gpu-c" not in check.detail
    assert "Fix: set GLOO_SOCKET_IFNAME" in check.detail and "`hostname -i`" in check.detail

    passed = gloo_check({"form_s": 0.02, "latency_s": 0.0004}, "nccl", 60.0, nodes)
    assert passed.ok and "formed in 0.02 s" in passed.detail and "latency 0.40 ms" in passed.detail


@pytest.fixture
def cluster(three_nodes):
    """The session's shared loopback cluster (tests/helpers/clusters.py): a head without CPUs, three 1-CPU nodes."""
    return three_nodes


def _doctor(cluster, tmp_path, *extra, **env):
    spec = torch_spec("doctor", tmp_path)
    spec["env"] = env
    spec["data"] = {"train": {"path": "jobs/data/digits/train.parquet"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = run_cli("doctor", str(path), "--address", cluster.address, *extra, timeout=400)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_doctor_passes_a_sound_cluster_and_names_a_gpu_shortfall_a_missing_interface_storage_and_data(cluster, tmp_path):
    # --check-gloo: the gloo group a GPU run forms beside NCCL, checked here between CPU nodes.
    code, out = _doctor(cluster, tmp_path, "--check-gloo", NCCL_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo")
    assert code == 0, out
    # The driver and the four nodes (a head without CPUs, three 1-CPU nodes), one row each.
    assert len(re.findall(r"^[0-9a-f]{12}( \(head\))?\s", out, re.M)) == 4, out
    assert re.search(r"^driver\s", out, re.M)
    for check in ("versions", "storage", "data", "capacity", "interface (NCCL_SOCKET_IFNAME)",
                  "interface (GLOO_SOCKET_IFNAME)", "all-reduce (gloo)", "gloo group"):
        assert f"PASS  {check}:" in out, out
    latency = re.search(r"all-reduce \(gloo\): 4 worker\(s\), one per node: latency ([\d.]+) ms", out)
    assert latency and 0 < float(latency.group(1)) < 5000, out
    gloo = re.search(r"PASS  gloo group: 4 worker\(s\), one per node: a separate gloo group beside the training "
                     r"process group formed in ([\d.]+) s; all-reduce latency ([\d.]+) ms", out)
    assert gloo and float(gloo.group(1)) < 60 and 0 < float(gloo.group(2)) < 5000, out
    assert "doctor: all 8 checks passed" in out
    assert not any(p.startswith(".orchestrator-doctor") and os.listdir(tmp_path / p) for p in os.listdir(tmp_path))

    # /proc takes no files: storage no node can write.
    code, out = _doctor(cluster, tmp_path, "--set", "scaling.use_gpu=true", "--storage", "/proc/runs",
                        "--set", f"data.train.path={tmp_path}/missing.parquet", NCCL_SOCKET_IFNAME="ib")
    assert code == 1, out
    capacity = next(line for line in out.splitlines() if line.startswith("FAIL  capacity:"))
    assert "2 worker(s) x {CPU: 1, GPU: 1}" in capacity and "hold at most 0" in capacity and "GPU: 0" in capacity
    assert "Fix:" in capacity
    interface = next(line for line in out.splitlines() if line.startswith("FAIL  interface (NCCL_SOCKET_IFNAME):"))
    assert "on all 4 nodes: NCCL_SOCKET_IFNAME=ib selects none of its interfaces (" in interface
    assert re.search(r"interfaces \(([\w.-]+, )*lo(, [\w.-]+)*\)", interface) and "Fix:" in interface
    storage = next(line for line in out.splitlines() if line.startswith("FAIL  storage:"))
    assert "/proc/runs could not be written from node" in storage and "Fix:" in storage
    data = next(line for line in out.splitlines() if line.startswith("FAIL  data:"))
    assert f"on all 4 nodes: {tmp_path}/missing.parquet does not exist here" in data and "Fix:" in data
    assert "PASS  versions:" in out
    assert "Traceback" not in out


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_doctor_nodes_names_a_node_held_to_a_quarter_core_and_strict_fails_on_it(cluster):
    slow = sorted(cluster.worker_nodes, key=lambda node: node.node_id)[0]
    with slowed_node(slow, 0.25):  # a CPU quota on the node's raylet and every process it starts
        done = run_cli("doctor", "--nodes", "--strict", "--address", cluster.address, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # One row a 1-CPU node in the nodes' table; the head, kept free of work, is not measured.
    rows = re.findall(r"^([0-9a-f]{12})\s+\S+\s+cpu \(1 thread, [^)]+\)\s+([\d.,]+) GFLOP/s\s+([\d,]+) MB/s", out, re.M)
    assert sorted(row[0] for row in rows) == sorted(node.node_id[:12] for node in cluster.worker_nodes), out
    matmul = next(line for line in out.splitlines() if line.startswith("WARN  matmul:"))
    named = re.findall(r"node ([0-9a-f]{12}) \(host [^,]+, 127\.0\.0\.1\) cpu: [\d.,]+ GFLOP/s, ([\d.]+)x its peers' "
                       r"median", matmul)
    assert [node for node, _ in named] == [slow.node_id[:12]], matmul
    assert float(named[0][1]) < 0.6 and "Fix:" in matmul
    assert re.search(r"^(PASS|WARN)  links: ", out, re.M), out
    assert re.search(r"^doctor: all \d+ checks passed, [12] with a warning \(failed by --strict\)$", out, re.M), out
    assert "Traceback" not in out
