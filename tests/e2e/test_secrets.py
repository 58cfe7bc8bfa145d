"""A spec's `env` values are secrets as far as the orchestrator knows (WANDB_API_KEY, HF_TOKEN):
no checkpoint manifest stores one, and no resume prints one. A manifest keeps a digest of each
value, so that a resume still says which variable changed; older manifests, which hold the values
in clear, are read and compared the same way without showing them. On Ray the values reach the
agents in their run's config, not in Ray's runtime environment: no dashboard answer and no Ray log
holds one."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid

import pytest
import torch
from cli_runs import run_spec
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import AsyncCheckpointWriter, CheckpointStore, Manifest, dumps_state
from orchestrator.checkpoint.manifest import MANIFEST_NAME
from orchestrator.driver import resume
from orchestrator.rank.rank_main import CONFIG_VAR
from orchestrator.spec import validate

SECRET = "s3cr3t-value"
OTHER_SECRET = "an0ther-s3cr3t"


def _spec(**env: str):
    return validate({"name": "run", "seed": 0, "env": {"NCCL_DEBUG": "WARN", **env},
                     "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 50}})


def _manifest(spec) -> Manifest:
    """The manifest the rank session builds for a save (rank/session.py, Session.commit)."""
    return Manifest(step=10, epoch=0, batch_in_epoch=10, world_size=1, kind=spec.kind, files={},
                    strategy=spec.strategy, spec=spec.to_record())


def _all_bytes(root) -> bytes:
    found = b""
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                found += f.read()
    return found


def _old_format_checkpoint(tmp_path, env: dict[str, str]) -> Manifest:
    """A checkpoint whose manifest holds `env` in clear, as every manifest written before digests did."""
    store = CheckpointStore(storage.resolve(str(tmp_path / "run")))
    info = store.commit(_manifest(_spec()), {"state.pt": dumps_state({"w": torch.zeros(2)})})
    path = os.path.join(info.location.path, MANIFEST_NAME)
    raw = json.loads(open(path, "rb").read())
    raw["spec"]["env"] = env
    with open(path, "w") as f:
        json.dump(raw, f)
    (newest,) = store.committed()
    return newest.manifest


def test_a_checkpoint_written_for_a_spec_with_a_secret_holds_its_name_and_never_its_value(tmp_path):
    spec = _spec(WANDB_API_KEY=SECRET)
    store = CheckpointStore(storage.resolve(str(tmp_path / "run")))
    writer = AsyncCheckpointWriter(store, asynchronous=True)
    writer.save(_manifest(spec), lambda: {"state.pt": dumps_state({"w": torch.zeros(3)})})
    writer.close()

    (info,) = store.committed()
    assert SECRET.encode() not in _all_bytes(tmp_path)
    assert b"WANDB_API_KEY" in open(os.path.join(info.location.path, MANIFEST_NAME), "rb").read()
    assert SECRET not in repr(info.manifest)  # nor the manifest a commit hands to callbacks and events
    # The digest still tells a resume with the same spec that nothing changed.
    assert resume.spec_changes(spec, info.manifest) is None


@pytest.mark.parametrize("old_env,new_env,said", [
    ({"WANDB_API_KEY": SECRET}, {"WANDB_API_KEY": OTHER_SECRET}, "env.WANDB_API_KEY changed"),
    ({}, {"WANDB_API_KEY": OTHER_SECRET}, "env.WANDB_API_KEY added"),
    ({"WANDB_API_KEY": SECRET}, {}, "env.WANDB_API_KEY removed"),
], ids=["changed", "added", "removed"])
def test_a_resume_with_another_env_value_names_the_variable_and_shows_no_value(old_env, new_env, said):
    manifest = _manifest(_spec(**old_env))
    line = resume.spec_changes(_spec(**new_env), manifest)

    assert said in line, line
    assert SECRET not in line and OTHER_SECRET not in line and "sha256:" not in line, line
    assert "NCCL_DEBUG" not in line  # unchanged


def test_an_older_manifest_with_a_clear_value_compares_by_value_and_never_shows_it(tmp_path):
    manifest = _old_format_checkpoint(tmp_path, {"NCCL_DEBUG": "WARN", "WANDB_API_KEY": SECRET})
    assert SECRET.encode() in _all_bytes(tmp_path)  # (the older format, on storage)
    assert SECRET not in repr(manifest)  # read back, it holds digests like a new one

    assert resume.spec_changes(_spec(WANDB_API_KEY=SECRET), manifest) is None
    line = resume.spec_changes(_spec(WANDB_API_KEY=OTHER_SECRET), manifest)
    assert "env.WANDB_API_KEY changed" in line, line
    assert SECRET not in line and OTHER_SECRET not in line, line


@pytest.mark.slow
@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
def test_a_run_with_a_secret_in_env_leaves_it_nowhere_in_its_run_directory_output_dashboard_or_ray_logs(
        tmp_path, _warm_record, run_temp_dir):
    """One real run of the ctx job on the warm cluster (a joined one, with Ray's dashboard): its
    rank has the secret, its agent the spec's TMPDIR (the rank's config file is in the agent's
    scratch there), and neither the dashboard's Jobs, Train and Actors APIs nor any file of the
    cluster's session logs holds the secret. A tunable (a TORCH_ variable) still goes through
    the job's runtime environment: it is found there, so the search finds what is there. Then
    the same spec with another value, which is already finished: the driver prints the spec diff
    and starts no workers."""
    secret, other_secret = f"planted-{uuid.uuid4().hex}", f"planted-{uuid.uuid4().hex}"
    tunable = f"tunable-{uuid.uuid4().hex}"
    seen = tmp_path / "seen"
    seen.mkdir()
    spec = torch_spec("secrets", tmp_path / "runs", loop="env_jobs:train_loop", every=5,
                      env_seen={"dir": str(seen), "variables": ["WANDB_API_KEY", CONFIG_VAR]})
    spec["torch"].update(max_steps=5, max_epochs=None)
    spec["scaling"]["num_workers"] = 1
    lines: list[str] = []
    env = {"WANDB_API_KEY": secret, "TMPDIR": run_temp_dir, "TORCH_ORCHESTRATOR_TEST_MARK": tunable}
    run_spec({**spec, "env": env}, str(tmp_path), lines=lines)
    assert lines[0].startswith("on Ray"), lines[:3]
    rank = json.loads((seen / "rank-0.json").read_text())
    assert rank["WANDB_API_KEY"] == secret
    assert rank[CONFIG_VAR].startswith(run_temp_dir + os.sep), rank

    record = json.loads(open(_warm_record).read())
    shown = _dashboard_answers(record)
    assert '"job_name": "secrets"' in shown and '"secrets-' in shown  # the run's job and its Train run
    assert tunable in shown and secret not in shown
    logs = os.path.join(record["session_dir"], "logs")
    assert _holding(logs, tunable)
    assert _holding(logs, secret) == []

    run_spec({**spec, "env": {**env, "WANDB_API_KEY": other_secret}}, str(tmp_path), lines=lines)
    assert any("already finished at step 5" in line for line in lines), lines
    assert any("env.WANDB_API_KEY changed" in line for line in lines), lines
    output = "\n".join(lines)
    assert secret not in output and other_secret not in output
    found = _all_bytes(tmp_path / "runs")
    assert secret.encode() not in found and other_secret.encode() not in found


def _dashboard_answers(record: dict) -> str:
    """What the warm cluster's dashboard answers about its jobs, Train runs and actors, as JSON text."""
    answers = []
    for path in ("/api/jobs/", "/api/train/v2/runs/v1", "/api/v0/actors?detail=1&limit=10000"):
        request = urllib.request.Request(record["dashboard"] + path,
                                         headers={"Authorization": f"Bearer {record['token']}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            answers.append(json.dumps(json.load(answer)))
    return "\n".join(answers)


def _holding(root, value: str) -> list[str]:
    """The files under `root` (Ray's logs, their subfolders too) that hold `value`."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    if value.encode() in f.read():
                        found.append(path)
            except OSError:  # a socket, or a file gone since it was listed
                continue
    return found
