"""A ctx job that records what its ranks' environment holds before it trains: with `env_seen:
{dir, variables}` in its config, each rank writes those variables as its process sees them (null
where unset) to <dir>/rank-<rank>.json, then runs jobs.digits_torch's loop."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jobs.digits_torch import train_loop as digits_loop


def train_loop(ctx) -> None:
    seen = ctx.config.pop("env_seen")
    values = {name: os.environ.get(name) for name in seen["variables"]}
    Path(seen["dir"], f"rank-{ctx.rank}.json").write_text(json.dumps(values))
    digits_loop(ctx)
