"""The spec's `data:` section: Parquet input the orchestrator reads, shards and resumes itself.

    data:
      train:
        path: ~/.cache/orchestrator/data/digits.parquet   # a file, a directory, or s3://...
        columns:
          pixels: {dtype: float32, shape: [64]}           # tensor name -> column, dtype, shape
          label: {dtype: int64}
        batch_size: 32                                    # per worker (scaling.global_batch_size: global)
        shuffle: true
      val: {...}                                          # optional, same fields

Parsed here with spec/fields.py's checkers, so its messages read like every other field's. The input
itself (files, columns, types, row counts) is checked by `check_data_input` (data/sources.py) on the driver
before Ray starts, reading the Parquet footers only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import nearest
from orchestrator.spec import fields as s
from orchestrator.spec.facts import option

SOURCES = ("train", "val", "test")


@dataclass(frozen=True)
class ColumnSpec:
    # The Parquet column (default: the tensor's own name).
    column: str | None = option(None, depends="the tensor's own name")
    # The tensor's dtype: float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8 or
    # bool (default: the column's own type).
    dtype: str | None = None
    # One sample's shape, e.g. [8, 8] (default: a scalar, or a list column's length).
    shape: list[int] | None = None


@dataclass(frozen=True)
class DataSourceSpec:
    # A Parquet file, a directory of them (read recursively), or a pyarrow.fs URI (s3://...).
    path: str = option(example="data/train.parquet")
    # Which tensors a batch holds: tensor name -> {column, dtype, shape} (a list of column names
    # takes them as they are). Default: every column.
    columns: dict[str, ColumnSpec] = field(default_factory=dict)
    # Samples per worker per forward pass; with scaling.global_batch_size, the largest micro-batch.
    batch_size: int = option(32, minimum=1)
    # Shuffle every epoch: the row groups, then the rows within each window of row groups, as a
    # function of (seed, epoch) only (default: true for train, false for val and test).
    shuffle: bool = option(True, depends="true for train, false for val and test")
    # Drop the epoch's last, incomplete global batch.
    drop_last: bool = False
    # Row groups shuffled together (and kept decoded per worker): more mixes better, costs memory.
    window: int = option(4, minimum=1)


@dataclass(frozen=True)
class DataSpec:
    # The training input. The torch path reads it with ctx.data("train"); the Lightning path
    # builds the DataModule's train loader from it when lightning.data is not given.
    train: DataSourceSpec | None = None
    # The validation input (not shuffled unless asked), read with ctx.data("val"); on the
    # Lightning path, the built DataModule's val loader.
    val: DataSourceSpec | None = None
    # The test input (not shuffled unless asked), read with ctx.data("test"); on the Lightning
    # path, the built DataModule's test loader (the run ends with trainer.test).
    test: DataSourceSpec | None = None


def parse_data(raw: Any) -> DataSpec | None:

    if raw is None:
        return None
    s.mapping(raw, "data")
    s.check_keys(raw, DataSpec, "data")
    sources = {name: _source(raw[name], f"data.{name}", training=name == "train")
               for name in SOURCES if raw.get(name) is not None}
    if not sources:
        raise s.SpecError("field 'data': it names no input. Fix: add data.train (and val, test) with a path, e.g. "
                          "data: {train: {path: data/train.parquet, batch_size: 32}}.")
    return DataSpec(**sources)


def _source(raw: Any, path: str, *, training: bool) -> DataSourceSpec:
    s.mapping(raw, path)
    s.check_keys(raw, DataSourceSpec, path)
    location = s.read(raw, DataSourceSpec, "path", path)
    if "://" not in location:
        # Relative to where the command runs (as the spec's class paths are), fixed now: the
        # workers run elsewhere.
        location = os.path.abspath(os.path.expanduser(location))
    columns_raw = raw.get("columns") or {}
    if isinstance(columns_raw, list):
        columns_raw = {str(name): {} for name in columns_raw}
    s.mapping(columns_raw, f"{path}.columns")
    columns = {}
    for name, column in columns_raw.items():
        where = f"{path}.columns.{name}"
        column = column or {}
        s.mapping(column, where)
        s.check_keys(column, ColumnSpec, where)
        dtype = s.read(column, ColumnSpec, "dtype", where)  # one of torch's: check_dtypes
        shape = column.get("shape")
        if shape is not None and (not isinstance(shape, list) or not shape or
                                  not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise s.SpecError(f"field '{where}.shape': got {s.describe(shape)}; a sample's shape is a list of "
                              "positive whole numbers. Fix: e.g. shape: [8, 8].")
        columns[str(name)] = ColumnSpec(column=s.read(column, ColumnSpec, "column", where) or str(name),
                                        dtype=dtype, shape=list(shape) if shape else None)
    return DataSourceSpec(path=location, columns=columns,
                          batch_size=s.read(raw, DataSourceSpec, "batch_size", path),
                          shuffle=s.read(raw, DataSourceSpec, "shuffle", path, default=training),
                          drop_last=s.read(raw, DataSourceSpec, "drop_last", path),
                          window=s.read(raw, DataSourceSpec, "window", path))


def check_dtypes(data: DataSpec | None) -> None:
    """Each column's dtype is a tensor dtype. The names are torch's, and importing torch takes
    seconds, so this runs after every key and type of the spec was read."""
    named = [(f"data.{name}.columns.{tensor}", column.dtype) for name in SOURCES
             for tensor, column in (getattr(data, name).columns.items() if data and getattr(data, name) else ())
             if column.dtype is not None]
    if not named:
        return
    from orchestrator.data.parquet import DTYPES

    for where, dtype in named:
        if dtype not in DTYPES:
            raise s.SpecError(f"field '{where}.dtype': {dtype!r} is not a tensor dtype{nearest(dtype, list(DTYPES))}. "
                              f"Valid choices: {', '.join(DTYPES)}.")
