"""The Ray and torch timeouts a run is given, set in the driver's environment: they make a run notice
failures and recover from them fast.

Ray's defaults suit long jobs that can wait: a worker that stops answering is given 10 minutes,
a worker group that cannot be placed is retried every minute forever, and a restart waits up to
30 s for the old process group to shut down. The orchestrator derives them from the spec:

| setting | Ray's default | ours | why |
|---|---|---|---|
| RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S | 600 | failure.hang_timeout_s | a frozen worker is a hang |
| RAY_TRAIN_HEALTH_CHECK_INTERVAL_S | 2 | 1 | notice a dead worker within a second |
| RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S | 60 | failure.capacity_timeout_s; elastic: 10 | one wait, then a clear error |
| TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S | 30 | 2 | a frozen or dead rank never answers the shutdown |
| TorchConfig(timeout_s) | 1800 | max(600, 10 x hang_timeout_s) | a backstop; the watchdog knows phases |
| RAY_TRAIN_ENABLE_STATE_TRACKING | 0 | 1 | Ray Train's state API (`/api/train/v2/runs`) lists the run and its workers |

The RAY_TRAIN_* values reach Ray Train's controller from the driver's environment (Ray
propagates them). The process-group shutdown timeout is read by the controller process itself:
an embedded cluster inherits it from the driver; a driver joining a cluster passes it in its
job's runtime environment unless the job already sets it. A user's own value of any of them,
exported before the run, wins.

An elastic run (scaling.num_workers [min, max]) starts with as many workers as the cluster's
alive nodes hold. Right after a node is lost, Ray may still list it, and the first start asks for
too many workers: with a 10 s start timeout (retried without limit) the next try, at the size the
cluster really has, comes soon instead of after a minute.

What the cluster decides (the GCS health checks that declare a node dead, ~30 s by default) is
the cluster's: see docs/failures.md, "Fast recovery".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from orchestrator.spec import FailureSpec, ScalingSpec

HEALTH_CHECK_INTERVAL_S = 1.0
PROCESS_GROUP_SHUTDOWN_TIMEOUT_S = 2
# Elastic runs: seconds a worker group start waits for its placement before Ray Train tries again
# (at the size the cluster has then).
ELASTIC_START_TIMEOUT_S = 10.0


def ray_train_env(failure: FailureSpec, scaling: ScalingSpec) -> dict[str, str]:
    """Variables Ray Train's controller reads, from the driver's environment."""
    elastic = scaling.elastic
    start_timeout = ELASTIC_START_TIMEOUT_S if elastic else failure.capacity_timeout_s
    return {
        "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S": f"{failure.hang_timeout_s:g}",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": f"{HEALTH_CHECK_INTERVAL_S:g}",
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": f"{start_timeout:g}",
        "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",
    }


def controller_process_env() -> dict[str, str]:
    """Variables the controller's process must have from its start."""
    return {"TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S": str(PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)}


@contextlib.contextmanager
def recovery_settings(failure: FailureSpec, scaling: ScalingSpec) -> Iterator[dict[str, str]]:
    """Set the recovery variables in this process for the run, restoring the environment after.

    Yields the controller-process variables the user did not set (for a joined cluster's job
    runtime environment).
    """
    wanted = {**ray_train_env(failure, scaling), **controller_process_env()}
    ours = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(ours)
    try:
        yield {k: v for k, v in ours.items() if k in controller_process_env()}
    finally:
        for key in ours:
            os.environ.pop(key, None)
