"""Where the driver keeps its records of the clusters it started and of itself (a warm cluster's
record, each embedded cluster's driver), so that a later command finds them or cleans up after them."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

from orchestrator.processes import is_alive, session_pids

log = logging.getLogger(__name__)

STATE_DIR_ENV_VAR = "ORCHESTRATOR_STATE_DIR"
DEFAULT_STATE_DIR = "~/.cache/orchestrator/embedded"


def state_dir() -> Path:
    path = Path(os.path.expanduser(os.environ.get(STATE_DIR_ENV_VAR, DEFAULT_STATE_DIR)))
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_path(pid: int) -> Path:
    """The record of the embedded cluster of the driver `pid` (connection.py writes it)."""
    return state_dir() / f"driver-{pid}.json"


def reap_orphans() -> list[int]:
    """End Ray processes left behind by embedded clusters whose driver died (found by the files of
    their session); every driver does it at its start, a local run's too. Returns the pids ended."""
    ended = []
    for record in state_dir().glob("driver-*.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            record.unlink(missing_ok=True)
            continue
        if is_alive(data.get("pid", -1)):
            continue
        session_dir = data.get("session_dir") or ""
        if session_dir:
            for pid in session_pids(session_dir):
                try:
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
                except ProcessLookupError:
                    pass
        record.unlink(missing_ok=True)
    if ended:
        log.warning("ended %d Ray process(es) left behind by a driver that was killed", len(ended))
    return ended
