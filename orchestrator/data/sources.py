"""The spec's data sources opened as Parquet: each rank's datasets, and the driver's check, before
Ray starts, that every source opens and the training input holds a global batch.

`source` is the spec's DataSourceSpec and `job` its JobSpec (spec/data.py, spec/model.py), read by
their fields: data/ sits below spec/ and does not import it.
"""

from __future__ import annotations

from orchestrator.data.parquet import Column, DataError, ParquetSource

# The spec's data sources (spec/data.py SOURCES), the training input first.
SOURCES = ("train", "val", "test")


def open_source(source, field_path: str) -> ParquetSource:
    """The ParquetSource of a data source (footers read, columns checked)."""
    columns = [Column(name, c.column or name, c.dtype, tuple(c.shape) if c.shape else None)
               for name, c in source.columns.items()]
    return ParquetSource(source.path, columns, field=field_path)


def check_data_input(job) -> None:
    """On the driver, before Ray starts: every data source opens, and the training input holds at
    least one global batch at the smallest world size the run may have."""
    data = job.data
    if data is None:
        return
    for name in SOURCES:
        source = getattr(data, name)
        if source is None:
            continue
        opened = open_source(source, f"data.{name}")
        if name != "train":
            continue
        workers = job.scaling.min_workers if job.scaling.elastic else job.scaling.num_workers
        global_batch = job.scaling.global_batch_size or source.batch_size * workers
        if opened.num_rows < global_batch:
            why = ("scaling.global_batch_size" if job.scaling.global_batch_size
                   else f"batch_size {source.batch_size} x {workers} workers")
            raise DataError(
                f"data.train.path: '{source.path}' holds {opened.num_rows} rows, fewer than one global batch of "
                f"{global_batch} ({why}), "
                "so no optimizer step could be taken. Fix: lower data.train.batch_size (or "
                "scaling.global_batch_size / num_workers), or use more data.")
