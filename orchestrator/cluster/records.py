"""Where the driver keeps its records of the clusters it started and of itself (a warm cluster's
record, each embedded cluster's driver), so that a later command finds them or cleans up after them."""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV_VAR = "ORCHESTRATOR_STATE_DIR"
DEFAULT_STATE_DIR = "~/.cache/orchestrator/embedded"


def state_dir() -> Path:
    path = Path(os.path.expanduser(os.environ.get(STATE_DIR_ENV_VAR, DEFAULT_STATE_DIR)))
    path.mkdir(parents=True, exist_ok=True)
    return path
