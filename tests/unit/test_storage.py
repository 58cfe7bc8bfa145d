"""Which storage strings the driver of a `ray job submit` job accepts (storage.resolve_root).

The refusal itself is proven through a real `ray job submit` in tests/e2e/test_ray_jobs.py; here,
that it refuses only what would move: relative local paths, and only in a Ray job. The job's
marker (the job config Ray's supervisor sets for the driver alone) is set per case.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.errors import UserError
from orchestrator.storage import resolve_root


@pytest.mark.parametrize("uri", ["runs", "./runs", "file:runs"])
def test_a_relative_storage_is_refused_only_in_a_ray_job(monkeypatch, tmp_path, uri):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert resolve_root(uri).path == str(tmp_path / "runs")  # by hand: the directory it runs in
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    with pytest.raises(UserError) as refused:
        resolve_root(uri)
    message = str(refused.value)
    assert message.startswith(f"storage '{uri}' is a relative path, and this driver runs as a Ray job")
    assert f"it would resolve to {tmp_path / 'runs'}, inside the driver's working directory {tmp_path}" in message
    assert "Fix:" in message


@pytest.mark.parametrize("uri", ["~/orchestrator-runs", "/mnt/shared/runs", "file:///mnt/shared/runs"])
def test_absolute_home_and_uri_storage_are_accepted_in_a_ray_job(monkeypatch, uri):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert resolve_root(uri).path == os.path.expanduser(uri.removeprefix("file://"))
