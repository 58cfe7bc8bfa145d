"""A rank slowed for real is named while the run goes on, on every path: a ctx loop, a
LightningModule and a torchrun script, each with rank 1 sleeping 1.5x as long as its peer in its own
work a step (tests/helpers/straggler_jobs.py). The warning names the rank, its node and host;
summary.json keeps it, with the slowest rank and the steps' wait for it. Every other run of the
suite has even ranks and must name nobody: tests/helpers/cli_runs.py checks each one's summary.
straggler_after_s is short here so that the runs are short; the default window's detection time is
measured in bench/stragglers.py. These runs are local (one node, no cluster); the Ray path's
straggler shares a run on Ray with a stop on S3 storage: tests/e2e/test_stops_on_ray.py."""

from __future__ import annotations

import os
import socket

import pytest
from cli_runs import run_spec
from conftest import REPO

pytestmark = pytest.mark.slow

STEPS, WORK_S, AFTER_S = 160, 0.03, 3.0


def _spec(path: str, name: str, storage, slow_factor: float = 1.5) -> dict:
    slow = {"work_s": WORK_S, "slow_rank": 1, "slow_factor": slow_factor}
    spec = {"name": name, "storage": str(storage), "scaling": {"num_workers": 2},
            "failure": {"max_failures": 0, "straggler_after_s": AFTER_S},
            "checkpoint": {"every_n_steps": 1000}}
    if path == "torch":
        spec["torch"] = {"train_loop": "straggler_jobs:train_loop", "max_epochs": 1,
                         "config": {"steps": STEPS, **slow}}
    elif path == "lightning":
        spec["lightning"] = {"model": {"class_path": "straggler_jobs.SlowRankModule", "init_args": slow},
                             "data": {"class_path": "straggler_jobs.RandomData", "init_args": {"steps": STEPS}},
                             "trainer": {"max_epochs": 1}}
    else:
        script = os.path.join(REPO, "tests", "helpers", "straggler_script.py")
        spec["script"] = {"path": script, "args": ["--steps", str(STEPS), "--work_s", str(WORK_S),
                                                   "--slow_rank", "1", "--slow_factor", str(slow_factor)]}
    return spec


@pytest.mark.timeout(400)
@pytest.mark.parametrize("path", ["torch", "lightning", "script"])
def test_a_rank_slowed_by_half_is_named_with_its_node_and_host(path, tmp_path):
    lines: list[str] = []
    slowed = run_spec(_spec(path, f"slowed-{path}", tmp_path), str(tmp_path), lines=lines)
    warnings = [line for line in lines if "is a straggler" in line]
    assert len(warnings) == 1, "\n".join(lines[-40:])
    host = socket.gethostname()
    assert "rank 1 (node " in warnings[0] and f"host {host}" in warnings[0], warnings[0]
    [record] = slowed.stragglers
    assert record["rank"] == 1 and record["host"] == host and 1.3 <= record["ratio"] < 2.0, record
    assert slowed.slowest_rank["rank"] == 1 and slowed.goodput["straggler_wait_s"] > 0
