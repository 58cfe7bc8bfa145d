"""A stand-in for the user's shell where orphaned processes land: a child subreaper (as tmux,
systemd's user manager or a container's shell are), which adopts whatever its children leave.

    python subreaper_shell.py -- orchestrator up

runs the command, then waits for a line on stdin; at "down" it runs `orchestrator down`, and
prints one JSON line: the exit codes, and the zombies it holds (adopted processes that ended and
that nobody reaped), by name. Then it reaps them and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def zombies() -> list[dict]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                name, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        state, ppid = rest.split()[:2]
        if state == "Z" and int(ppid) == os.getpid():
            found.append({"pid": int(entry), "name": name.split("(", 1)[1]})
    return found


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    command = sys.argv[sys.argv.index("--") + 1:]
    up = subprocess.run(command, capture_output=True, text=True)
    print(json.dumps({"up": up.returncode, "out": up.stdout + up.stderr}), flush=True)
    sys.stdin.readline()
    down = subprocess.run([*command[:-1], "down"], capture_output=True, text=True)
    time.sleep(1.0)  # what the cluster's processes leave behind has landed here by now
    print(json.dumps({"down": down.returncode, "out": down.stdout + down.stderr, "zombies": zombies()}), flush=True)
    while True:  # reap them
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break


if __name__ == "__main__":
    main()
