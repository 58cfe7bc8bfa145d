"""Lightning options as users set them: callbacks from the spec (their own and Lightning's),
ModelCheckpoint's retention carried out by the store, loggers that write once into the run
directory and continue after a resume, hyperparameters holding a path and an enum that a later
run continues from, and no scratch left in the temp dir."""

from __future__ import annotations

import csv
import json
import os

import pytest
from cli_runs import run_spec
from conftest import scratch_in
from mlflow import MlflowClient

from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow


def recorded(folder) -> list[dict]:
    lines = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            lines += [json.loads(line) for line in f]
    return lines


@pytest.mark.timeout(400)
def test_callbacks_and_loggers_from_the_spec_a_model_checkpoint_keeps_the_best_and_paths_in_hparams_continue(
        tmp_path, monkeypatch, run_temp_dir):
    records = tmp_path / "records"
    records.mkdir()
    spec = {
        "name": "options", "storage": str(tmp_path / "runs"), "seed": 0,
        "lightning": {
            "model": {"class_path": "lightning_data_jobs.PathsClassifier",
                      "init_args": {"hidden": 32}},  # cache_dir and split: a Path and an enum by default
            "data": {"class_path": "jobs.digits.DigitsData", "init_args": {"batch_size": 64}},
            "trainer": {"max_epochs": 4, "accumulate_grad_batches": 2},
            "callbacks": [
                {"class_path": "lightning_data_jobs.EpochRecorder", "init_args": {"folder": str(records)}},
                # mode max keeps the *worst* two epochs: not what keep_last would keep.
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"save_top_k": 2, "monitor": "val_loss", "mode": "max"}},
            ],
            "logger": [{"class_path": "lightning.pytorch.loggers.CSVLogger"},
                       {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"},
                       {"class_path": "lightning.pytorch.loggers.MLFlowLogger"}],
        },
        "scaling": {"num_workers": 2},
        "env": {"TMPDIR": run_temp_dir},
    }
    first = run_spec(spec, str(tmp_path))
    assert first.status == "finished", first.error
    # The progress loss is the training_step's own, not Lightning's loss divided by the accumulation.
    assert first.metrics["loss"] == pytest.approx(first.metrics["train_loss"], rel=1e-5)
    epochs = [line for line in recorded(records) if line["rank"] == 0]
    assert [line["epoch"] for line in epochs] == [0, 1, 2, 3], "the user's callback ran at every epoch end"
    assert {line["rank"] for line in recorded(records)} == {0, 1}, "and on every rank"

    worst_two = sorted(epochs, key=lambda line: line["val_loss"], reverse=True)[:2]
    expected = {line["step"] for line in worst_two} | {first.global_step}
    store = CheckpointStore.for_run(first.run_dir)
    assert {info.step for info in store.committed()} == expected, "ModelCheckpoint(save_top_k=2, mode=max) + newest"

    # Continued for one more epoch: the checkpoint holds a path and an enum in its hparams.
    spec["lightning"]["trainer"]["max_epochs"] = 5
    again = run_spec(spec, str(tmp_path))
    assert again.status == "finished", again.error
    assert again.resumed_from.get("step") == first.global_step
    assert again.epochs == 5 and again.global_step > first.global_step
    assert not scratch_in(run_temp_dir), "a run and its resume leave nothing in the temp dir"

    # One logger run for both: the CSV holds every epoch once, in step order; TensorBoard one folder.
    logs = tmp_path / "runs" / "options" / "logs" / "lightning"
    assert sorted(os.listdir(logs)) == ["csv", "mlflow", "mlflow-run.json", "tensorboard"]
    with open(logs / "csv" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    epochs = [int(float(row["epoch"])) for row in rows if row.get("val_loss")]
    assert epochs == [0, 1, 2, 3, 4], "one validation row per epoch, the first run's kept by the second"
    steps = [float(row["step"]) for row in rows]
    assert steps == sorted(steps) and steps[-1] >= first.global_step
    # Both runs wrote into one TensorBoard run (its folder), none into a version folder of its own.
    entries = os.listdir(logs / "tensorboard")
    assert not [n for n in entries if (logs / "tensorboard" / n).is_dir()], entries
    assert len([n for n in entries if n.startswith("events.out.tfevents")]) >= 2, entries
    # MLflow: one run in its file store under the run directory, continued by the resume: a
    # validation loss for each of the five epochs, at rising steps.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as a user reading it does (docs/lightning.md, "MLflow")
    client = MlflowClient(tracking_uri=f"file:{logs / 'mlflow'}")
    experiments = [e for e in client.search_experiments() if e.name != "Default"]
    assert len(experiments) == 1
    runs = client.search_runs([experiments[0].experiment_id])
    assert len(runs) == 1, "the resume continued the first run's MLflow run"
    history = client.get_metric_history(runs[0].info.run_id, "val_loss")
    assert len(history) == 5 and [m.step for m in history] == sorted(m.step for m in history)
    assert runs[0].data.params.get("hidden") == "32"
