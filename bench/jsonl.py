"""Reading the JSON-lines event files the benchmark jobs append to while they run."""

from __future__ import annotations

import json


def read_jsonl(path: str) -> list[dict]:
    """Every complete line of `path` (none if it does not exist yet); a line still being written is skipped."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found
