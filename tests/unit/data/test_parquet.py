"""Parquet input (orchestrator/data/parquet.py, the spec's data: section): equal steps on every
rank, a deterministic order independent of the world size, exact resume, an epoch split again
after a resize covered exactly once, S3, bad input, and memory bounded by row groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from cli_runs import run_spec
from conftest import REPO, run_cli

from orchestrator.data.order import GlobalOrderSampler, rank_steps
from orchestrator.data.parquet import Column, DataError, ParquetDataset, ParquetSource
from orchestrator.data.sources import check_data_input
from orchestrator.spec import validate


def write_ids(path, rows: int, row_group: int, *, files: int = 1, width: int = 2) -> str:
    """Rows whose `id` column is their global index; `x` a fixed-size list derived from it."""
    os.makedirs(path, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for i in range(files):
        ids = np.arange(bounds[i], bounds[i + 1], dtype=np.int64)
        x = np.repeat(ids.astype(np.float32)[:, None], width, axis=1)
        table = pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), width),
                          "name": pa.array([f"r{j}" for j in ids])})
        pq.write_table(table, os.path.join(path, f"part-{i:03d}.parquet"), row_group_size=row_group)
    return str(path)


def dataset(path, window=2, columns=("id", "x")) -> ParquetDataset:
    return ParquetDataset(ParquetSource(path, [Column(c, c) for c in columns]), window=window)


def order_of(ds, epoch=0, seed=7, shuffle=True):
    return ds.epoch_order(seed=seed, epoch=epoch, shuffle=shuffle)


def loader_ids(ds, *, world, rank, global_batch, micro, epoch=0, start=0, seed=7, drop_last=False):
    """Every micro-batch's ids a rank's DataLoader yields in one pass (reading the files)."""
    sampler = GlobalOrderSampler(ds, world_size=world, rank=rank, global_batch=global_batch, micro_batch=micro,
                                 shuffle=True, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    sampler.start_at(epoch, start)
    loader = torch.utils.data.DataLoader(ds, batch_size=micro, sampler=sampler, collate_fn=ParquetDataset.collate)
    batches = []
    for batch in loader:
        assert torch.equal(batch["x"][:, 0], batch["id"].float())  # rows are read whole and in step
        batches.append(batch["id"].tolist())
    return batches


@pytest.mark.parametrize("rows", [5, 97, 1000, 1001, 1023])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_rank_runs_the_same_steps_and_each_row_is_trained_once_for_awkward_row_counts(tmp_path, rows, world):
    ds = dataset(write_ids(tmp_path / "d", rows, row_group=37, files=3), window=2)
    global_batch = 4 * world
    per_rank = [rank_steps(order_of(ds), consumed=0, global_batch=global_batch, micro_batch=2, world_size=world,
                           rank=r, drop_last=False) for r in range(world)]
    assert len({len(steps) for steps in per_rank}) == 1
    seen = [i for steps in per_rank for step in steps for micro in step.micro_batches for i in micro]
    assert len(seen) == len(set(seen))
    # Only a last group smaller than the world size is left out: no rank could take part in it.
    assert rows - len(seen) < world


def test_the_order_is_a_function_of_seed_and_epoch_and_shuffles_within_windows_of_row_groups(tmp_path):
    path = write_ids(tmp_path / "d", 1000, row_group=50, files=2)
    first, again = list(order_of(dataset(path))), list(order_of(dataset(path)))
    assert first == again and sorted(first) == list(range(1000))
    assert first != list(order_of(dataset(path), epoch=1)) and first != list(order_of(dataset(path), seed=8))
    assert list(order_of(dataset(path), shuffle=False)) == list(range(1000))
    # The first window (2 row groups of 50) holds exactly two whole row groups, mixed.
    window = first[:100]
    groups = {i // 50 for i in window}
    assert len(groups) == 2 and sorted(window) == sorted(i for g in groups for i in range(50 * g, 50 * g + 50))
    assert window != sorted(window)
    # Independent of the world size: the ranks' slices of each step, in rank order, are the order.
    for world in (2, 4):
        steps = [rank_steps(order_of(dataset(path)), consumed=0, global_batch=20, micro_batch=5, world_size=world,
                            rank=r, drop_last=False) for r in range(world)]
        merged = [i for s in range(len(steps[0])) for r in range(world) for m in steps[r][s].micro_batches for i in m]
        assert merged == first


def test_a_resume_at_a_random_position_continues_with_the_exact_next_sample(tmp_path):
    ds = dataset(write_ids(tmp_path / "d", 700, row_group=64, files=2), window=3)
    world, global_batch, micro = 2, 12, 3
    full = {r: loader_ids(ds, world=world, rank=r, global_batch=global_batch, micro=micro, epoch=2) for r in range(2)}
    rng = np.random.default_rng(0)
    for _ in range(3):
        step = int(rng.integers(1, 700 // global_batch))
        for rank in range(world):
            resumed = loader_ids(ds, world=world, rank=rank, global_batch=global_batch, micro=micro, epoch=2,
                                 start=step * global_batch)
            per_step = global_batch // world // micro
            assert resumed == full[rank][step * per_step:], f"resume at step {step}, rank {rank}"


def test_an_epoch_split_again_after_a_resize_covers_every_row_exactly_once(tmp_path):
    ds = dataset(write_ids(tmp_path / "d", 1001, row_group=40, files=3), window=2)
    global_batch, consumed = 12, 12 * 30
    # Two workers train the first 30 steps, then three take the rest of the epoch from there.
    sampler_ranks = [rank_steps(order_of(ds), consumed=0, global_batch=global_batch, micro_batch=6, world_size=2,
                                rank=r, drop_last=False)[:30] for r in range(2)]
    before = [i for steps in sampler_ranks for s in steps for m in s.micro_batches for i in m]
    after = [i for r in range(3) for b in loader_ids(ds, world=3, rank=r, global_batch=global_batch, micro=4,
                                                     start=consumed) for i in b]
    assert len(before) == consumed
    together = before + after
    assert len(together) == len(set(together)) and 1001 - len(together) < 3


def test_columns_become_tensors_of_the_dtype_and_shape_the_spec_asks_for(tmp_path):
    path = write_ids(tmp_path / "d", 20, row_group=8, width=4)
    columns = [Column("x", "x", "bfloat16", (2, 2)), Column("label", "id", "float64"), Column("id", "id")]
    batch = ParquetDataset(ParquetSource(path, columns)).__getitems__([3, 17, 9])
    assert batch["x"].dtype == torch.bfloat16 and batch["x"].shape == (3, 2, 2)
    assert batch["label"].dtype == torch.float64 and batch["id"].dtype == torch.int64
    assert batch["id"].tolist() == [3, 17, 9] and batch["x"][1].flatten().float().tolist() == [17.0] * 4


def test_rows_stream_from_an_s3_store(tmp_path, s3_server):
    local = write_ids(tmp_path / "d", 300, row_group=64, files=2)
    uri = s3_server.format(prefix="data/ids")
    from orchestrator import storage

    root = storage.resolve(uri)
    for name in sorted(os.listdir(local)):
        storage.write_bytes(root.join(name), open(os.path.join(local, name), "rb").read())
    remote, here = dataset(uri), dataset(local)
    assert len(remote) == 300
    ids = list(order_of(remote))[:50]
    assert torch.equal(remote.__getitems__(ids)["x"], here.__getitems__(ids)["x"])
    assert remote.__getitems__(ids)["id"].tolist() == ids


# --- bad input: caught on the driver, before Ray starts, naming the value and the fix ------------

def _spec(path, **source):
    return validate({"name": "bad-data", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1},
                     "scaling": {"num_workers": 2},
                     "data": {"train": {"path": str(path), "batch_size": 4, **source}}})


def _problem(path, **source) -> str:
    with pytest.raises(DataError) as caught:
        check_data_input(_spec(path, **source))
    return str(caught.value)


def test_bad_input_is_refused_with_the_value_the_cause_and_the_fix(tmp_path):
    good = write_ids(tmp_path / "good", 100, row_group=30)
    text = _problem(tmp_path / "missing")
    assert "does not exist" in text and "missing" in text and "Fix:" in text
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "empty-dir" / "notes.txt").write_text("x")
    assert "holds no Parquet files" in _problem(tmp_path / "empty-dir")
    text = _problem(good, columns={"ids": {}})
    assert "column 'ids' is not in" in text and "did you mean 'id'" in text and "id, x, name" in text
    text = _problem(good, columns={"name": {"dtype": "float32"}})
    assert "column 'name' holds string" in text and "cannot become a tensor of float32" in text and "Fix:" in text
    text = _problem(good, columns={"x": {"shape": [3]}})
    assert "holds 3 values, but a row of column 'x'" in text and "holds 2" in text
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "none.parquet")
    assert "holds no rows" in _problem(tmp_path / "none.parquet")
    small = write_ids(tmp_path / "small", 7, row_group=4)
    text = _problem(small)  # every column by default, the string column too
    assert "column 'name' holds string" in text and "list the columns to read under data.train.columns" in text
    text = _problem(small, columns=["id", "x"])  # 2 workers x 4 = 8 > 7
    assert "holds 7 rows, fewer than one global batch of 8" in text and "batch_size 4 x 2 workers" in text
    mixed = tmp_path / "mixed"
    write_ids(mixed, 10, row_group=5)
    pq.write_table(pa.table({"id": pa.array([1.5])}), mixed / "part-999.parquet")
    text = _problem(mixed, columns=["id"])
    assert "have different schemas" in text and "part-999.parquet" in text and "id: double" in text


def test_a_bad_column_fails_the_command_before_ray_starts_with_one_paragraph(tmp_path):
    good = write_ids(tmp_path / "good", 100, row_group=30)
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({"name": "bad-column", "storage": str(tmp_path / "runs"),
                                "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1},
                                "data": {"train": {"path": good, "columns": {"features": {"column": "pixel"}}}}}))
    done = run_cli("run", str(spec), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "data.train.columns.features: column 'pixel' is not in" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")


# --- memory ---------------------------------------------------------------------------------------

def test_a_pass_over_a_data_set_far_larger_than_a_few_row_groups_stays_within_a_few_row_groups_of_memory(tmp_path):
    """400 MB of rows in 4 MB row groups; one worker's pass (window 4) must grow its RSS by
    about a window's worth, not by the data set."""
    path = tmp_path / "big"
    path.mkdir()
    rows_per_group, width, groups = 4096, 256, 100   # 4 MB per row group, 400 MB in all
    for f in range(4):
        ids = np.arange(f * rows_per_group * groups // 4, (f + 1) * rows_per_group * groups // 4, dtype=np.int64)
        x = np.broadcast_to(ids.astype(np.float32)[:, None], (len(ids), width)).ravel()
        pq.write_table(pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x), width)}),
                       path / f"part-{f}.parquet", row_group_size=rows_per_group, compression="none")
    script = textwrap.dedent(f"""
        import resource, sys, torch
        sys.path.insert(0, {REPO!r})
        from orchestrator.data.order import GlobalOrderSampler
        from orchestrator.data.parquet import Column, ParquetDataset, ParquetSource
        ds = ParquetDataset(ParquetSource({str(path)!r}, [Column("id", "id"), Column("x", "x")]), window=4)
        sampler = GlobalOrderSampler(ds, world_size=1, rank=0, global_batch=512, micro_batch=512, shuffle=True,
                                     seed=0, drop_last=False)
        loader = torch.utils.data.DataLoader(ds, batch_size=512, sampler=sampler, collate_fn=ParquetDataset.collate)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        seen = 0
        for batch in loader:
            seen += len(batch["id"])
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(seen, (after - before) * 1024)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen, grown = (int(v) for v in done.stdout.split())
    data_bytes = rows_per_group * groups * (width * 4 + 8)
    assert seen == rows_per_group * groups
    # A window of 4 decoded row groups (+1 cached) and the batch being built: about 25 MB.
    assert grown < 12 * rows_per_group * width * 4, f"RSS grew by {grown / 2**20:.0f} MB over {data_bytes / 2**20:.0f} MB"


# --- end to end -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_torch_job_reading_parquet_killed_mid_epoch_trains_every_row_of_every_epoch_once(tmp_path):
    from elastic_jobs import committed_ids


    path = write_ids(tmp_path / "d", 403, row_group=25, files=3)
    records = tmp_path / "records"
    records.mkdir()
    spec = {"name": "parquet-kill", "storage": str(tmp_path / "runs"), "seed": 3,
            "torch": {"train_loop": "parquet_jobs:train_loop", "max_epochs": 2,
                      "config": {"records": str(records), "marker": str(tmp_path / "killed"), "kill_at": 17}},
            "data": {"train": {"path": path, "columns": {"id": {}, "x": {"dtype": "float32"}}, "batch_size": 8,
                               "window": 3}},
            "scaling": {"num_workers": 2}, "checkpoint": {"every_n_steps": 5}, "failure": {"max_failures": 2}}
    result = run_spec(spec, str(tmp_path))
    assert result.status == "finished" and result.restarts == 1
    # 403 rows, 16 per global batch: 26 steps an epoch (25 whole, then 3 rows split 2 + 1).
    assert result.global_step == 2 * 26
    epochs = committed_ids(str(records))
    assert sorted(epochs) == [0, 1]
    for ids in epochs.values():
        assert sorted(ids) == list(range(403))
    assert epochs[0] != epochs[1]  # a new order every epoch


def test_the_data_section_is_validated_like_every_other_field():
    from orchestrator.errors import SpecError

    def refused(data, lightning=False) -> str:
        spec = {"name": "d", "data": data}
        if lightning:
            spec["lightning"] = {"model": {"class_path": "jobs.digits.DigitsClassifier"}, "trainer": {"max_epochs": 1}}
        else:
            spec["torch"] = {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1}
        with pytest.raises(SpecError) as caught:
            validate(spec)
        return str(caught.value)

    assert "did you mean 'batch_size'" in refused({"train": {"path": "x", "batch_sise": 4}})
    assert "did you mean 'float32'" in refused({"train": {"path": "x", "columns": {"a": {"dtype": "float23"}}}})
    assert "a sample's shape is a list of positive whole numbers" in refused(
        {"train": {"path": "x", "columns": {"a": {"shape": [0]}}}})
    assert "it names no input" in refused({})
    assert "data.train.path' is required" in refused({"train": {"batch_size": 4}})
    text = refused(None, lightning=True)
    assert "lightning.data' is required" in text and "data: section" in text
    # With a data: section, a Lightning spec needs no DataModule; relative paths are fixed on the driver.
    spec = validate({"name": "d", "data": {"train": {"path": "jobs/data/digits/train.parquet"}},
                     "lightning": {"model": {"class_path": "jobs.digits.DigitsClassifier"},
                                   "trainer": {"max_epochs": 1}}})
    assert spec.lightning.data is None and spec.data.train.path == os.path.join(REPO, "jobs/data/digits/train.parquet")
    assert spec.data.train.shuffle and (spec.data.val is None)


def test_the_shipped_digits_parquet_is_what_jobs_digits_data_writes(tmp_path):
    from jobs.digits_data import SHIPPED_SPLITS, write_splits

    for written in write_splits(tmp_path):
        assert pq.read_table(written).equals(pq.read_table(SHIPPED_SPLITS / written.name))
