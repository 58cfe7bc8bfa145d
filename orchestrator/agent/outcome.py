"""What a rank child's end says, as the node's agent reports it to the run monitor (monitor/attempts.py)."""

from __future__ import annotations

import signal

from orchestrator.failures import EXIT, INFRASTRUCTURE, FailureRecord


def failure_of(child, node_id: str, hostname: str) -> FailureRecord:
    """The failure record of a child (children.Child) that ended with a non-zero status."""
    code = child.process.returncode
    place = {"rank": child.rank, "node_id": node_id, "hostname": hostname, "pid": child.process.pid,
             "log": child.log_path, "last_lines": child.last_lines()}
    # The exception the rank wrote before it ended is its cause, even when the process then died by
    # a signal in the interpreter's teardown (torch 2.13's gloo at times aborts there).
    written = child.failure()
    if code < 0 and written is None:
        why = " (the kernel's OOM killer sends it too: check the node's memory)" if -code == signal.SIGKILL else ""
        return FailureRecord(**place, kind=INFRASTRUCTURE, decisive=True,
                             error=f"the process was killed by {signal_name(-code)}{why}")
    if written is None:  # no Python exception: os._exit, or a crash in native code
        return FailureRecord(**place, kind=INFRASTRUCTURE, decisive=False,
                             error=f"the process exited with status {code} without a Python exception")
    record = FailureRecord.from_dict({**written, **place})  # where it ran is the agent's to say
    if child.ended_failing:
        record.note = ("its process had not ended within failure.hang_timeout_s of this error (an exception handler "
                       "or a teardown that did not return), and was ended")
    # A user error decides at once; an infrastructure error or the script's own exit status
    # waits SETTLE_S for a peer's user error that may be its cause (attempts.py).
    record.decisive = record.kind not in (INFRASTRUCTURE, EXIT)
    return record


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
