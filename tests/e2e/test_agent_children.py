"""A ctx or Lightning job's ranks are children of their node's agent (the Ray Train worker),
restarted in place.

One run of each meets three faults, one per attempt: rank 1 SIGKILLed, rank 0 SIGSTOPped
(frozen), rank 1 raising an infrastructure error. Each is met by a restart of every rank in place:
the same agents (each rank's parent pid is unchanged), TORCHELASTIC_RESTART_COUNT one higher as
the rank sees it, every rank's stacks in its log after the hang, and the weights bit-equal to the
clean run's. Killing an agent itself costs Ray Train's group restart, and still ends with the
clean weights. One agent can run several ranks (scaling.nproc_per_node), as torchrun's agent does.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from cli_runs import BackgroundRun, run_spec
from specs import lightning_spec, torch_spec

pytestmark = pytest.mark.slow

HANG_TIMEOUT_S = 6


def _starts(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", ["torch", "lightning"])
def test_a_killed_a_frozen_and_a_failing_rank_are_each_restarted_in_place_under_the_same_agents(
        tmp_path, path, request):
    clean = request.getfixturevalue(f"clean_{path}")
    starts = tmp_path / "starts.jsonl"
    faults = [{"at": 15, "rank": 1, "how": "kill"}, {"at": 35, "rank": 0, "how": "stop"},
              {"at": 55, "rank": 1, "how": "raise"}]
    for index, fault in enumerate(faults):
        fault["marker"] = str(tmp_path / f"fault-{index}")
    if path == "torch":
        spec = torch_spec("in-place", tmp_path, "faulty:torch_loop_three_faults", faults=faults, starts=str(starts))
    else:
        spec = lightning_spec("in-place", tmp_path, "faulty.ThreeFaultsClassifier", faults=faults, starts=str(starts))
    spec["failure"].update(max_failures=3, hang_timeout_s=HANG_TIMEOUT_S)
    result = run_spec(spec, str(tmp_path))

    assert all(os.path.exists(f["marker"]) for f in faults), "a fault was never injected"
    assert result.status == "finished"
    assert [(f["classification"], f["in_place"]) for f in result.failures] == [
        ("infrastructure", True), ("hang", True), ("infrastructure", True)]
    assert "SIGKILL" in result.failures[0]["ranks"][0]["error"]
    assert result.failures[1]["hang"]["ranks"] == [0]
    # The hang verdict put every rank's Python stacks into its log (faulthandler's dump).
    for rank in (0, 1):
        assert "most recent call first" in (tmp_path / "in-place" / "logs" / f"rank-{rank}.log").read_text()
    assert "ConnectionResetError: injected" in result.failures[2]["ranks"][0]["error"]
    seen = _starts(starts)
    for rank in (0, 1):
        mine = [s for s in seen if s["rank"] == rank]
        # Four starts of the rank, each a new process under one and the same agent.
        assert [s["restart_count"] for s in mine] == [0, 1, 2, 3]
        assert [s["attempt"] for s in mine] == [1, 2, 3, 4]
        assert len({s["ppid"] for s in mine}) == 1 and len({s["pid"] for s in mine}) == 4
    assert result.global_step == clean.global_step
    assert result.weights_sha256 == clean.weights_sha256


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
@pytest.mark.parametrize("path", ["torch", "lightning"])
def test_one_agent_runs_a_nodes_ranks_and_restarts_them_in_place_with_the_weights_of_one_rank_a_worker(
    tmp_path, path, request
):
    """scaling.nproc_per_node 2 on one worker: both ranks are children of one agent, a killed one
    is restarted in place with its peer, and the weights are bit-equal to two workers of one rank."""
    clean = request.getfixturevalue(f"clean_{path}")
    starts = tmp_path / "starts.jsonl"
    faults = [{"at": 30, "rank": 1, "how": "kill", "marker": str(tmp_path / "fault-0")}]
    # Paced (0.1 s a step), the fault comes seconds after the ranks settled, as most faults do.
    if path == "torch":
        spec = torch_spec("per-node", tmp_path, "faulty:torch_loop_three_faults", faults=faults, starts=str(starts),
                          pace_s=0.1)
    else:
        spec = lightning_spec("per-node", tmp_path, "faulty.ThreeFaultsClassifier", faults=faults, starts=str(starts),
                              pace_s=0.1)
    spec["scaling"] = {"num_workers": 1, "nproc_per_node": 2}
    result = run_spec(spec, str(tmp_path))

    assert os.path.exists(faults[0]["marker"]), "the fault was never injected"
    assert result.status == "finished"
    assert [(f["classification"], f["in_place"]) for f in result.failures] == [("infrastructure", True)]
    seen = _starts(starts)
    assert sorted((s["rank"], s["restart_count"]) for s in seen) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # One agent: every start of either rank has the same parent.
    assert len({s["ppid"] for s in seen}) == 1
    # The restarted ranks' processes were its spares, started before the fault: the restart did
    # not wait for Python, torch and Lightning to import (agent/spares.py).
    fault_at = os.path.getmtime(faults[0]["marker"])
    assert all(s["created"] < fault_at for s in seen if s["restart_count"] == 1), (seen, fault_at)
    assert result.global_step == clean.global_step
    assert result.weights_sha256 == clean.weights_sha256


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(500)
def test_a_killed_agent_costs_a_group_restart_and_still_ends_with_the_clean_weights(tmp_path, clean_torch):
    starts = tmp_path / "starts.jsonl"
    spec = torch_spec("agent-killed", tmp_path, "faulty:torch_loop_three_faults", faults=[], starts=str(starts),
                      pace_s=0.1)
    run = BackgroundRun(spec, str(tmp_path))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (tmp_path / "agent-killed" / "checkpoints").is_dir():
            time.sleep(0.5)
        assert starts.exists(), "the run never started"
        agent = next(s["ppid"] for s in _starts(starts) if s["rank"] == 1)
        os.kill(agent, signal.SIGKILL)
        result = run.result(timeout=400)
    finally:
        BackgroundRun.end_all()

    assert result.status == "finished"
    assert [(f["classification"], f["in_place"]) for f in result.failures] == [("infrastructure", False)]
    seen = _starts(starts)
    # The new group's rank 1 runs under a new agent.
    assert len({s["ppid"] for s in seen if s["rank"] == 1}) == 2
    assert result.global_step == clean_torch.global_step
    assert result.weights_sha256 == clean_torch.weights_sha256
