"""A long-lived Python process that calls orchestrator.run() on a tiny local ctx job several times
(`python repeated_local_runs.py STORAGE RUNS`), and after each run prints one JSON line of what the
process holds: its threads, its open file descriptors, the Unix sockets of this process's name
the kernel still lists, and the objects of a run (run monitors, agents, agent links) alive."""

from __future__ import annotations

import gc
import json
import os
import sys
import threading

import orchestrator
from orchestrator.agent.supervisor import Supervisor
from orchestrator.monitor.actor import RunMonitor
from orchestrator.rank.agent_link import LinkServer


def spec(storage: str, n: int) -> dict:
    return {"name": f"again-{n}", "storage": storage, "seed": 0,
            "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 2,
                      "config": {"hidden": 16, "batch_size": 32}},
            "scaling": {"num_workers": 1}, "checkpoint": {"every_n_steps": 100}}


def held() -> dict:
    gc.collect()
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:  # (the listing's own descriptor, closed by now)
            pass
    with open("/proc/net/unix") as f:  # a socket of this process's agent: its pid in the name or path
        sockets = [line.split()[-1] for line in f if f"-{os.getpid()}-" in line and "orchestrator" in line]
    # (type(...) is: Ray's ActorClass object for RunMonitor counts as an instance of its class.)
    objects = {kind.__name__: sum(1 for o in gc.get_objects() if type(o) is kind)
               for kind in (RunMonitor.__ray_actor_class__, Supervisor, LinkServer)}
    return {"threads": sorted(t.name for t in threading.enumerate()), "fds": sorted(fds), "sockets": sockets,
            "objects": objects}


if __name__ == "__main__":
    storage, runs = sys.argv[1], int(sys.argv[2])
    for n in range(runs):
        result = orchestrator.run(spec(storage, n), mode="local", console=None)
        print(json.dumps({"run": n, "status": result.status, **held()}), flush=True)
