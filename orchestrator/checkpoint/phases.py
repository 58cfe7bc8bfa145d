"""The named phases of a checkpoint save, in order, and a kill switch at each one, for tests.

Tests prove that a crash at any instant loses nothing committed by setting
ORCHESTRATOR_TEST_KILL_AT in the writing process: it SIGKILLs itself when a save reaches a phase
it names. Nothing else reads these variables.

    ORCHESTRATOR_TEST_KILL_AT=<phase>[@<step>][,<phase>[@<step>]...]
    ORCHESTRATOR_TEST_KILL_MARKERS=<folder>      (optional)

Without a marker folder, every point listed kills the process each time it is reached. With one,
each point kills once in the whole run: before the SIGKILL, the process creates
`<folder>/<phase>@<step>` exclusively (its pid, thread, rank and phase inside, fsynced), and a
point whose marker exists is passed, so a rank restarted after the kill replays the same save
without dying again, and one real run can be killed at several phases in turn. The kill hits the
process the save runs in, whichever thread reached the phase (a rank's background writer).

    file_partial      the first bytes of a payload file are written, the rest are not
    files_written     every payload file is written (and fsynced), the manifest is not
    shard_written     sharded: this rank's files are written, its receipt is not
    receipt_written   sharded: this rank's receipt is written; rank 0 has not committed
    manifest_written  the manifest is written: on an object store this is the commit; locally
                      the folder still has its temporary name
    published         local: the folder has its final name, the directory is not yet fsynced
    verified          the new checkpoint was read back and matched; retention has not run
    retention         retention has moved an old checkpoint out of view (locally) or deleted its
                      manifest (object store) and not yet removed the rest; numbered by the step
                      it deletes, not the step being saved
"""

from __future__ import annotations

import json
import os
import signal
import threading

KILL_ENV = "ORCHESTRATOR_TEST_KILL_AT"
MARKERS_ENV = "ORCHESTRATOR_TEST_KILL_MARKERS"

UNSHARDED = ("file_partial", "files_written", "manifest_written", "published", "verified", "retention")
SHARDED = ("file_partial", "shard_written", "receipt_written", "manifest_written", "published", "verified",
           "retention")


def reached(phase: str, step: int) -> None:
    targets = os.environ.get(KILL_ENV)
    if not targets:
        return
    for target in targets.split(","):
        name, _, at = target.strip().partition("@")
        if name == phase and (not at or int(at) == step):
            markers = os.environ.get(MARKERS_ENV)
            if markers and not _first_time(markers, f"{phase}@{step}", phase, step):
                continue
            os.kill(os.getpid(), signal.SIGKILL)


def _first_time(folder: str, name: str, phase: str, step: int) -> bool:
    """Leave this kill's marker, durably; False when an earlier process left it already."""
    try:
        fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps({"phase": phase, "step": step, "pid": os.getpid(),
                                 "thread": threading.current_thread().name,
                                 "rank": os.environ.get("RANK")}).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
