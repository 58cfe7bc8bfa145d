"""The CLI: exit codes, one-paragraph errors with no traceback, readable output, no leftovers."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import REPO, run_cli, wait_for
from specs import STEPS_PER_EPOCH, lightning_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.processes import session_pids


def _assert_user_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in result.stderr


def test_a_bad_spec_exits_2_with_the_reason_and_no_traceback(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: t\ntorch: {train_loop: 'jobs.digits_torch:train_loop', max_epochs: 1}\nscaling: {num_workers: -2}\n")
    _assert_user_error(run_cli("run", str(spec)), "scaling.num_workers", "-2", "at least 1")


def test_a_missing_spec_file_exits_2(tmp_path):
    _assert_user_error(run_cli("run", str(tmp_path / "nope.yaml")), "does not exist")


def test_a_bad_set_override_exits_2():
    _assert_user_error(run_cli("run", "jobs/quickstart.yaml", "--set", "scaling.num_wokers=4"),
                       "scaling.num_wokers", "did you mean 'num_workers'")


def test_a_run_needs_a_spec_or_a_lightning_config_and_a_bad_config_is_named():
    _assert_user_error(run_cli("run"), "needs a job spec, a LightningCLI config, or both")
    _assert_user_error(run_cli("run", "--lightning-config", "jobs/quickstart.yaml"),
                       "'name' is not a section of a LightningCLI fit config")


def test_an_unknown_flag_exits_2():
    _assert_user_error(run_cli("run", "jobs/quickstart.yaml", "--wrokers", "3"), "unrecognized arguments")


def test_python_dash_m_and_help_work():
    result = run_cli("run", "--help")
    assert result.returncode == 0 and "--resume-from" in result.stdout


def _session_of_driver(state_dir, timeout: float) -> str:
    """The Ray session directory an embedded driver recorded in its state file."""
    def read():
        for record in state_dir.glob("driver-*.json"):
            return json.loads(record.read_text())["session_dir"]
        return None

    return wait_for(read, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cli_run_prints_progress_and_a_summary_and_leaves_no_ray_process(tmp_path):
    state_dir = tmp_path / "state"
    # --ray: this is the embedded cluster's test (a run of one node goes in local mode by default).
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "jobs/digits_torch.yaml", "--ray", "--storage", str(tmp_path),
         "--set", "torch.max_epochs=2", "--set", "checkpoint.every_n_seconds=1"],
        cwd=REPO, env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        session_dir = _session_of_driver(state_dir, timeout=120)
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err[-3000:]
    assert "2 workers up, starting fresh" in out
    assert "epoch 2/2 done" in out and "samples/s" in out
    assert "run 'digits-torch' finished" in out and "weights_sha256" in out
    assert "(seconds)" in out, "checkpoint.every_n_seconds saves, decided by rank 0 for every rank"
    assert "Traceback" not in out + err
    # Worker chatter stays in the run's logs, not in the terminal.
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) < 30, out
    assert os.path.exists(tmp_path / "digits-torch" / "logs" / "rank-0.log")
    assert not list(state_dir.glob("driver-*.json")), "a clean exit removes its record"
    wait_for(lambda: not session_pids(session_dir), timeout=30)


# Late enough that a checkpoint (every 10 steps) is committed before the driver dies, and early
# enough that the workers, which outlive a killed driver by a second or two, do not finish the run.
# Random each run; set ORCHESTRATOR_TEST_DRIVER_KILL_STEP to replay one.
DRIVER_KILL_STEP = int(os.environ.get("ORCHESTRATOR_TEST_DRIVER_KILL_STEP", random.Random().randint(12, 40)))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_lightning_drivers_run_on_ray_refuses_a_second_driver_while_live_says_driver_died_and_the_same_command_takes_it_over_to_the_clean_weights(
        tmp_path, clean_lightning):
    # The session's clean Lightning run (tests/helpers/specs.py), slowed down so that the driver can
    # be killed mid-run (README: exact resume after a killed driver; docs/checkpoints.md, "One
    # writer per run" and "Listing runs"). The same command then takes the run over at once and
    # must end with the clean run's weights, bit for bit.
    import yaml

    state_dir = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "tests", "helpers"), "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    marker = tmp_path / "marker"
    job = tmp_path / "job.yaml"
    # Rank 0 holds for 30 s at the marked step (under failure.hang_timeout_s, 60 s), once: the driver
    # is killed there however long the refusal below takes on a loaded machine.
    job.write_text(yaml.safe_dump(lightning_spec("driver-killed", tmp_path, "faulty.SlowClassifier", sleep_s=0.2,
                                                 marker=str(marker), mark_at=DRIVER_KILL_STEP, hold_s=30)))
    # --ray: the embedded cluster a killed driver leaves is what the next one must clean up.
    command = [sys.executable, "-m", "orchestrator", "run", str(job), "--ray"]
    driver = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        session_dir = _session_of_driver(state_dir, timeout=120)
        first = next(line for line in driver.stdout if not line.startswith("run name: "))
        for line in driver.stdout:
            if "checkpoint committed" in line:
                break
        # A second driver on the live run is refused before it starts anything, naming the first.
        second = run_cli("run", str(job), env=env, timeout=120)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert f"pid {driver.pid}" in second.stderr and "held by a live driver" in second.stderr
        assert "Traceback" not in second.stdout + second.stderr
        # SIGKILLed at a random step, mid-epoch, with a checkpoint write possibly in flight.
        wait_for(lambda: marker.exists() or driver.poll() is not None, timeout=240, interval=0.05)
        assert driver.poll() is None, "the run ended before the driver could be killed"
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert first.startswith("on Ray"), first
    time.sleep(2)
    orphans = session_pids(session_dir)
    assert orphans, "expected Ray's agents to outlive a SIGKILLed driver"

    status = run_cli("status", "driver-killed", "--storage", str(tmp_path), env=env, timeout=120)
    assert status.returncode == 0 and "driver died" in status.stdout, status.stdout + status.stderr

    # The same command: taken over at once (its holder's pid is gone on this host, so no watch of
    # its heartbeat), the killed driver's cluster ended, the run resumed to the clean weights.
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    again = next(line for line in result.stdout.splitlines() if not line.startswith("run name: "))
    assert again.startswith("on Ray"), result.stdout[:2000]
    assert "resuming from step" in result.stdout, f"driver killed at step {DRIVER_KILL_STEP}"
    assert "watching its heartbeat" not in result.stdout + result.stderr, result.stdout[-3000:]
    summary = json.loads((tmp_path / "driver-killed" / "summary.json").read_text())
    assert 10 <= summary["resumed_from"]["step"] < 3 * STEPS_PER_EPOCH
    assert summary["global_step"] == clean_lightning.global_step
    assert summary["weights_sha256"] == clean_lightning.weights_sha256, f"driver killed at step {DRIVER_KILL_STEP}"
    wait_for(lambda: not session_pids(session_dir), timeout=30)


def _spec_with_a_checkpoint(tmp_path, step=5):
    """A torch spec whose run directory already holds one committed checkpoint (no Ray needed)."""
    from orchestrator import storage
    from orchestrator.checkpoint import CheckpointStore, Manifest, dumps_state

    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: prior\nstorage: {tmp_path}\ntorch: {{train_loop: 'jobs.digits_torch:train_loop', max_epochs: 1}}\n")
    store = CheckpointStore(storage.resolve(str(tmp_path / "prior")))
    info = store.commit(Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=2, kind="torch", files={}),
                        {"state.pt": dumps_state({"x": 1})})
    return spec, info


def test_resume_from_none_refuses_to_mix_with_existing_checkpoints(tmp_path):
    spec, _ = _spec_with_a_checkpoint(tmp_path)
    _assert_user_error(run_cli("run", str(spec), "--resume-from", "none"),
                       "already has 1 checkpoint", "--overwrite", "new name")


def test_resume_from_a_corrupt_checkpoint_uri_is_a_clear_error(tmp_path):
    spec, info = _spec_with_a_checkpoint(tmp_path)
    with open(os.path.join(info.location.path, "state.pt"), "ab") as f:
        f.write(b"garbage")
    _assert_user_error(run_cli("run", str(spec), "--resume-from", info.uri), info.uri, "corrupt",
                       "bytes, manifest says", "Fix")


def test_resume_from_a_checkpoint_of_another_kind_of_job_is_refused(tmp_path):
    spec, _ = _spec_with_a_checkpoint(tmp_path)
    text = spec.read_text().replace("torch: {train_loop: 'jobs.digits_torch:train_loop', max_epochs: 1}",
                                    "lightning: {model: {class_path: jobs.digits.DigitsClassifier}, "
                                    "data: {class_path: jobs.digits.DigitsData}, trainer: {max_epochs: 1}}")
    spec.write_text(text)
    _assert_user_error(run_cli("run", str(spec)), "'torch' job", "'lightning' job")


def test_the_checkpoints_command_lists_status_and_verify_finds_damage(tmp_path):
    _, info = _spec_with_a_checkpoint(tmp_path)
    listing = run_cli("checkpoints", "prior", "--storage", str(tmp_path))
    assert listing.returncode == 0 and "step-000000005" in listing.stdout and "committed" in listing.stdout
    path = os.path.join(info.location.path, "state.pt")
    data = bytearray(open(path, "rb").read())
    data[3] ^= 0xFF
    open(path, "wb").write(bytes(data))
    verified = run_cli("checkpoints", str(tmp_path / "prior"), "--verify")
    assert verified.returncode == 1 and "corrupt" in verified.stdout and "sha256" in verified.stdout


@pytest.mark.parametrize("address,fragments", [
    ("http://127.0.0.1:8265", ["HTTP address", "GCS address", "ray job submit --address http://127.0.0.1:8265"]),
    ("127.0.0.1:{closed_port}", ["no Ray cluster answers at '127.0.0.1:", "ray start --head"]),
    ("headnode", ["'headnode' is not of the form HOST:PORT"]),
], ids=["dashboard address", "nothing listening", "no port"])
def test_a_wrong_ray_address_exits_2_before_anything_starts(tmp_path, address, fragments):
    from conftest import free_port

    address = address.format(closed_port=free_port())
    result = run_cli("run", "jobs/digits_torch.yaml", "--storage", str(tmp_path), "--address", address, timeout=60)
    _assert_user_error(result, *fragments, "Fix")
    assert not (tmp_path / "digits-torch").exists(), "nothing is written for a run that cannot start"


@pytest.mark.slow
@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(300)
def test_a_full_disk_fails_the_run_at_once_naming_the_path_the_size_and_the_fix(small_filesystem):
    storage_dir = small_filesystem / "runs"
    result = run_cli("run", "jobs/digits_torch.yaml", "--storage", str(storage_dir), "--set", "torch.max_epochs=3",
                     "--set", "torch.config.hidden=256", "--set", "checkpoint.every_n_steps=5",
                     "--set", "checkpoint.keep_last=20", timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "StorageFull" in out and "the filesystem is full" in out and "needs about 0.7 MB" in out, out[-3000:]
    assert "not retried" in out and "Traceback" not in out
    store = CheckpointStore(storage.resolve(str(storage_dir / "digits-torch")))
    committed = store.committed()
    assert len(committed) >= 2, "checkpoints commit until the disk is full"
    assert all(store.verify(info).status == "committed" for info in committed)
    assert not [n for n in os.listdir(store.root.path) if n.startswith(".tmp-")], "no partial write holds space"



def test_an_embedded_cluster_under_a_deep_tmpdir_gets_a_temp_folder_its_sockets_fit_in(tmp_path, monkeypatch):
    """Ray's sockets live under <TMPDIR>/ray/session_.../sockets: past 107 bytes ray.init fails
    with a traceback. A deep TMPDIR gets a short folder in /tmp instead; a usual one keeps Ray's.
    TMPDIR is read as Ray reads it, from the environment at the start: a spec's `env:` sets it
    there after Python's tempfile has cached the shell's value (that run failed with a traceback)."""
    from orchestrator.cluster.connection import SOCKET_PATH_MAX, SOCKET_TAIL_BYTES, short_temp_dir

    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", "/tmp")
    tempfile.gettempdir()  # cached now, as in a driver that used tempfile before the spec's env applied
    assert short_temp_dir() == {}
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    chosen = short_temp_dir()["_temp_dir"]
    try:
        assert os.path.isdir(chosen) and len(chosen) + len("/ray") + SOCKET_TAIL_BYTES <= SOCKET_PATH_MAX
    finally:
        os.rmdir(chosen)
