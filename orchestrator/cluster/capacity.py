"""What a run's workers need from the cluster, and how many of them its nodes can hold.

Shared by the driver's capacity reports while a run waits (driver/console.py) and by the
preflight check (`orchestrator doctor`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from orchestrator.spec import JobSpec


def worker_resources(job: JobSpec) -> dict[str, float]:
    """One worker's resource request, as Ray Train asks for it."""
    per_worker = dict(job.scaling.resources_per_worker)
    if job.scaling.use_gpu:
        per_worker.setdefault("GPU", 1.0)
    return per_worker


def workers_that_fit(per_worker: Mapping[str, float], nodes: Iterable[Mapping[str, float]], limit: int) -> int:
    """How many workers of `per_worker` the nodes (their resources) hold at most, up to `limit`.

    A worker lives on one node: resources spread over nodes do not add up across a worker.
    """
    return sum(min((math.floor(node.get(k, 0.0) / v + 1e-9) if v else limit) for k, v in per_worker.items())
               if per_worker else limit for node in nodes)


def fmt(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
