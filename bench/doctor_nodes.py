"""`orchestrator doctor --nodes`: its wall time on a 3-node loopback cluster, against plain
`orchestrator doctor` on the same cluster in the same run, and the report with one node held to a
fraction of a core (a CPU quota through a cgroup on its raylet and every process it starts,
tests/helpers/node_faults.py), which must name that node.

The cluster is a head without CPUs and three 1-CPU nodes (tests/helpers/node_faults.py), all on
this machine's cores: the nodes' matmuls take turns, since they share one host.

    python bench/doctor_nodes.py [--share 0.25] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))

from node_faults import loopback_cluster, slowed_node  # noqa: E402


class _NoPytest:
    """slowed_node skips a test where no cgroup can be made; here that ends the bench."""

    @staticmethod
    def skip(reason: str):
        raise SystemExit(f"bench/doctor_nodes.py: {reason}")


def doctor(address: str, *extra: str) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "doctor", "--address", address, *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, done.returncode, done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--share", type=float, default=0.25, help="the slowed node's share of one core")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sys.modules.setdefault("pytest", _NoPytest)  # type: ignore[arg-type]
    with loopback_cluster(3) as cluster:
        plain, nodes = [], []
        for _ in range(args.rounds):  # interleaved, so that the machine's drift hits both alike
            seconds, code, out = doctor(cluster.address)
            assert code == 0, out
            plain.append(seconds)
            seconds, code, out = doctor(cluster.address, "--nodes")
            assert code == 0 and "PASS  matmul:" in out, out
            nodes.append(seconds)
        print(out.split("\n\n")[1])  # the nodes' table of the last sound round
        slow = sorted(cluster.worker_nodes, key=lambda node: node.node_id)[0]
        with slowed_node(slow, args.share):
            seconds, code, out = doctor(cluster.address, "--nodes", "--strict")
        named = re.findall(r"node ([0-9a-f]{12}) \(host [^)]*\) cpu: [\d.,]+ GFLOP/s, ([\d.]+)x", out)
        print("\n".join(line for line in out.splitlines() if line.startswith(("WARN", "doctor:"))))
    print(f"\ndoctor:          {statistics.median(plain):.1f} s (median of {args.rounds})")
    print(f"doctor --nodes:  {statistics.median(nodes):.1f} s, "
          f"{statistics.median(nodes) / statistics.median(plain):.2f}x plain doctor")
    print(f"node {slow.node_id[:12]} held to {args.share:g} of a core: doctor --nodes --strict took {seconds:.1f} s, "
          f"exit {code}, named {named or 'nobody'}")
    ok = code == 1 and [node for node, _ in named] == [slow.node_id[:12]]
    print("PASS: the slowed node is named, and only it" if ok else "FAIL: the slowed node was not named alone")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
