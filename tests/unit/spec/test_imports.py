"""Validation reads every key, type and value of a spec before it imports anything: a typo is
refused at once, and the user's module, torch and Lightning are never imported for a spec that
is refused anyway (importing them costs seconds of CPU; a user's module may do anything)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest
from conftest import REPO

# The user's code: importing it leaves a marker beside it, as a module with side effects would.
JOB = """\
import pathlib

pathlib.Path(__file__).with_name("imported.marker").write_text("imported")


def train_loop(ctx):
    pass


class Model:
    pass


class Data:
    pass
"""
# The same, for the Lightning path: a LightningModule and a LightningDataModule.
LIGHTNING_JOB = """\
import pathlib

import lightning.pytorch as pl

pathlib.Path(__file__).with_name("imported.marker").write_text("imported")


class Model(pl.LightningModule):
    pass


class Data(pl.LightningDataModule):
    pass
"""
TORCH = "torch: {train_loop: 'marker_job:train_loop', max_steps: 5}\n"
LIGHTNING = ("lightning:\n  model: {class_path: marker_lightning.Model}\n  data: {class_path: marker_lightning.Data}\n"
             "  trainer: {max_epochs: 1}\n")


def _project(tmp_path):
    (tmp_path / "marker_job.py").write_text(JOB)
    (tmp_path / "marker_lightning.py").write_text(LIGHTNING_JOB)
    package = tmp_path / "marker_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(JOB)
    (package / "train.py").write_text("print('training')\n")
    return tmp_path / "imported.marker", package / "imported.marker"


@pytest.mark.parametrize("section", [TORCH, LIGHTNING], ids=["torch train_loop", "lightning class_path"])
def test_a_typo_in_scaling_is_refused_before_the_users_module_is_imported(tmp_path, section):
    marker, _ = _project(tmp_path)
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"name: x\n{section}scaling: {{num_workerz: 2}}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(spec)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    took, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)

    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: field 'scaling.num_workerz'"), done.stderr
    assert "did you mean 'num_workers'" in lines[0] and "Traceback" not in done.stderr
    assert not marker.exists(), "the user's module was imported for a spec refused anyway"
    # The command's own CPU time (tests beside it stretch its wall time, not this): the goal is
    # under 1 s, with slack for a slow machine; importing torch alone takes more.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 1.5, f"{cpu:.2f} s of CPU"
    assert took < 15.0, f"{took:.2f} s"


CHECK = """\
import json, sys
from orchestrator.errors import SpecError
from orchestrator.spec import validate

HEAVY = ("torch", "lightning", "pytorch_lightning", "ray", "deepspeed", "marker_job", "marker_lightning", "marker_pkg")
report = {"refused": [], "loaded": []}
for raw in json.loads(sys.argv[1]):
    try:
        validate(raw)
        report["refused"].append(None)
    except SpecError as exc:
        report["refused"].append(str(exc))
report["loaded"] = sorted(m for m in HEAVY if m in sys.modules)
validate(json.loads(sys.argv[2]))  # a sound spec: its module is imported, as it must be
report["after_sound"] = sorted(m for m in HEAVY if m in sys.modules)
print(json.dumps(report))
"""


def test_every_section_is_read_before_torch_lightning_or_the_users_code_is_imported(tmp_path):
    marker, package_marker = _project(tmp_path)
    torch_loop = {"train_loop": "marker_job:train_loop", "max_steps": 5}
    classes = {"model": {"class_path": "marker_lightning.Model"}, "data": {"class_path": "marker_lightning.Data"},
               "trainer": {"max_epochs": 1}}
    cases = [  # (spec, the field its error must name)
        ({"name": "x", "torch": torch_loop, "scaling": {"num_workerz": 2}}, "scaling.num_workerz"),
        ({"name": "x", "lightning": classes, "checkpoint": {"every_n_step": 5}}, "checkpoint.every_n_step"),
        ({"name": "x", "lightning": {**classes, "callbacks": [{"class_path": "marker_job.Model"}]},
          "failure": {"hang_timeout_s": "1m"}}, "failure.hang_timeout_s"),
        ({"name": "x", "lightning": {**classes, "trainer": {"max_epochs": 1, "strategy": "deepspeed_stage_2"}},
          "scaling": {"placment": "spread"}}, "scaling.placment"),
        ({"name": "x", "lightning": {"config": os.path.join(REPO, "tests", "helpers", "configs", "lightning_cli_fit.yaml")},
          "env": {"NCCL_DEBUG": {"level": 1}}}, "env.NCCL_DEBUG"),
        ({"name": "x", "torch": torch_loop, "env": {"A": "1"},
          "data": {"train": {"path": "x.parquet", "columns": {"a": {"dtype": "float32"}}, "batch_sise": 4}}},
         "data.train.batch_sise"),
        ({"name": "x", "torch": torch_loop, "seed": -1}, "seed"),
        ({"name": "x", "script": {"module": "marker_pkg.train"}, "scaling": {"use_gpu": "yes"}}, "scaling.use_gpu"),
    ]
    sound = {"name": "x", "torch": torch_loop}
    done = subprocess.run([sys.executable, "-c", CHECK, json.dumps([raw for raw, _ in cases]), json.dumps(sound)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(tmp_path)])})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    for (_, field), message in zip(cases, report["refused"], strict=True):
        assert message is not None and f"'{field}" in message, (field, message)
    assert report["loaded"] == [], f"imported before the refusal: {report['loaded']}"
    assert not package_marker.exists()
    # The check sees an import when there is one: the sound spec's module was imported.
    assert report["after_sound"] == ["marker_job"] and marker.exists()
