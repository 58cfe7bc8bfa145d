"""A Python caller of `orchestrator.run()` with SIGINT and SIGTERM handlers of its own, as a
notebook's kernel or a sweep's driver has them (tests/e2e/test_python_api.py):

    python python_api_caller.py FOLDER          # local mode: a bad spec, a stop, a failure
    python python_api_caller.py FOLDER --ray    # imports ray first, then a run on the warm cluster

Local: a spec with a mistake; a run of tests/helpers/python_api_jobs.py's stepping_loop with `__`
overrides (one field, and a dict for a part), sent SIGINT by this process once it steps; a run of
its save_then_raise. After each, it sends itself SIGINT and SIGTERM to see whose handlers run.
It prints what it saw as one JSON line at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

heard: list[str] = []


def _own(signum, frame) -> None:
    heard.append(signal.Signals(signum).name)


def _handlers_are_mine() -> bool:
    """Whether a SIGINT and a SIGTERM now reach this caller's own handler (both delivered for real)."""
    before = len(heard)
    for signum in (signal.SIGINT, signal.SIGTERM):
        os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 10
    while len(heard) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return heard[before:] == ["SIGINT", "SIGTERM"]


def _raised(call) -> dict:
    started = time.monotonic()
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - what it raised is what the test checks
        return {"raised": type(exc).__name__, "message": str(exc), "signal_name": getattr(exc, "signal_name", None),
                "seconds": time.monotonic() - started}
    return {"returned": result.status, "seconds": time.monotonic() - started}


def _spec(folder: str, name: str, loop: str, config: dict, max_epochs: int = 1) -> dict:
    return {"name": name, "storage": os.path.join(folder, "runs"), "seed": 0,
            "torch": {"train_loop": f"python_api_jobs:{loop}", "max_epochs": max_epochs, "config": config},
            "scaling": {"num_workers": 1}, "checkpoint": {"every_n_steps": 1000}, "failure": {"max_failures": 1}}


def local(folder: str) -> dict:
    import orchestrator

    seen: dict[str, object] = {}
    seen["bad_spec"] = _raised(lambda: orchestrator.run({"name": "bad", "torch": {"max_epochs": 1}}, mode="local"))

    marker = os.path.join(folder, "stepping")

    def interrupt() -> None:  # Ctrl-C, once the loop steps
        deadline = time.monotonic() + 240
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    spec = _spec(folder, "stopped", "stepping_loop",
                 {"steps": 2000, "kept": "yes", "marker": marker, "mark_at": 3, "part": {"old": 1, "x": 1}})
    seen["stopped"] = _raised(lambda: orchestrator.run(
        spec, mode="local", torch__config__config_out=os.path.join(folder, "config.json"),
        torch__config__part={"x": 2}))
    sender.join(timeout=10)
    seen["config"] = json.load(open(os.path.join(folder, "config.json")))
    seen["mine_after_stop"] = _handlers_are_mine()

    seen["failed"] = _raised(lambda: orchestrator.run(_spec(folder, "raised", "save_then_raise", {"mib": 64}),
                                                      mode="local"))
    seen["mine_after_failure"] = _handlers_are_mine()
    seen["heard"] = heard
    return seen


def after_ray(folder: str) -> dict:
    import ray  # noqa: F401 - imported first, as a notebook that used Ray before does

    import orchestrator

    return {"run": _raised(lambda: orchestrator.run(_spec(folder, "late", "stepping_loop", {"steps": 1}),
                                                    mode="ray"))}


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _own)
    signal.signal(signal.SIGTERM, _own)
    seen = after_ray(sys.argv[1]) if "--ray" in sys.argv[2:] else local(sys.argv[1])
    print(json.dumps(seen), flush=True)
