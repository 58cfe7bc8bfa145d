"""`orchestrator status`: every run under a storage location with its state, told apart by the
writer lease (running, driver died) and the summary (finished, failed, stopped)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch
from conftest import run_cli

from orchestrator.checkpoint import CheckpointStore, Manifest, dumps_state
from orchestrator.checkpoint.lease import RunLease
from orchestrator.cli.run_states import run_states
from orchestrator.observe.result import RunResult, write_summary
from orchestrator.run_dir import RunDir


def checkpoint(layout: RunDir, step: int, world_size: int = 2) -> None:
    manifest = Manifest(step=step, epoch=step // 10, batch_in_epoch=step % 10, world_size=world_size, kind="torch",
                        files={})
    CheckpointStore(layout.location).commit(manifest, {"state.pt": dumps_state({"w": torch.zeros(2)})})


def summary(layout: RunDir, status: str, **fields) -> None:
    result = RunResult(name=layout.location.path.rsplit("/", 1)[-1], status=status, run_dir=layout.uri,
                       world_size=2, global_step=30, epochs=3, restarts=1, goodput={"goodput": 0.9}, **fields)
    write_summary(layout.location, result)


def test_status_tells_running_finished_failed_and_a_dead_driver_apart(tmp_path):
    root = str(tmp_path / "runs")
    finished, failed, died, running = (RunDir.of(root, n) for n in ("done", "broken", "orphan", "live"))

    checkpoint(finished, 30)
    with RunLease.acquire(finished):  # released when the driver ends
        summary(finished, "finished")
    checkpoint(failed, 10)
    with RunLease.acquire(failed):
        summary(failed, "failed")
    # A driver that ended mid-run without releasing its lease (as if SIGKILLed): its process is gone.
    checkpoint(died, 20)
    subprocess.run([sys.executable, "-c", "import os, sys\nfrom orchestrator.checkpoint.lease import RunLease\n"
                    "from orchestrator.run_dir import RunDir\nRunLease.acquire(RunDir.at(sys.argv[1]))\nos._exit(0)",
                    died.uri], check=True, timeout=120)
    # A live driver (this process) holding its run, a stale summary of an earlier run beside it.
    summary(running, "finished")
    checkpoint(running, 40, world_size=3)
    live = RunLease.acquire(running)
    try:
        states = {r["run"]: r for r in run_states(root, now=time.time())}
    finally:
        live.release()

    assert {name: r["state"] for name, r in states.items()} == {
        "broken": "failed", "done": "finished", "live": "running", "orphan": "driver died"}
    assert states["orphan"]["step"] == 20 and states["orphan"]["checkpoint"].endswith("step-000000020")
    assert states["live"]["world_size"] == 3 and states["live"]["step"] == 40
    assert states["done"]["restarts"] == 1 and states["done"]["goodput"] == 0.9
    assert 0 <= states["done"]["checkpoint_age_s"] < 60


def test_the_status_command_prints_a_table_or_json_and_names_a_missing_run(tmp_path):
    root = tmp_path / "runs"
    layout = RunDir.of(str(root), "done")
    checkpoint(layout, 30)
    summary(layout, "finished", slowest_rank={"rank": 1, "node_id": "n1", "host": "gpu-b", "work_s": 0.045,
                                              "peers_median_s": 0.03, "ratio": 1.5})

    table = run_cli("status", "--storage", str(root), timeout=60)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["run", "state", "step"] and row.split()[:3] == ["done", "finished", "30"]
    assert header.split()[-1] == "slowest" and row.endswith("rank 1 1.50x")  # its own work a step, against its peers'

    records = json.loads(run_cli("status", "done", "--storage", str(root), "--json", timeout=60).stdout)
    assert records[0]["state"] == "finished" and records[0]["checkpoint"].endswith("step-000000030")

    missing = run_cli("status", "nope", "--storage", str(root), timeout=60)
    assert missing.returncode == 2 and "run 'nope' was not found" in missing.stderr
