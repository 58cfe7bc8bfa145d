"""A run's history: one file a driver, `<run>/history/<start>-<host>-<pid>.json`, with what that
driver's part of the run went through (its attempts, failures, restarts, checkpoint commits,
straggler warnings, each rank's steps over time and its goodput), for `orchestrator report`.

summary.json holds the newest driver's outcome and is replaced by the next resume; the history
keeps every driver's part, so a report of a run resumed three times draws all four. A driver
writes its file at a stop signal and at the end (rewriting its own file, never another's); a
driver killed outright leaves none, and the report says so by the gap.
"""

from __future__ import annotations

import json
import time
from typing import Any

from orchestrator import storage
from orchestrator.protocol import Event
from orchestrator.storage import Location

HISTORY_DIR = "history"
VERSION = 1
# Rank 0's progress reports and the hang's stacks are summary.json's and the logs' to keep: the
# time line needs neither, and a long run has thousands of the former.
LEFT_OUT = {"progress", "stacks"}


def file_name(started: float, host: str, pid: int) -> str:
    """Names sort by the driver's start."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    return f"{stamp}-{host}-{pid}.json"


def record(*, started: float, ended: float, host: str, pid: int, status: str, error: str | None,
           goodput: dict[str, Any], events: list[Event], step_series: dict[str, list[list[float]]]) -> dict[str, Any]:
    return {"version": VERSION, "driver": {"host": host, "pid": pid, "started": started, "ended": ended},
            "status": status, "error": error, "goodput": goodput,
            "events": [e.to_record() for e in events if e.kind not in LEFT_OUT], "step_series": step_series}


def write(run_dir: Location, entry: dict[str, Any]) -> None:
    driver = entry["driver"]
    name = file_name(driver["started"], driver["host"], driver["pid"])
    storage.write_atomic(run_dir.join(HISTORY_DIR).join(name), json.dumps(entry).encode())


def load(run_dir: Location) -> tuple[list[dict[str, Any]], list[str]]:
    """Every driver's entry, oldest first, and what could not be read (a file per line)."""
    folder = run_dir.join(HISTORY_DIR)
    try:
        infos = storage.list_dir(folder)
    except FileNotFoundError:
        return [], []
    entries, unreadable = [], []
    for info in sorted(infos, key=lambda i: i.base_name):
        if not info.base_name.endswith(".json"):
            continue
        try:
            entry = json.loads(storage.read_bytes(folder.join(info.base_name)))
            if entry.get("version") != VERSION:
                raise ValueError(f"version {entry.get('version')!r}, this orchestrator reads {VERSION}")
            entries.append(entry)
        except (OSError, ValueError) as exc:
            unreadable.append(f"{info.base_name}: {exc}")
    return entries, unreadable
