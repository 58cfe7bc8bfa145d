"""A torchrun script's arguments as its ranks get them (agent/rank_start.py): `{storage}`,
`{run_dir}` and `{name}` filled in with the places the run really uses, so that a script writes
where the run's own files are."""

from __future__ import annotations

import pyarrow.fs as pafs

from orchestrator.agent.rank_start import RankStart
from orchestrator.run_dir import RunDir
from orchestrator.spec import DEFAULT_STORAGE, validate
from orchestrator.storage import Location
from orchestrator.worker_config import ScriptContext

ARGS = ["--out", "{storage}/out", "--work_dir={run_dir}/work", "{name}"]


def _arguments(storage: str | None, run_dir: RunDir | None = None, cwd: str = "/") -> list[str]:
    raw = {"name": "args", "script": {"path": "train.py", "args": ARGS}}
    job = validate({**raw, "storage": storage} if storage else raw, check_imports=False)
    start = RankStart(job, ScriptContext(cwd), run_dir or RunDir.of(job.storage, job.name))
    return start.command()[1:]  # after the script's path


def test_the_default_storage_in_a_scripts_arguments_is_under_home_not_a_folder_named_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert DEFAULT_STORAGE.startswith("~/")
    runs = f"{tmp_path}/home/{DEFAULT_STORAGE[2:]}"
    assert _arguments(None) == ["--out", f"{runs}/out", f"--work_dir={runs}/args/work", "args"]


def test_a_relative_storage_in_a_scripts_arguments_is_the_drivers_as_its_run_directory_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _arguments("runs")[:2] == ["--out", f"{tmp_path}/runs/out"]


def test_an_object_stores_storage_in_a_scripts_arguments_is_its_uri_as_written():
    uri = "s3://bucket/runs"
    run_dir = RunDir(Location(pafs._MockFileSystem(), "bucket/runs/args", "s3://bucket/runs/args"))
    assert _arguments(uri, run_dir)[:2] == ["--out", f"{uri}/out"]
