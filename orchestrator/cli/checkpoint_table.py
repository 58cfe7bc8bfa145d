"""A run's checkpoints and whether they are whole, for `orchestrator checkpoints` (cli/checkpoints.py) and doctor."""

from __future__ import annotations

import datetime as dt
import os

from orchestrator import storage
from orchestrator.checkpoint import CheckpointInfo, CheckpointStore
from orchestrator.errors import UserError
from orchestrator.spec import DEFAULT_STORAGE


def locate_run(name_or_dir: str, storage_uri: str | None) -> storage.Location:
    """A run directory from a path/URI, or from a run name under --storage (default ~/orchestrator-runs)."""
    looks_like_path = "/" in name_or_dir or "://" in name_or_dir or os.path.isdir(name_or_dir)
    if looks_like_path:
        loc = storage.resolve(name_or_dir)
    else:
        loc = storage.resolve(storage_uri or DEFAULT_STORAGE).join(name_or_dir)
    if not storage.exists(loc):
        raise UserError(
            f"run '{name_or_dir}' was not found at {loc.uri}. Fix: pass the run directory, or the run's "
            "name with --storage set to where its runs live."
        )
    return loc


def table(infos: list[CheckpointInfo]) -> str:
    header = ("checkpoint", "step", "epoch", "batch", "reason", "written (UTC)", "size", "status", "metrics")
    rows = []
    for info in infos:
        m = info.manifest
        metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(m.metrics.items())) if m else ""
        status = info.status if not info.problem else f"{info.status}: {info.problem}"
        rows.append((
            info.name, str(info.step) if info.step >= 0 else "-", str(m.epoch) if m else "-",
            str(m.batch_in_epoch) if m else "-", m.reason if m else "-",
            dt.datetime.fromtimestamp(m.created_at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if m else "-",
            _size(info.size_bytes) if m else "-", status, metrics,
        ))
    return text_table([header, *rows])


def text_table(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells (the first one the header) as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def show(name_or_dir: str, *, storage_uri: str | None = None, verify: bool = False) -> tuple[str, list[CheckpointInfo]]:
    store = CheckpointStore(locate_run(name_or_dir, storage_uri))
    infos = store.scan()
    if verify:
        infos = [store.verify(i) for i in infos]
    if not infos:
        return f"no checkpoints in {store.root.uri}", infos
    return table(infos), infos
