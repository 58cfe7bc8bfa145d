"""Elastic world size on a real 3-node loopback cluster: a node killed in the middle of an epoch,
the run going on with fewer workers, a node added back and the run growing again, with every
sample of every epoch trained exactly once, on both paths. And one global batch at 1 and 3
fixed workers giving the same weights.

The cluster is the session's shared loopback cluster (tests/helpers/clusters.py): the fixed-size runs
first, then the runs that kill a node and add one back (which leave the cluster at three workers'
worth of nodes again).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from cli_runs import BackgroundRun, run_spec
from clusters import add_worker_node
from conftest import REPO, wait_for
from elastic_jobs import committed_ids, max_step, restored_by_attempt, world_sizes_by_attempt
from node_faults import kill_node, training_worker_pids

from orchestrator.checkpoint import CheckpointStore, loads_state

pytestmark = pytest.mark.slow

SAMPLES = 240
# Split by 1, 2 and 3 workers. With batch_size 2: 3 workers take 2 each in one pass; 2 workers
# take 3 each as 3 micro-batches of 1; 1 worker takes 6 as 3 micro-batches of 2.
GLOBAL_BATCH = 6
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH
# ORCHESTRATOR_TEST_VERBOSE=1 prints the driver's lines of the elastic runs.
CONSOLE = print if os.environ.get("ORCHESTRATOR_TEST_VERBOSE") else None


@pytest.fixture
def cluster(three_nodes):
    """A head without CPUs (the driver's side) and three 1-CPU nodes (tests/helpers/clusters.py)."""
    return three_nodes


def torch_job(name, tmp_path, records, *, workers, epochs=2, pace_s=0.0, pace_file=None):
    return {
        "name": name, "storage": str(tmp_path / "runs"), "seed": 0,
        "torch": {"train_loop": "elastic_jobs:train_loop", "max_epochs": epochs,
                  "config": {"samples": SAMPLES, "batch_size": 2, "records": str(records), "pace_s": pace_s,
                             "pace_file": pace_file}},
        "scaling": {"num_workers": workers, "global_batch_size": GLOBAL_BATCH, "resize_interval_s": 3},
        "checkpoint": {"every_n_steps": 4, "keep_last": 2},
        "failure": {"max_failures": 3},
    }


def lightning_job(name, tmp_path, records, *, workers, epochs=2, pace_s=0.0, pace_file=None):
    return {
        "name": name, "storage": str(tmp_path / "runs"), "seed": 0,
        "lightning": {
            "model": {"class_path": "elastic_jobs.IdsModule",
                      "init_args": {"records": str(records), "pace_s": pace_s, "pace_file": pace_file}},
            "data": {"class_path": "elastic_jobs.IdsData", "init_args": {"samples": SAMPLES, "batch_size": 2}},
            "trainer": {"max_epochs": epochs},
        },
        "scaling": {"num_workers": workers, "global_batch_size": GLOBAL_BATCH, "resize_interval_s": 3},
        "checkpoint": {"every_n_steps": 4, "keep_last": 2},
        "failure": {"max_failures": 3},
    }


def _final_model(result) -> dict[str, torch.Tensor]:
    info = CheckpointStore.for_run(result.run_dir).latest_loadable().info
    _, files = CheckpointStore.for_run(result.run_dir).open_uri(info.uri)
    return loads_state(files["state.pt"], source=info.uri)["objects"]["model"]


@pytest.mark.timeout(600)
def test_one_global_batch_at_one_and_three_workers_trains_the_same_weights(cluster, tmp_path):
    # 1 worker accumulates 3 micro-batches per step, 3 workers none; 2 workers (3 micro-batches
    # of 1) train in the kill-and-regrow runs below.
    models = {}
    for workers in (1, 3):
        records = tmp_path / f"records-{workers}"
        records.mkdir()
        result = run_spec(torch_job(f"fixed-{workers}", tmp_path, records, workers=workers, epochs=1), str(tmp_path),
                          address=cluster.address)
        assert result.status == "finished" and result.world_sizes_seen == [workers]
        # The same number of optimizer steps at every size: the LR schedule follows the global step.
        assert result.global_step == STEPS_PER_EPOCH
        assert sorted(committed_ids(str(records))[0]) == list(range(SAMPLES))
        models[workers] = _final_model(result)
    for workers in (3,):
        for key, tensor in models[1].items():
            assert torch.allclose(tensor, models[workers][key], rtol=1e-4, atol=1e-6), (workers, key)


def _grown_back(records) -> bool:
    """Whether a group of three started after the last group of two (the run grew again)."""
    sizes = world_sizes_by_attempt(str(records))
    shrunk = [attempt for attempt, world in sizes.items() if world == 2]
    return bool(shrunk) and any(world == 3 and attempt > max(shrunk) for attempt, world in sizes.items())


def _kill_and_regrow(cluster, run: BackgroundRun, records, pace_file) -> None:
    """Once three workers trained some steps, kill a node that holds one; once two workers trained
    some steps, add a node back; once three workers train again, stop pacing the steps (removing
    `pace_file`): the rest of the run only has to finish, every sample of it still recorded."""
    wait_for(lambda: max_step(str(records), world=3) >= 10 or run.ended(), timeout=180)
    assert not run.ended(), "the run ended before the node could be killed"
    victim = next(node for node in cluster.worker_nodes if training_worker_pids(node))
    kill_node(cluster, victim)
    wait_for(lambda: max_step(str(records), world=2) >= 3 * 10 // 2 or run.ended(), timeout=180)
    assert not run.ended(), "the run ended before it could grow again"
    add_worker_node(cluster)
    wait_for(lambda: _grown_back(records) or run.ended(), timeout=180)
    assert not run.ended(), "the run ended before it grew again"
    os.unlink(pace_file)


def _assert_exactly_once(result, records) -> None:
    assert result.status == "finished", result.error
    # Sizes as the run went: three, two after the kill, three again after the growth.
    assert result.world_sizes_seen[:1] == [3] and 2 in result.world_sizes_seen
    assert result.world_sizes_seen[-1] == 3, result.starts
    assert sorted(set(world_sizes_by_attempt(str(records)).values())) == [2, 3]
    assert result.global_step == 2 * STEPS_PER_EPOCH
    # The starts after the first resumed weights that had trained (by the weights' own count):
    # the oracle below rolled back what each of them did not hold.
    restored = restored_by_attempt(str(records))
    assert list(restored.values())[0] == 0 and any(steps > 0 for steps in list(restored.values())[1:]), restored
    epochs = committed_ids(str(records))
    assert sorted(epochs) == [0, 1]
    for epoch, ids in epochs.items():
        assert len(ids) == SAMPLES and sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}"
    # The resize restarts are recorded with their size and step.
    assert [s["world_size"] for s in result.starts][:1] == [3] and len(result.starts) >= 3


@pytest.mark.timeout(300)
def test_a_worker_that_cannot_see_the_drivers_run_directory_fails_the_start_naming_it(cluster, tmp_path):
    """Node-local storage, simulated for real: the driver runs in a mount namespace of its own
    with a private tmpfs over the storage directory, so the workers (outside it) see another
    folder at the same path, as nodes with local disks do."""
    import yaml

    runs = tmp_path / "runs"
    runs.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(torch_job("unshared", tmp_path, tmp_path / "records", workers=2)))
    private = ('mount -t tmpfs -o size=16m tmpfs "$0" && exec "$1" -m orchestrator run "$2" --address "$3"')
    driver = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", private, str(runs),
                             sys.executable, str(spec), cluster.address], capture_output=True, text=True, timeout=240,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": os.path.join(REPO, "tests", "helpers")})
    out = driver.stdout + driver.stderr
    if "unshare failed" in out or "mount:" in out:
        pytest.skip(f"no private mount namespace here: {out[-300:]}")
    assert driver.returncode == 1, out[-3000:]
    assert "is not the same storage on every node" in out and "storage-marker.json does not exist here" in out
    assert "rank 0 on" in out and "rank 1 on" in out and "Fix:" in out
    assert "not retried" in out and "Traceback" not in out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("job", [torch_job, lightning_job], ids=["torch", "lightning"])
def test_a_run_shrinks_after_a_node_loss_and_grows_back_training_each_sample_once(cluster, tmp_path, job):
    records = tmp_path / "records"
    records.mkdir()
    pace_file = tmp_path / "pace"  # outside `records`: only step records there
    pace_file.touch()
    run = BackgroundRun(job(f"elastic-{job.__name__}", tmp_path, records, workers=[1, 3], pace_s=0.4,
                            pace_file=str(pace_file)), str(tmp_path), address=cluster.address, console=CONSOLE)
    _kill_and_regrow(cluster, run, records, pace_file)
    _assert_exactly_once(run.result(timeout=400), records)
