"""One rank of a real 2-process torch.distributed world, for tests/unit/rank/test_collectives.py.

    python jobdriver_gloo_rank.py RANK PORT MODE HANG_TIMEOUT_S

The world is initialised as `cpu:gloo` (torch's name for a world whose CPU backend is gloo, but
which is not plain "gloo"): on a machine without GPUs it stands for an NCCL world, so the
orchestrator forms its gloo side group exactly as it does beside NCCL. Both ranks configure the
side group from a FailureSpec with HANG_TIMEOUT_S, as every worker session does.

MODE `absent`: rank 1 never takes part in the side group (it waits, then exits); rank 0 tries.
MODE `late`: rank 1 forms the group, then reaches the first collective 2 x HANG_TIMEOUT_S late.
Rank 0 prints one JSON line: seconds taken, and the error's type, text and classification.
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import torch.distributed as dist

from orchestrator.failures import classify
from orchestrator.rank import collectives
from orchestrator.spec import FailureSpec


def main() -> None:
    rank, port, mode, hang_timeout_s = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    dist.init_process_group("cpu:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    try:
        take_part(rank, mode, hang_timeout_s)
    finally:
        # Ended as a well-behaved script ends it: a gloo world left to the interpreter's exit at
        # times aborts the process in its teardown ("terminate called without an active exception").
        dist.destroy_process_group()


def take_part(rank: int, mode: str, hang_timeout_s: float) -> None:
    collectives.configure(FailureSpec(hang_timeout_s=hang_timeout_s))
    if rank == 1:
        if mode == "absent":
            time.sleep(6 * hang_timeout_s)
            return
        collectives.cpu_group()
        time.sleep(2 * hang_timeout_s)
        collectives.broadcast_object(None)
        return
    started = time.monotonic()
    answer = {"mode": mode}
    try:
        answer["value"] = collectives.broadcast_object({"from": "rank 0"})
    except Exception as exc:  # noqa: BLE001 - reported to the test
        answer.update(error_type=type(exc).__name__, error=str(exc), kind=classify(exc),
                      cause_type=type(exc.__cause__).__name__)
    answer["seconds"] = time.monotonic() - started
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
