"""A SIGKILL at every named phase of a save, on local storage and on S3, unsharded and sharded.

Each case kills the writing process (`tests/helpers/crash_writer.py`, through the store's test-only kill
switch) while it saves step 3, then checks the promise: the checkpoint committed before is
intact, the new one is either committed whole or ignored, and resuming from `latest` ends with
the same weights, bit for bit, as the run that was never killed. Nothing the crash left behind
(staging folders, half-deleted checkpoints) outlives the resumed run's retention.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import crash_writer
import pytest

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, phases

KILL_STEP = 3
# From these phases on, the save at KILL_STEP is committed (the manifest is its commit on an
# object store; locally the rename is).
COMMITTED_FROM = {"local": "published", "s3": "manifest_written"}


def _cases():
    for where in ("local", "s3"):
        for mode, names in (("unsharded", phases.UNSHARDED), ("sharded", phases.SHARDED)):
            for phase in names:
                if where == "s3" and phase == "published":
                    continue  # an object store has no rename
                yield pytest.param(where, mode, phase, id=f"{where}-{mode}-{phase}")


@pytest.fixture(scope="module")
def writers():
    """A process that forks each killed writer (crash_writer.serve); returns a function that runs
    one and gives the signal that ended it."""
    server = subprocess.Popen([sys.executable, os.path.abspath(crash_writer.__file__), "--serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})

    def run(uri: str, sharded: bool, kill_at: str) -> int | None:
        server.stdin.write(json.dumps({"uri": uri, "sharded": sharded, "kill_at": kill_at,
                                       "env": dict(os.environ)}) + "\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline())["signal"]

    yield run
    server.stdin.close()
    try:
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The never-killed runs' final weights, per mode."""
    return {mode: crash_writer.train(str(tmp_path_factory.mktemp(f"clean-{mode}") / "run"), mode == "sharded")[1]
            for mode in ("unsharded", "sharded")}


@pytest.mark.parametrize(("where", "mode", "phase"), list(_cases()))
def test_a_kill_at_any_phase_of_a_save_loses_nothing_committed(where, mode, phase, tmp_path, request, writers, clean):
    if where == "s3":
        uri = request.getfixturevalue("s3_server").format(prefix=f"crash-{uuid.uuid4().hex[:8]}/run")
    else:
        uri = str(tmp_path / "run")
    sharded = mode == "sharded"

    # Retention's phase is numbered by the step it deletes: the one before, with keep_last 1.
    at = KILL_STEP - 1 if phase == "retention" else KILL_STEP
    assert writers(uri, sharded, f"{phase}@{at}") == signal.SIGKILL, f"the writer was not killed at {phase}"

    order = phases.SHARDED if sharded else phases.UNSHARDED
    committed = order.index(phase) >= order.index(COMMITTED_FROM[where])
    store = CheckpointStore(storage.resolve(uri))
    latest = store.latest_verified()
    assert latest.info is not None and latest.info.step == (KILL_STEP if committed else KILL_STEP - 1), (
        f"after a kill at {phase}: latest is {latest.info and latest.info.step}, skipped {latest.skipped}")

    resumed_from, weights = crash_writer.train(uri, sharded)
    assert resumed_from == latest.info.step
    assert weights == clean[mode]
    left = [(i.name, i.status) for i in store.scan()]
    assert left == [(f"step-{crash_writer.STEPS:09d}", "committed")], f"left behind after the resumed run: {left}"
