"""A warm cluster's record (`orchestrator up`, orchestrator/cluster/warm.py) outlives its cluster: a
reboot, or a home shared by several hosts, shows a run a record whose keeper pid now names some
other process. A stale record is removed, and a process is ended only when it is provably the
keeper: same host, kernel boot id, pid namespace and start time as `up` recorded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, free_port

from orchestrator.cluster.records import state_dir
from orchestrator.cluster.warm import RECORD_NAME
from orchestrator.driver import local
from orchestrator.spec import resolve_spec

# A shell that ignores SIGTERM and has a child (a `sleep`, which inherits that): only a SIGKILL of
# each, by its pid, ends them, as `orchestrator down` ends a keeper that does not stop in its grace.
TREE = "trap '' TERM; sleep 300 & echo $!; wait"


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


@pytest.fixture
def unrelated_tree():
    """A process of this test's own (not any cluster's keeper) and its child; both ended afterwards."""
    parent = subprocess.Popen(["sh", "-c", TREE], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    yield parent, child
    for pid in (child, parent.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    parent.wait(timeout=30)
    parent.stdout.close()


def _write_record(keeper_pid: int, **keeper) -> tuple[str, object]:
    """A record of a warm cluster that is gone (nothing answers at its address), naming `keeper_pid`
    with the identity fields `keeper` (none: a record of an older version); its address and path."""
    address = f"127.0.0.1:{free_port()}"
    gone = os.path.join(str(state_dir()), "gone-cluster")
    record = {"address": address, "session_dir": os.path.join(gone, "session"), "temp_dir": gone,
              "token": "x" * 64, "started_at": time.time() - 3600, "keeper_pid": keeper_pid, "dashboard": "",
              **keeper}
    path = state_dir() / RECORD_NAME
    path.write_text(json.dumps(record))
    return address, path


def _true_identity(pid: int) -> dict:
    """What `orchestrator up` records of its keeper, read here without the product's code."""
    return {"keeper_host": socket.gethostname(), "keeper_boot_id": _boot_id(),
            "keeper_pid_ns": str(os.stat("/proc/self/ns/pid").st_ino), "keeper_started": _proc_stat(pid)[19]}


def _run_in_auto_mode():
    """The mode choice of `orchestrator run SPEC` without --local, --ray or an address: it reads the record."""
    job = resolve_spec({"name": "m", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1},
                        "scaling": {"num_workers": 1}})
    return local.choose(job, None)


@pytest.fixture(autouse=True)
def _no_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a user's shell without one


NOT_THE_KEEPER = {
    "another boot": {"keeper_boot_id": str(uuid.uuid4())},
    "another host": {"keeper_host": "another-host-of-the-shared-home"},
    "a reused pid": {"keeper_started": "1"},  # the keeper started at boot; this pid's process long after
    "another pid namespace": {"keeper_pid_ns": "1"},
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("elsewhere", list(NOT_THE_KEEPER))
def test_a_stale_record_whose_keeper_pid_now_names_another_process_is_removed_and_that_process_lives(
        unrelated_tree, elsewhere):
    parent, child = unrelated_tree
    address, record = _write_record(parent.pid, **{**_true_identity(parent.pid), **NOT_THE_KEEPER[elsewhere]})

    mode = _run_in_auto_mode()

    assert parent.poll() is None and _running(child)
    assert mode.local and not record.exists()
    assert len(mode.notes) == 1 and f"the warm local cluster recorded at {address}" in mode.notes[0]
    assert "no process ended" in mode.notes[0], mode.notes


@pytest.mark.timeout(60)
def test_a_stale_record_of_an_older_version_without_the_keepers_identity_is_removed_and_ends_nothing(
        unrelated_tree):
    parent, child = unrelated_tree
    _, record = _write_record(parent.pid)

    mode = _run_in_auto_mode()

    assert parent.poll() is None and _running(child)
    assert mode.local and not record.exists()
    assert len(mode.notes) == 1 and "no process ended" in mode.notes[0] and "older version" in mode.notes[0]


@pytest.mark.timeout(60)
def test_a_stale_record_whose_keeper_is_provably_alive_here_has_its_keepers_tree_ended(unrelated_tree):
    """The control of the tests above: the same tree, recorded with its true identity, is the keeper."""
    parent, child = unrelated_tree
    _, record = _write_record(parent.pid, **_true_identity(parent.pid))

    mode = _run_in_auto_mode()

    assert mode.local and not record.exists()
    assert "its keeper was stopped" in mode.notes[0], mode.notes
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)


@pytest.mark.timeout(120)
def test_orchestrator_down_with_a_record_of_another_boot_removes_it_and_ends_nothing(unrelated_tree):
    parent, child = unrelated_tree
    _, record = _write_record(parent.pid, **{**_true_identity(parent.pid), "keeper_boot_id": str(uuid.uuid4())})

    done = subprocess.run([sys.executable, "-m", "orchestrator", "down"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=100)

    assert done.returncode == 0, done.stdout + done.stderr
    assert not record.exists()
    assert parent.poll() is None and _running(child)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_record_orchestrator_up_writes_names_its_keeper_by_host_boot_and_start_time(_warm_record):
    with open(_warm_record) as f:
        record = json.load(f)
    keeper = record["keeper_pid"]

    assert _running(keeper)
    assert {key: record[key] for key in _true_identity(keeper)} == _true_identity(keeper)
