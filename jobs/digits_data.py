"""The digits data set (8x8 images of handwritten digits, 1797 samples), as Parquet.

scikit-learn ships the data, so nothing is downloaded. On first use it is written with pyarrow to
`$ORCHESTRATOR_DATA_DIR/digits.parquet` (default ~/.cache/orchestrator/data); every worker then
reads the same file. The split is fixed: 1297 train, 200 validation, 300 test.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import TensorDataset

DATA_DIR_ENV_VAR = "ORCHESTRATOR_DATA_DIR"
SPLITS = {"train": (0, 1297), "val": (1297, 1497), "test": (1497, 1797)}
NUM_FEATURES, NUM_CLASSES = 64, 10


def parquet_path() -> Path:
    root = Path(os.path.expanduser(os.environ.get(DATA_DIR_ENV_VAR, "~/.cache/orchestrator/data")))
    return root / "digits.parquet"


def ensure_parquet() -> Path:
    """Write the data set to Parquet once; concurrent workers race safely (write, then rename)."""
    path = parquet_path()
    if path.exists():
        return path
    from sklearn.datasets import load_digits

    digits = load_digits()
    # A fixed shuffle so that the splits mix all writers of the original data set.
    order = np.random.default_rng(0).permutation(len(digits.target))
    table = pa.table({
        "pixels": pa.array(list(digits.data[order].astype(np.float32)), type=pa.list_(pa.float32(), NUM_FEATURES)),
        "label": pa.array(digits.target[order].astype(np.int64)),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def load_split(split: str) -> TensorDataset:
    """One split as tensors: pixels scaled to [0, 1] (float32), labels (int64)."""
    start, stop = SPLITS[split]
    table = pq.read_table(ensure_parquet()).slice(start, stop - start)
    pixels = np.stack(table.column("pixels").to_numpy(zero_copy_only=False)).astype(np.float32) / 16.0
    labels = table.column("label").to_numpy().copy()  # writable: torch warns on read-only arrays
    return TensorDataset(torch.from_numpy(pixels), torch.from_numpy(labels))


SHIPPED_SPLITS = Path(__file__).parent / "data" / "digits"


def write_splits(folder: Path = SHIPPED_SPLITS) -> list[Path]:
    """The three splits as Parquet files a spec's data: section reads (jobs/quickstart.yaml):
    `pixels` (64 float32 in [0, 1]) and `label` (int64). They ship in jobs/data/digits/;
    `python -m jobs.digits_data` writes them again."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for split in SPLITS:
        data = load_split(split)
        pixels, labels = (t.numpy() for t in data.tensors)
        table = pa.table({
            "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), NUM_FEATURES),
            "label": pa.array(labels),
        })
        path = folder / f"{split}.parquet"
        pq.write_table(table, path)
        written.append(path)
    return written


if __name__ == "__main__":
    for written in write_splits():
        print(written)
