"""The runs under a storage location, for `orchestrator status` (cli/status.py): state, step, goodput, slowest rank.

A run's state comes from its writer lease and its summary:
- running: a driver holds the lease (heartbeat fresher than LEASE_TTL_S; on this host, its
  process alive);
- driver died: the lease was never released and its holder is gone (killed, its node lost); the
  run resumes from its newest checkpoint when started again;
- finished | failed | stopped: what the last driver wrote into summary.json when it ended.
Step and epoch are the newest committed checkpoint's (what a resume would continue from), or the
summary's when there is none; restarts, world size and goodput come from the summary.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
import time
from typing import Any

import pyarrow.fs as pafs

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.checkpoint.lease import current_holder
from orchestrator.cli.checkpoint_table import text_table
from orchestrator.errors import UserError
from orchestrator.observe.result import RunResult
from orchestrator.run_dir import RunDir
from orchestrator.spec import DEFAULT_STORAGE

COLUMNS = ("run", "state", "step", "epoch", "checkpoint", "age", "restarts", "workers", "goodput", "slowest")


def run_states(storage_uri: str | None, name: str | None = None, *, now: float | None = None) -> list[dict[str, Any]]:
    """One record per run directory under `storage_uri` (or the one named), sorted by name."""
    root = storage.resolve(storage_uri or DEFAULT_STORAGE)
    if not storage.exists(root):
        raise UserError(f"no runs: {root.uri} does not exist. Fix: pass --storage with where your runs live "
                        "(the spec's storage).")
    if name is not None:
        names = [name]
        if not storage.exists(root.join(name)):
            raise UserError(f"run '{name}' was not found under {root.uri}. Fix: check the name, or pass "
                            "--storage with where its runs live (the spec's storage).")
    else:
        names = sorted(entry.base_name for entry in storage.list_dir(root)
                       if entry.type == pafs.FileType.Directory and _is_run(root.join(entry.base_name)))
    moment = time.time() if now is None else now
    return [run_state(RunDir(root.join(n)), moment) for n in names]


def _is_run(loc: storage.Location) -> bool:
    layout = RunDir(loc)
    return any(storage.exists(p) for p in (layout.lease, layout.summary, layout.checkpoints))


def run_state(layout: RunDir, now: float) -> dict[str, Any]:
    holder, live = current_holder(layout, now=lambda: now)
    summary = RunResult.load(layout.location)
    newest = next(reversed(CheckpointStore(layout.location).committed()), None)
    if live:
        state = "running"
    elif holder is not None and holder.released_at is None:
        state = "driver died"
    elif summary is not None:
        state = "finished" if summary.status == "already_finished" else summary.status
    else:
        state = "unknown"
    manifest = newest.manifest if newest is not None else None
    return {
        "run": posixpath.basename(layout.location.path.rstrip("/")),
        "run_dir": layout.uri,
        "state": state,
        "step": manifest.step if manifest else (summary.global_step if summary else None),
        "epoch": manifest.epoch if manifest else (summary.epochs if summary else None),
        "checkpoint": newest.uri if newest is not None else None,
        "checkpoint_age_s": round(now - manifest.created_at, 1) if manifest else None,
        "restarts": summary.restarts if summary and state != "running" else None,
        "world_size": (manifest.world_size if manifest and state == "running"
                       else summary.world_size if summary else None),
        "goodput": (summary.goodput or {}).get("goodput") if summary and state != "running" else None,
        # The slowest rank at the run's end against its peers' median own work a step (stragglers.py).
        "slowest_rank": summary.slowest_rank if summary and state != "running" else None,
        "driver": ({"host": holder.host, "pid": holder.pid, "heartbeat_age_s": round(now - holder.heartbeat_at, 1)}
                   if holder is not None else None),
    }


def as_json(records: list[dict[str, Any]]) -> str:
    return json.dumps(records, indent=2)


def table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "no runs"
    rows = [COLUMNS]
    for r in records:
        rows.append((
            r["run"], r["state"], _cell(r["step"]), _cell(r["epoch"]),
            r["checkpoint"].rstrip("/").rsplit("/", 1)[-1] if r["checkpoint"] else "-",
            _age(r["checkpoint_age_s"]), _cell(r["restarts"]), _cell(r["world_size"]),
            f"{100 * r['goodput']:.1f}%" if r["goodput"] is not None else "-",
            _slowest(r["slowest_rank"]),
        ))
    return text_table(rows)


def _slowest(slowest: dict[str, Any] | None) -> str:
    if not slowest or not slowest.get("ratio"):
        return "-"
    return f"rank {slowest['rank']} {slowest['ratio']:.2f}x"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return str(dt.timedelta(seconds=int(max(0, seconds))))
