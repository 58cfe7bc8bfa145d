"""Jobs and data for the classification tests (tests/test_classify_*.py): a plain-torch loop over
the spec's Parquet input, a Parquet file with one damaged row group, and a loop that hands the run
over to a newer driver part-way."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F


def train_loop(ctx) -> None:
    """Trains a tiny model on `id` and `x` of data.train; `sleep_s` in the config slows each step."""
    sleep_s = ctx.config.get("sleep_s", 0)
    torch.manual_seed(0)
    model = ctx.prepare_model(torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ctx.data("train")
    ctx.track(model=model, optimizer=optimizer)
    for _ in ctx.epochs():
        for batch in loader:
            loss = F.cross_entropy(model(batch["x"]), batch["id"] % 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(sleep_s)
            ctx.step(loss=loss.item())
            _take_over_once(ctx)


def _take_over_once(ctx) -> None:
    """At step `take_over_at`, rank 0 does once what a newer driver taking the run over does to the
    run directory: claim generation 2 (`leases/000000002`) and name itself in lease.json (this
    host, a live pid: the test's own)."""
    at, run_dir = ctx.config.get("take_over_at"), ctx.config.get("run_dir")
    if at is None or ctx.global_step != at or ctx.rank != 0:
        return
    from orchestrator.checkpoint.lease import Holder

    now = time.time()
    newer = Holder(socket.gethostname(), ctx.config["newer_pid"], None, now, 2, uuid.uuid4().hex, now).to_json()
    for path in (Path(run_dir) / "leases" / f"{2:09d}", Path(run_dir) / "lease.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(newer)
        os.replace(tmp, path)


def write_rows(path, rows: int, row_group: int) -> str:
    """Rows whose `id` column is their index and `x` two floats derived from it."""
    ids = np.arange(rows, dtype=np.int64)
    x = np.repeat(ids.astype(np.float32)[:, None], 2, axis=1)
    table = pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 2)})
    pq.write_table(table, path, row_group_size=row_group)
    return str(path)


def damage_row_group(path, index: int) -> None:
    """Overwrite the first bytes of row group `index`'s `id` column chunk (its first page header):
    the footer still reads, every other row group still decodes, and that one raises pyarrow's
    `OSError: Couldn't deserialize thrift` (an OSError without errno) whenever it is read."""
    chunk = pq.ParquetFile(path).metadata.row_group(index).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\xff" * 16)
