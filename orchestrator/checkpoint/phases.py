"""The named phases of a checkpoint save, in order, and a kill switch at each one, for tests.

Tests prove that a crash at any instant loses nothing committed by setting
ORCHESTRATOR_TEST_KILL_AT=<phase> (or <phase>@<step>) in the writing process: it SIGKILLs itself
when the save reaches that phase. Nothing else reads the variable.

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

import os
import signal

KILL_ENV = "ORCHESTRATOR_TEST_KILL_AT"

UNSHARDED = ("file_partial", "files_written", "manifest_written", "published", "verified", "retention")
SHARDED = ("file_partial", "shard_written", "receipt_written", "manifest_written", "published", "verified",
           "retention")


def reached(phase: str, step: int) -> None:
    target = os.environ.get(KILL_ENV)
    if not target:
        return
    name, _, at = target.partition("@")
    if name == phase and (not at or int(at) == step):
        os.kill(os.getpid(), signal.SIGKILL)
