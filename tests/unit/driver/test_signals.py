"""How long a driver run by `ray job submit` gives its workers after `ray job stop`.

Ray 2.60's job supervisor sends SIGTERM, waits int(RAY_JOB_STOP_WAIT_TIME_S) seconds (3 by
default), then SIGKILLs the driver. Measured here (2 workers, 2 CPUs), the driver needs 0.1-0.3 s
from rank 0's report that the stop checkpoint is committed to summary.json written, so all but
half a second of Ray's wait goes to the workers (it was 1 s of 3). Each case sets the variables a
Ray job's driver has (the job config Ray's supervisor puts in its environment, the wait) for
itself, with monkeypatch, and clears the ones that would change the answer.
"""

from __future__ import annotations

import pytest

from orchestrator.driver.signals import grace_seconds, job_stop_note


@pytest.fixture
def ray_job_driver(monkeypatch):
    """This process as the driver of a `ray job submit` job on a head started with Ray's defaults."""
    for variable in ("ORCHESTRATOR_STOP_GRACE_S", "RAY_JOB_STOP_WAIT_TIME_S"):
        monkeypatch.delenv(variable, raising=False)
    # Ray's job supervisor sets this for the driver of every submitted job (and for no one else).
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {}, "metadata": {}}')
    return monkeypatch


def test_ray_job_stop_leaves_the_workers_all_of_rays_wait_but_half_a_second(ray_job_driver):
    assert grace_seconds("SIGTERM") == pytest.approx(2.5)  # of Ray's default 3 s
    ray_job_driver.setenv("RAY_JOB_STOP_WAIT_TIME_S", "20")  # a job's runtime_env env_vars, or the head's
    assert grace_seconds("SIGTERM") == pytest.approx(19.5)
    assert grace_seconds("SIGINT") == 30  # Ctrl-C on a driver run by hand in a job is not Ray's stop
    # Ray reads the wait with int(): "2.5" makes its stop fail and its watcher SIGKILL the driver.
    ray_job_driver.setenv("RAY_JOB_STOP_WAIT_TIME_S", "2.5")
    assert grace_seconds("SIGTERM") == 0


def test_a_ray_job_with_a_short_stop_wait_is_told_once_how_to_give_the_checkpoint_more(ray_job_driver):
    note = job_stop_note()
    assert note is not None and note.startswith("note: `ray job stop` kills this driver 3 s after its SIGTERM")
    assert "Ray's default" in note and "the workers get 2.5 s" in note
    assert """--runtime-env-json '{"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "60"}}'""" in note

    ray_job_driver.setenv("RAY_JOB_STOP_WAIT_TIME_S", "60")
    assert job_stop_note() is None  # long enough: nothing to say

    ray_job_driver.setenv("RAY_JOB_STOP_WAIT_TIME_S", "2.5")
    warning = job_stop_note()
    assert warning.startswith("warning: RAY_JOB_STOP_WAIT_TIME_S='2.5' is not a whole number of seconds")
    assert "killed at once" in warning and "Fix:" in warning

    ray_job_driver.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")  # not a Ray job: `ray job stop` cannot reach it
    ray_job_driver.delenv("RAY_JOB_STOP_WAIT_TIME_S")
    assert job_stop_note() is None
