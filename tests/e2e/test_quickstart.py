"""End to end on real local Ray clusters: the shipped quickstart, its resume from its Parquet data, and S3
storage. (The torch job's determinism across runs: test_resume's killed-at-a-random-step test.)"""

from __future__ import annotations

import json
import math
import os
import random

import pytest
import yaml
from cli_runs import run_spec
from conftest import REPO, assert_resumed_to_clean_weights, isolated_state

import orchestrator
from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow


def torch_spec(name: str, storage_dir, **torch_overrides) -> dict:
    return {
        "name": name,
        "storage": str(storage_dir),
        "seed": 0,
        "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 3,
                  "config": {"hidden": 64, "lr": 0.05, "batch_size": 32}, **torch_overrides},
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": 15, "keep_last": 2},
    }


def quickstart_spec(storage_dir) -> dict:
    """The shipped quickstart, its runs kept under `storage_dir`."""
    with open(os.path.join(REPO, "jobs", "quickstart.yaml")) as f:
        return {**yaml.safe_load(f), "storage": str(storage_dir)}


def _steps_the_spec_takes(spec: dict) -> int:
    """Optimizer steps of a whole run of `spec`, from the spec and its Parquet data alone: each
    epoch, every worker takes its share of the rows (the last share padded to a full one) in
    batches of batch_size, the last one partial."""
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(os.path.join(REPO, spec["data"]["train"]["path"])).metadata.num_rows
    per_worker = math.ceil(rows / spec["scaling"]["num_workers"])
    return spec["lightning"]["trainer"]["max_epochs"] * math.ceil(per_worker / spec["data"]["train"]["batch_size"])


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """One run of the shipped quickstart, shared by the tests that inspect it: run as the README's
    first command runs it, in local mode (no cluster named or up)."""
    runs = tmp_path_factory.mktemp("runs")
    with isolated_state(tmp_path_factory):
        return run_spec(quickstart_spec(runs), str(runs))


@pytest.mark.timeout(300)
def test_quickstart_reaches_90_percent_test_accuracy(quickstart):
    assert quickstart.status == "finished"
    assert quickstart.metrics["test_acc"] >= 0.90


@pytest.mark.timeout(300)
def test_summary_json_records_what_the_run_did(quickstart):
    summary = json.loads(open(quickstart.summary_path).read())
    assert summary["status"] == "finished"
    assert summary["world_size"] == 2
    assert summary["global_step"] == _steps_the_spec_takes(quickstart_spec("unused")), summary["global_step"]
    assert summary["epochs"] == 8
    assert summary["metrics"]["test_acc"] >= 0.90
    assert len(summary["weights_sha256"]) == 64
    assert summary["wall_seconds"] > 0
    assert sorted(w["rank"] for w in summary["workers"]) == [0, 1]
    assert all(w["node_id"] for w in summary["workers"])
    final = summary["final_checkpoint"]
    assert final.endswith(f"step-{summary['global_step']:09d}")
    committed = CheckpointStore(storage.resolve(quickstart.run_dir)).committed()
    assert committed[-1].uri == final and len(committed) <= 3  # keep_last: 3
    assert committed[-1].manifest.step == summary["global_step"], committed[-1].manifest
    assert os.path.exists(os.path.join(quickstart.run_dir, "logs", "rank-1.log"))


@pytest.mark.timeout(300)
def test_a_finished_run_is_reported_and_not_trained_again(quickstart):
    again = orchestrator.run("jobs/quickstart.yaml", storage=os.path.dirname(quickstart.run_dir), console=None)
    assert again.status == "already_finished"
    assert again.weights_sha256 == quickstart.weights_sha256


@pytest.mark.timeout(400)
def test_the_quickstart_killed_mid_epoch_while_reading_its_parquet_data_ends_with_the_clean_weights(
        quickstart, tmp_path):
    """The Lightning path through the spec's data: section: a worker SIGKILLed mid-epoch resumes
    from the step-50 checkpoint (epoch 3, batch 8 of 21) at its row of the global order, and the
    run ends with the uninterrupted quickstart's weights, bit for bit."""
    kill_at = int(os.environ.get("ORCHESTRATOR_TEST_KILL_STEP", random.Random().randint(51, 62)))
    marker = str(tmp_path / "kill-marker")
    spec = quickstart_spec(tmp_path / "runs")
    spec["lightning"]["model"]["class_path"] = "faulty.KilledOnceClassifier"
    spec["lightning"]["model"]["init_args"].update(kill_at=kill_at, marker=marker)
    killed = run_spec(spec, str(tmp_path))
    assert killed.starts[-1]["restored_step"] == 50, killed.starts
    assert_resumed_to_clean_weights(killed, quickstart, marker, kill_at)


@pytest.mark.timeout(400)
def test_a_run_on_s3_storage_checkpoints_and_resumes_there(tmp_path, s3_server):
    """The same code path as local files, against a real S3-protocol server on loopback."""
    storage_uri = s3_server.format(prefix=f"e2e-{os.getpid()}")
    spec = torch_spec("on-s3", "unused")
    spec["storage"] = storage_uri
    spec["torch"]["max_epochs"] = 1
    first = orchestrator.run(spec, console=None)
    assert first.status == "finished" and first.final_checkpoint.startswith("s3://")
    run_dir = storage.resolve(storage_uri).join("on-s3")
    committed = CheckpointStore(run_dir).committed()
    assert committed and committed[-1].uri == first.final_checkpoint
    assert json.loads(storage.read_bytes(run_dir.join("summary.json")))["weights_sha256"] == first.weights_sha256

    spec["torch"]["max_epochs"] = 2
    second = orchestrator.run(spec, console=None)
    assert second.resumed_from["uri"] == first.final_checkpoint
    assert second.global_step == 2 * first.global_step
