"""`orchestrator torchrun` without --name: the run's name tells two scripts apart and stays the
same for the same one, so `--work_dir {run_dir}/work --resume_from=latest` resumes the script's own
run and never another project's. The command prints the name it chose; --name is kept as given."""

from __future__ import annotations

import os
import re
import sys
import types

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.torchrun import spec_from_args
from orchestrator.spec.model import NAME_PATTERN

NAME = re.compile(r"^train-[0-9a-f]{8}$")


def _project(root, name: str):
    folder = root / name
    folder.mkdir()
    (folder / "train.py").write_text("print('training')\n")
    return folder


def _name(*argv: str) -> str:
    return spec_from_args(build_parser().parse_args(["torchrun", *argv]))["name"]


def _default(*args, **kwargs):
    """spec.script.default_run_name (imported here: the tests of the command run without it)."""
    from orchestrator.spec.script import default_run_name

    return default_run_name(*args, **kwargs)


def test_two_projects_train_py_in_one_storage_get_runs_of_their_own(tmp_path, monkeypatch):
    a, b = _project(tmp_path, "a"), _project(tmp_path, "b")
    monkeypatch.chdir(a)
    name_a = _name("--nproc_per_node", "2", "train.py", "--work_dir", "{run_dir}/work", "--resume_from=latest")
    monkeypatch.chdir(b)
    name_b = _name("--nproc_per_node", "2", "train.py", "--work_dir", "{run_dir}/work", "--resume_from=latest")
    assert NAME.match(name_a) and NAME.match(name_b), (name_a, name_b)
    assert name_a != name_b


def test_the_same_script_keeps_its_name_however_it_is_spelled_and_from_wherever_it_is_started(tmp_path, monkeypatch):
    project = _project(tmp_path, "project")
    os.symlink(project, tmp_path / "link")
    (project / "sub").mkdir()
    monkeypatch.chdir(project)
    names = {_name("train.py"), _name("./train.py"), _name(str(project / "train.py")),
             _name(str(tmp_path / "link" / "train.py"))}  # a symlinked checkout is the same script
    monkeypatch.chdir(project / "sub")
    names.add(_name("../train.py"))
    assert len(names) == 1 and NAME.match(names.pop())
    assert _default(str(project / "train.py")) == _default("train.py", cwd=str(project))


def test_a_module_is_named_by_its_name_and_the_directory_it_is_found_from(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first = _default(module="pkg.train", cwd=str(one))
    assert re.fullmatch(r"train-[0-9a-f]{8}", first.name) and first.source == f"module pkg.train from {os.path.realpath(one)}"
    assert _default(module="pkg.train", cwd=str(one)) == first
    assert _default(module="pkg.train", cwd=str(two)).name != first.name
    assert _default(module="other.train", cwd=str(one)).name != first.name


def test_a_scripts_place_in_a_ray_jobs_working_dir_names_it_across_submissions(tmp_path):
    """Ray unpacks each upload of a working_dir into a new folder named after its contents: the
    name follows the path inside it, so a re-submission of changed code resumes the same run."""
    def unpacked(package: str) -> str:
        return str(tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / package)

    first = _default("train.py", cwd=unpacked("_ray_pkg_0123abcd"))
    again = _default("train.py", cwd=unpacked("_ray_pkg_4567ef01"))
    assert first == again and first.in_ray_job and first.source == "<the Ray job's working_dir>/train.py"
    assert _default("scripts/train.py", cwd=unpacked("_ray_pkg_0123abcd")).name != first.name
    assert not _default("train.py", cwd=str(tmp_path)).in_ray_job


def test_a_long_or_odd_script_name_still_makes_a_valid_run_name(tmp_path):
    for stem in ("x" * 300, "my train (v2)", "-dash", "..."):
        name = _default(f"{stem}.py", cwd=str(tmp_path)).name
        assert NAME_PATTERN.match(name) and re.search(r"-[0-9a-f]{8}$", name), name


class _Launched(Exception):
    """Raised by the stand-in for the driver: the command got as far as starting the run."""


@pytest.fixture
def launched(monkeypatch):
    """The specs `orchestrator torchrun` would start, without Ray: the driver's module is a stand-in."""
    specs = []

    def run(spec, **_):
        specs.append(spec)
        raise _Launched

    monkeypatch.setitem(sys.modules, "orchestrator.driver.launch", types.SimpleNamespace(run=run))
    return specs


def _start(*argv: str) -> None:
    args = build_parser().parse_args(["torchrun", *argv])
    with pytest.raises(_Launched):
        args.handle(args)


def test_the_command_prints_the_name_it_chose_and_keeps_a_given_one(tmp_path, monkeypatch, capsys, launched):
    project = _project(tmp_path, "project")
    monkeypatch.chdir(project)
    _start("--storage", str(tmp_path / "runs"), "train.py", "--work_dir", "{run_dir}/work")
    chosen = launched[-1].name
    assert NAME.match(chosen)
    printed = [line for line in capsys.readouterr().out.splitlines() if chosen in line]
    assert len(printed) == 1 and str(project / "train.py") in printed[0] and "--name" in printed[0], printed

    _start("--storage", str(tmp_path / "runs"), "--name", "mine", "train.py")
    assert launched[-1].name == "mine"
    assert "run name" not in capsys.readouterr().out
