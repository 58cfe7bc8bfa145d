"""Parquet input, streamed: a map-style dataset over the rows of one or many Parquet files (local,
a shared mount, or any pyarrow.fs URI such as s3://), read a row group at a time.

- Opening reads the files' footers only: their schemas, row groups and row counts. Bad input
  (a missing path, no Parquet files, an unknown column, a type that cannot become the tensor
  asked for, files with different schemas, no rows) is a `DataError` naming the value and the fix.
- The epoch's order (`WindowedOrder`) is a function of (seed, epoch) alone: the row groups are
  shuffled, then taken `window` at a time, and the rows within each window are shuffled. It is
  computed lazily, one window at a time, so it costs memory per window, not per dataset.
  The global-position machinery (`order.py`) splits it over the ranks like any other order, so
  resuming and resizing work as for in-memory data.
- Reading (`__getitems__`) groups a micro-batch's rows by row group and decodes each row group
  once, keeping the few most recent (`cache` of them: a window's worth) for the next batches.
  A rank's memory is therefore bounded by a few row groups, whatever the dataset's size.
"""

from __future__ import annotations

import math
import os
import posixpath
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from orchestrator import storage
from orchestrator.errors import InfrastructureError, UserError, nearest

# torch dtypes a column may become, by the name the spec uses.
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}


class DataError(UserError):
    """The data section's input cannot be read as asked."""


class ParquetReadError(InfrastructureError, OSError):
    """A row group pyarrow could not read or decode while training (a damaged page, access denied).

    An OSError without errno, as pyarrow's own error is: the first one is retried as a storage
    hiccup would be, and the same one at the same step after the restart is the data's
    (failures.py). It takes its message alone, so that a DataLoader worker can raise it again in
    the training process as this type.
    """


@dataclass(frozen=True)
class Column:
    """One tensor of a batch: which Parquet column, its torch dtype, and a sample's shape."""

    name: str
    column: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RowGroup:
    file: str
    index: int
    rows: int
    first_row: int  # global id of its first row


def _parquet_files(location: storage.Location, field: str) -> list[str]:
    info = location.fs.get_file_info(location.path)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"{field}.path: '{location.uri}' does not exist (a relative path is taken from the directory "
                        f"the command runs in). Fix: point {field}.path at a Parquet file or a directory of them "
                        "that every worker can read (a shared mount, or an object store URI such as "
                        "s3://bucket/prefix).")
    if info.type == pafs.FileType.File:
        return [location.path]
    selector = pafs.FileSelector(location.path, recursive=True)
    files = sorted(i.path for i in location.fs.get_file_info(selector)
                   if i.type == pafs.FileType.File and i.path.endswith((".parquet", ".parq"))
                   and not posixpath.basename(i.path).startswith(("_", ".")))
    if not files:
        raise DataError(f"{field}.path: '{location.uri}' holds no Parquet files (*.parquet). Fix: point it at the "
                        "directory the data was written to, or at one .parquet file.")
    return files


def _tensor_type(field: pa.Field) -> tuple[pa.DataType, int | None]:
    """A column's element type, and a fixed per-row length for list columns (None for scalars)."""
    kind = field.type
    if pa.types.is_fixed_size_list(kind):
        return kind.value_type, kind.list_size
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return kind.value_type, -1  # checked per row group
    return kind, None


def _convertible(element: pa.DataType) -> bool:
    return pa.types.is_integer(element) or pa.types.is_floating(element) or pa.types.is_boolean(element)


class ParquetSource:
    """The row groups of a Parquet input, from the footers alone, with its columns checked."""

    def __init__(self, uri: str, columns: Sequence[Column], *, field: str = "data.train"):
        self.uri, self.columns, self.field = uri, list(columns), field
        location = storage.resolve(uri)
        self._fs = location.fs
        files = _parquet_files(location, field)
        self.schema: pa.Schema | None = None
        self.row_groups: list[RowGroup] = []
        first = 0
        for path in files:
            try:
                metadata = pq.ParquetFile(self._fs.open_input_file(path)).metadata
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{field}.path: '{path}' is not a readable Parquet file ({exc}). Fix: remove it "
                                "from the data directory or rewrite it with pyarrow / pandas .to_parquet().") from None
            schema = metadata.schema.to_arrow_schema()
            if self.schema is None:
                self.schema, self._first_file = schema, path
            elif not schema.equals(self.schema):
                raise DataError(
                    f"{field}.path: the files under '{uri}' have different schemas: '{self._first_file}' has "
                    f"{_fields(self.schema)} but '{path}' has {_fields(schema)}. Fix: rewrite them with one schema, "
                    "or point the path at files of one schema only.")
            for index in range(metadata.num_row_groups):
                rows = metadata.row_group(index).num_rows
                if rows:
                    self.row_groups.append(RowGroup(path, index, rows, first))
                    first += rows
        self.num_rows = first
        self._all_columns = not self.columns
        if self._all_columns:  # every column, as it is
            self.columns = [Column(name, name) for name in self.schema.names]
        if not self.num_rows:
            raise DataError(f"{field}.path: '{uri}' holds no rows ({len(files)} Parquet file(s), all empty). "
                            "Fix: point it at the written data set.")
        self._check_columns()

    def _check_columns(self) -> None:
        names = self.schema.names
        for column in self.columns:
            if column.column not in names:

                raise DataError(f"{self.field}.columns.{column.name}: column '{column.column}' is not in "
                                f"'{self.uri}'{nearest(column.column, names)}; its columns are {', '.join(names)}. "
                                "Fix: name one of them.")
            kind = self.schema.field(column.column).type
            element, width = _tensor_type(self.schema.field(column.column))
            if not _convertible(element):
                raise DataError(
                    f"{self.field}.columns.{column.name}: column '{column.column}' holds {kind}, "
                    f"which cannot become a tensor{f' of {column.dtype}' if column.dtype else ''}. Fix: "
                    + (f"list the columns to read under {self.field}.columns (without columns, every column is "
                       "read), " if self._all_columns else "choose a numeric or boolean column (or a list of "
                       "them), ") + "or encode this one as numbers when writing the data.")
            if column.shape and width not in (-1,) and math.prod(column.shape) != (width or 1):
                raise DataError(
                    f"{self.field}.columns.{column.name}.shape: {list(column.shape)} holds {math.prod(column.shape)} "
                    f"values, but a row of column '{column.column}' ({kind}) holds {width or 1}. Fix: give a shape "
                    f"of {width or 1} values in all, or leave shape out.")

    def row_group_starts(self) -> list[int]:
        return [g.first_row for g in self.row_groups]


def _fields(schema: pa.Schema) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


class WindowedOrder(Sequence):
    """An epoch's row ids: row groups shuffled by (seed, epoch), then rows shuffled within each
    window of `window` row groups. Lazy: one window's permutation is computed at a time."""

    def __init__(self, group_rows: list[int], group_starts: list[int], *, seed: int, epoch: int, shuffle: bool,
                 window: int):
        self._rows, self._starts = group_rows, group_starts
        self._total = sum(group_rows)
        self._seed, self._epoch, self._shuffle = seed, epoch, shuffle
        count = len(group_rows)
        if shuffle:
            generator = torch.Generator().manual_seed(_mix(seed, epoch))
            groups = torch.randperm(count, generator=generator).tolist()
        else:
            groups = list(range(count))
        self._windows = [groups[i:i + window] for i in range(0, count, window)]
        sizes = [sum(group_rows[g] for g in w) for w in self._windows]
        self._window_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._cached: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._total

    def _window_ids(self, w: int) -> np.ndarray:
        if self._cached is not None and self._cached[0] == w:
            return self._cached[1]
        ids = np.concatenate([np.arange(self._starts[g], self._starts[g] + self._rows[g], dtype=np.int64)
                              for g in self._windows[w]])
        if self._shuffle:
            generator = torch.Generator().manual_seed(_mix(self._seed, self._epoch, w + 1))
            ids = ids[torch.randperm(len(ids), generator=generator).numpy()]
        self._cached = (w, ids)
        return ids

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._total)
            if step != 1:
                raise ValueError("WindowedOrder slices take step 1")
            return self.take(start, stop).tolist()
        if index < 0:
            index += self._total
        return int(self.take(index, index + 1)[0])

    def take(self, start: int, stop: int) -> np.ndarray:
        """Row ids at global positions [start, stop)."""
        parts = []
        while start < stop:
            w = int(np.searchsorted(self._window_starts, start, side="right") - 1)
            ids = self._window_ids(w)
            offset = start - int(self._window_starts[w])
            end = min(stop - start, len(ids) - offset)
            parts.append(ids[offset:offset + end])
            start += end
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _mix(*parts: int) -> int:
    """A 63-bit seed from several integers (so that epochs and windows get unrelated streams)."""
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value ^ (int(part) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        value ^= value >> 31
    return value & 0x7FFFFFFFFFFFFFFF


class ParquetDataset(torch.utils.data.Dataset):
    """Rows of a ParquetSource as dicts of tensors; see the module's docstring.

    A DataLoader over it fetches whole micro-batches through `__getitems__` and takes them as
    they are (`collate`): pass `collate_fn=ParquetDataset.collate`.
    """

    def __init__(self, source: ParquetSource, *, window: int = 4):
        self.source, self.window = source, window
        self._starts = source.row_group_starts()
        self._rows = [g.rows for g in source.row_groups]
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._files: dict[str, Any] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.source.num_rows

    def __getstate__(self) -> dict[str, Any]:
        # Open files and decoded row groups stay with the process that made them (loader workers).
        return {**self.__dict__, "_cache": OrderedDict(), "_files": {}}

    def epoch_order(self, *, seed: int, epoch: int, shuffle: bool) -> WindowedOrder:
        return WindowedOrder(self._rows, self._starts, seed=seed, epoch=epoch, shuffle=shuffle, window=self.window)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        batch = self.__getitems__([index])
        return {name: tensor[0] for name, tensor in batch.items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        ids = np.asarray(indices, dtype=np.int64)
        groups = np.searchsorted(np.asarray(self._starts), ids, side="right") - 1
        out: dict[str, torch.Tensor] = {}
        parts: dict[str, list[np.ndarray]] = {c.name: [] for c in self.source.columns}
        order = np.argsort(groups, kind="stable")
        sorted_groups = groups[order]
        bounds = np.flatnonzero(np.diff(sorted_groups)) + 1
        for chunk in np.split(order, bounds):
            group = int(groups[chunk[0]])
            decoded = self._group(group)
            local = ids[chunk] - self._starts[group]
            for name in parts:
                parts[name].append(decoded[name][local])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        for column in self.source.columns:
            tensor = torch.from_numpy(np.concatenate(parts[column.name])[inverse])
            # numpy has no bfloat16: such columns are decoded as float32 and converted here.
            out[column.name] = tensor.to(torch.bfloat16) if column.dtype == "bfloat16" else tensor
        return out

    @staticmethod
    def collate(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return batch

    def _group(self, index: int) -> dict[str, np.ndarray]:
        if os.getpid() != self._pid:  # a forked loader worker: its own files and cache
            self._cache, self._files, self._pid = OrderedDict(), {}, os.getpid()
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        group = self.source.row_groups[index]
        try:
            handle = self._files.get(group.file)
            if handle is None:
                handle = self._files[group.file] = pq.ParquetFile(self.source._fs.open_input_file(group.file))
            table = handle.read_row_group(group.index,
                                          columns=list(dict.fromkeys(c.column for c in self.source.columns)))
        except (OSError, pa.ArrowInvalid) as exc:  # a damaged page is either; ArrowMemoryError is not ours
            self._files.pop(group.file, None)  # reopened if read again: a hiccup may have left it unusable
            raise ParquetReadError(_unreadable(self.source, group, exc)) from exc
        decoded = {c.name: _to_numpy(table.column(c.column), c, self.source.field) for c in self.source.columns}
        self._cache[index] = decoded
        while len(self._cache) > self.window + 1:
            self._cache.popitem(last=False)
        return decoded


def _unreadable(source: ParquetSource, group: RowGroup, exc: BaseException) -> str:
    scheme = urlparse(source.uri).scheme
    path = f"{scheme}://{group.file}" if scheme not in ("", "file") and len(scheme) > 1 else group.file
    # One line (it ends up in a one-line failure record), without the raw bytes thrift may quote.
    cause = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()).rstrip(".")
    cause = "".join(c if c.isprintable() else "?" for c in cause)
    # No final period: the failure record adds where it was raised.
    return (f"{source.field}.path: row group {group.index} of '{path}' ({group.rows} rows) could not be read "
            f"({type(exc).__name__}: {cause}). A storage hiccup passes; failing the same way after a restart, the "
            f"file is damaged or the workers cannot read it. Fix: check it with pyarrow.parquet.ParquetFile("
            f"'{path}').read_row_group({group.index}) where the workers run, then rewrite the file from its "
            "source, move it out of the data set, or give the workers read access")


def _to_numpy(column: pa.ChunkedArray, spec: Column, field: str) -> np.ndarray:
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if isinstance(array, (pa.FixedSizeListArray, pa.ListArray, pa.LargeListArray)):
        lengths = np.diff(array.offsets.to_numpy()) if not isinstance(array, pa.FixedSizeListArray) else None
        width = array.type.list_size if lengths is None else (int(lengths[0]) if len(lengths) else 0)
        if lengths is not None and (lengths != width).any():
            raise DataError(f"{field}.columns.{spec.name}: column '{spec.column}' holds lists of different lengths "
                            f"({int(lengths.min())} to {int(lengths.max())}), which cannot stack into one tensor. "
                            "Fix: pad them to one length when writing the data.")
        flat = array.flatten().to_numpy(zero_copy_only=False)
        values = flat.reshape(len(array), width)
    else:
        values = array.to_numpy(zero_copy_only=False)
    if spec.dtype:
        values = values.astype(_numpy_dtype(spec.dtype), copy=False)
    if spec.shape:
        values = values.reshape(len(values), *spec.shape)
    return values


def _numpy_dtype(name: str):
    return torch.empty(0, dtype=DTYPES[name]).numpy().dtype if name != "bfloat16" else np.float32
