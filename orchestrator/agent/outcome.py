"""What a rank child's end says, as the node's agent reports it to the run monitor (monitor/attempts.py)."""

from __future__ import annotations

import signal
from typing import Any

from orchestrator.failures import INFRASTRUCTURE

# A script's rank exits non-zero with a status it chose (sys.exit): restarted, as under torchrun.
EXIT = "exit"


def failure_of(child, node_id: str, hostname: str) -> dict[str, Any]:
    """The failure record of a child (children.Child) that ended with a non-zero status."""
    code = child.process.returncode
    place = {"rank": child.rank, "node_id": node_id, "hostname": hostname, "pid": child.process.pid,
             "log": child.log_path, "last_lines": child.last_lines()}
    # The exception the rank wrote before it ended is its cause, even when the process then died by
    # a signal in the interpreter's teardown (torch 2.13's gloo at times aborts there).
    record = child.failure()
    if code < 0 and record is None:
        why = " (the kernel's OOM killer sends it too: check the node's memory)" if -code == signal.SIGKILL else ""
        return {**place, "kind": INFRASTRUCTURE, "decisive": True, "where": "",
                "error": f"the process was killed by {signal_name(-code)}{why}"}
    if record is None:  # no Python exception: os._exit, or a crash in native code
        return {**place, "kind": INFRASTRUCTURE, "decisive": False, "where": "",
                "error": f"the process exited with status {code} without a Python exception"}
    if child.ended_failing:
        record = {**record, "note": ("its process had not ended within failure.hang_timeout_s of this error (an "
                                     "exception handler or a teardown that did not return), and was ended")}
    # A user error decides at once; an infrastructure error or the script's own exit status
    # waits SETTLE_S for a peer's user error that may be its cause (attempts.py).
    return {**place, **record, "decisive": record["kind"] not in (INFRASTRUCTURE, EXIT)}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
