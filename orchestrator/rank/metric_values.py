"""Metrics as plain floats, the one form summary.json, checkpoint manifests and the driver take.

Both harnesses and the session convert through here: a one-element tensor, a number or a numpy
scalar becomes a float. `strict` is for values the user passed by name (`ctx.step(loss=...)`,
`ctx.report(...)`): anything else is their mistake, said as such. Otherwise (Lightning's
`callback_metrics`, whose entries the user did not choose one by one) it is left out.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.errors import UserError


def metric_floats(metrics: dict[str, Any], *, strict: bool = False) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        # A flag the user passed by name counts as 1.0 or 0.0; Lightning's are its own bookkeeping.
        number = float(value) if strict and isinstance(value, bool) else _number(value)
        if number is not None:
            out[key] = number
        elif strict:
            raise UserError(
                f"metric '{key}' = {str(value)[:80]!r} (a {type(value).__name__}) is not a number: metrics are "
                "recorded as floats in summary.json, the checkpoints and Prometheus. Fix: pass a number or a "
                f"one-element tensor, e.g. ctx.step({key}=loss.item()).")
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        return float(value.detach()) if value.numel() == 1 else None
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0 and hasattr(value, "item"):
        return _number(value.item())
    return None
