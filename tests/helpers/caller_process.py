"""A Python caller of `orchestrator.run()` in local mode with processes of its own, as a notebook's
kernel or a sweep's driver has them (tests/e2e/test_caller_process.py):

    python caller_process.py FOLDER [--beside]

It holds a child of its own (`sleep`) across the run, and orphans a grandchild of its own (a
shell's `sleep &`, the shell gone at once) while the run trains. The run is a torchrun script of
one rank (RANK_SCRIPT, no torch) that starts a daemon of its own outside its session (setsid),
says so, and waits for the caller's go. With --beside, a second local run of the same script
trains in a thread beside the first, started before it and ended after it.

It prints what it saw as one JSON line at the end: each run's status and restarts, whether its
own child, its orphan and each run's rank daemon were alive once the runs returned (and the
second run's rank and daemon once the first returned), and the exit status its own child's
`wait()` reported after it was sent SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import orchestrator

RANK_SCRIPT = '''
import os, subprocess, sys, time
folder, name = sys.argv[1], sys.argv[2]
daemon = subprocess.Popen(["sleep", "600"], start_new_session=True)  # setsid: out of the rank's session
for what, pid in (("daemon", daemon.pid), ("rank", os.getpid())):
    with open(os.path.join(folder, f"{name}.{what}.partial"), "w") as f:
        f.write(str(pid))
    os.replace(os.path.join(folder, f"{name}.{what}.partial"), os.path.join(folder, f"{name}.{what}"))
print(f"{name}: rank ready", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(folder, name + ".go")):
    if time.monotonic() > deadline:
        sys.exit(f"{name}: no go from the caller within 120 s")
    time.sleep(0.05)
'''


def _spec(folder: str, name: str) -> dict:
    return {"name": name, "storage": os.path.join(folder, "runs"),
            "script": {"path": os.path.join(folder, "rank.py"), "args": [folder, name], "nproc_per_node": 1},
            "scaling": {"num_workers": 1}, "failure": {"max_failures": 1}}


def _pid(path: str) -> int:
    with open(path) as f:
        return int(f.read())


def _alive(path: str) -> bool:
    """Whether the process whose pid the file holds runs (a zombie has ended)."""
    try:
        with open(f"/proc/{_pid(path)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError):
        return False


def _kill(path: str) -> None:
    try:
        os.kill(_pid(path), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def main(folder: str, beside: bool) -> None:
    with open(os.path.join(folder, "rank.py"), "w") as f:
        f.write(RANK_SCRIPT)
    own = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    orphan = os.path.join(folder, "orphan.pid")
    try:
        print(json.dumps(_runs(folder, beside, own, orphan)), flush=True)
    finally:
        own.kill()
        _kill(orphan)


def _runs(folder: str, beside: bool, own: subprocess.Popen, orphan: str) -> dict:
    lines: list[str] = []

    def console(line: str) -> None:
        lines.append(line)
        print(line, flush=True)
        if line.startswith("first: rank ready"):
            # A grandchild of this process's, orphaned while the run is on: the shell exits at once.
            subprocess.run(["sh", "-c", f"sleep 600 >/dev/null 2>&1 & echo $! > {orphan}"], check=True)
            open(os.path.join(folder, "first.go"), "w").close()

    results: dict[str, object] = {}
    other = None
    if beside:
        def second() -> None:
            results["second"] = orchestrator.run(_spec(folder, "second"), mode="local", console=print)

        other = threading.Thread(target=second)
        other.start()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(folder, "second.rank")) and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        results["first"] = orchestrator.run(_spec(folder, "first"), mode="local", console=console)
        seen: dict[str, object] = {"first_line": next((x for x in lines if not x.startswith("run name: ")), "")}
        seen["own_alive"] = own.poll() is None
        seen["orphan_alive"] = _alive(orphan)
        if other is not None:
            seen["second_while_first_ended"] = {what: _alive(os.path.join(folder, f"second.{what}"))
                                                for what in ("rank", "daemon")}
    finally:
        open(os.path.join(folder, "second.go"), "w").close()
        if other is not None:
            other.join(timeout=120)
    for name, result in results.items():
        seen[name] = {"status": result.status, "restarts": result.restarts,
                      "daemon_alive": _alive(os.path.join(folder, name + ".daemon"))}
    own.send_signal(signal.SIGTERM)
    seen["own_wait"] = own.wait(timeout=30)
    return seen


if __name__ == "__main__":
    main(sys.argv[1], "--beside" in sys.argv[2:])
