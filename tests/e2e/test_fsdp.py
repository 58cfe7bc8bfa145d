"""Sharded training (torch.strategy: fsdp) on CPU: every worker writes its own shard of each
checkpoint, rank 0 commits when all are there, an interrupted run resumes bit for bit, and a
checkpoint resumes at another world size.

FSDP here is PyTorch's fully_shard over gloo; the same code runs over NCCL with use_gpu.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
from cli_runs import run_spec
from conftest import assert_resumed_to_clean_weights, isolated_state, run_cli
from specs import torch_spec

from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

# Random each run; set ORCHESTRATOR_TEST_KILL_STEP to replay one.
KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_KILL_STEP", random.Random().randint(5, 55)))


def fsdp_spec(name, storage_dir, loop="jobs.digits_torch:train_loop", fault=None):
    spec = torch_spec(name, storage_dir, loop, fault)
    spec["torch"]["strategy"] = "fsdp"
    return spec


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The uninterrupted FSDP run: the killed run is compared with it, and the resized run
    continues a copy of its checkpoints (one Ray run fewer than training a first run for it)."""
    storage = tmp_path_factory.mktemp("clean-fsdp")
    with isolated_state(tmp_path_factory):
        return run_spec(fsdp_spec("clean", storage), str(storage))


@pytest.mark.timeout(600)
def test_an_fsdp_job_writes_one_shard_per_rank_and_resumes_from_a_kill_to_identical_weights(tmp_path, clean):
    assert clean.status == "finished"

    committed = CheckpointStore.for_run(clean.run_dir).committed()
    assert committed
    for info in committed:
        assert info.manifest.sharded and info.manifest.world_size == 2
        # Each rank's state file and its receipt: the manifest lists only the state files.
        assert sorted(info.manifest.files) == ["state-00000.pt", "state-00001.pt"], info.name
        sizes = [info.manifest.files[f].size for f in sorted(info.manifest.files)]
        assert all(size > 0 for size in sizes)

    fault = {"kill_at": KILL_STEP, "marker": str(tmp_path / "kill-marker"), "kill_rank": 1}
    killed = run_spec(fsdp_spec("killed", tmp_path, "faulty:torch_loop_killed_once", fault), str(tmp_path))
    assert_resumed_to_clean_weights(killed, clean, fault["marker"], KILL_STEP)


@pytest.mark.timeout(300)
def test_a_sharded_checkpoint_resumes_at_another_world_size_and_is_refused_by_another_strategy(tmp_path, clean):
    assert clean.status == "finished" and clean.world_size == 2
    # A copy of the clean run's directory (as a user moving a run would copy it): this test's
    # resumes must not change the run the other test reads.
    shutil.copytree(clean.run_dir, tmp_path / "clean")
    spec_file = tmp_path / "clean.yaml"
    spec_file.write_text(json.dumps(fsdp_spec("clean", tmp_path)))  # JSON is YAML

    # Written by 2 ranks, resumed by 1: the shards are stitched together (tests/unit/rank/test_sharding.py
    # checks the tensors themselves), and a fourth epoch trains on.
    resized = run_cli("run", str(spec_file), "--set", "torch.max_epochs=4", "--set", "scaling.num_workers=1")
    assert resized.returncode == 0, resized.stderr
    summary = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["world_size"] == 1 and summary["epochs"] == 4
    assert summary["resumed_from"]["step"] == clean.global_step
    newest = CheckpointStore.for_run(str(tmp_path / "clean")).committed()[-1]
    assert newest.manifest.world_size == 1 and sorted(newest.manifest.files) == ["state-00000.pt"]

    unsharded = run_cli("run", str(spec_file), "--set", "torch.max_epochs=5", "--set", "torch.strategy=ddp")
    assert unsharded.returncode == 2, unsharded.stderr
    assert "torch.strategy: fsdp" in unsharded.stderr and "Traceback" not in unsharded.stderr
