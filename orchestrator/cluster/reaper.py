"""`python -m orchestrator.cluster.reaper COMMAND...`: run a command as the reaper of everything it starts.

The warm cluster's keeper. Ray's processes start processes of their own (the raylet starts its
agents); when one of them ends before its children, the children are adopted by the nearest
"child subreaper" up the tree, or by init. On a host whose shell, terminal multiplexer or
container init adopts orphans without reaping them, every stopped agent then stays a zombie under
the shell that ran `orchestrator up`. This process marks itself as the subreaper of its tree, so
that whatever the command leaves is adopted and reaped here; it forwards SIGTERM and SIGINT to the
command and exits, with the command's status, once nothing of the tree is left.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

# prctl(2) option: this process adopts the orphans of its descendants (Linux 3.4+).
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Whether this process is now its descendants' reaper (False where the OS cannot do it)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(command: list[str]) -> int:
    become_subreaper()
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    status = 1
    while True:
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:  # nothing of the tree is left
            return status
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
