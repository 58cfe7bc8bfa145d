"""`orchestrator.run()` called from a Python process as a user's script calls it (docs/python-api.md):
a caller with SIGINT and SIGTERM handlers of its own (tests/helpers/python_api_caller.py), in a
process of its own. In local mode one caller proves what run() raises (SpecError, RunStopped,
TrainingFailed), the `__` overrides, that its handlers are back after each run, and that a
checkpoint the loop handed to the writer before it raised is committed; on Ray, that a caller who
imported Ray first is told so in one paragraph instead of waiting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

CALLER = os.path.join(REPO, "tests", "helpers", "python_api_caller.py")


def _caller(folder, *args: str, timeout: float, env: dict | None = None) -> dict:
    helpers = os.path.join(REPO, "tests", "helpers")
    done = subprocess.run([sys.executable, CALLER, str(folder), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env={**(env or os.environ), "PYTHONPATH": os.pathsep.join(
                              filter(None, [helpers, os.environ.get("PYTHONPATH", REPO)]))})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _store(folder, name: str) -> CheckpointStore:
    return CheckpointStore(storage.resolve(str(folder / "runs" / name)))


@pytest.mark.timeout(400)
def test_run_from_python_raises_spec_error_run_stopped_and_training_failed_and_gives_the_caller_its_handlers_back(
        tmp_path):
    seen = _caller(tmp_path, timeout=360)

    assert seen["bad_spec"]["raised"] == "SpecError", seen["bad_spec"]

    # SIGINT while it trains (the caller's Ctrl-C): a stop checkpoint, then RunStopped saying which.
    assert (seen["stopped"].get("raised"), seen["stopped"]["signal_name"]) == ("RunStopped", "SIGINT"), seen["stopped"]
    stop = _store(tmp_path, "stopped").committed()
    assert stop and stop[-1].manifest.reason == "stop", [(i.step, i.manifest.reason) for i in stop]
    # The run's handlers were the ones that heard it: the caller's own heard only its own test signals.
    assert seen["heard"] == ["SIGINT", "SIGTERM"] * 2, seen["heard"]
    assert seen["mine_after_stop"] and seen["mine_after_failure"], seen

    # `__` overrides: one field set beside the spec's others; a dict replaces its part whole.
    config = seen["config"]
    assert config["config_out"] == str(tmp_path / "config.json") and config["kept"] == "yes", config
    assert config["part"] == {"x": 2}, config

    # The loop raised right after handing its save to the writer: TrainingFailed, naming the error,
    # and that checkpoint committed whole all the same.
    assert seen["failed"].get("raised") == "TrainingFailed", seen["failed"]
    assert "the loop raised right after its save" in seen["failed"]["message"], seen["failed"]
    store = _store(tmp_path, "raised")
    committed = store.committed()
    assert [i.step for i in committed] == [1], [(i.step, i.status) for i in committed]
    assert store.verify(committed[0]).status == "committed", committed[0].problem


@pytest.mark.timeout(200)
def test_run_from_python_on_ray_after_the_caller_imported_ray_is_one_paragraph_not_a_wait(tmp_path, warm_cluster):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    seen = _caller(tmp_path, "--ray", timeout=150, env=env)["run"]
    assert seen.get("raised") == "UserError", seen
    message = seen["message"]
    assert "imported Ray before" in message and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in message, message
    assert "\n" not in message.strip() and "Traceback" not in message, message
    assert seen["seconds"] < 60, seen
