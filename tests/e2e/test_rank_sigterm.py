"""A SIGTERM that reaches the ranks of a ctx or Lightning run, as Slurm's time limit and `scancel`,
systemd's stop and earlyoom send it to every process of the job: one stop, as if the command had
been sent it (orchestrator/rank/stop_signal.py, driver/signals.py). In local mode (what a Slurm
user runs: `orchestrator run spec.yaml`): the command exits 143 with a stop checkpoint committed,
summary.json says stopped, and the same command resumes from that checkpoint. A ctx run whose
rank 0 alone is sent it (not rank 1, not the command); a Lightning run whose ranks and command all
are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO, wait_for
from specs import lightning_spec, torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore

pytestmark = pytest.mark.slow

HELPERS = os.path.join(REPO, "tests", "helpers")


def _command(tmp_path, spec: dict) -> list[str]:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(json.dumps(spec))
    return [sys.executable, "-m", "orchestrator", "run", str(path)]  # one node, no cluster: local mode


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HELPERS, os.environ.get("PYTHONPATH")]))}


def _ranks_of(command_pid: int) -> dict[int, int]:
    """The command's rank processes now training (rank -> pid): its children with a rank's beat
    file open (<scratch>/attempt_N/<local rank>/beat; one node, so the local rank is the rank)."""
    children = []
    for task in os.listdir(f"/proc/{command_pid}/task"):
        with open(f"/proc/{command_pid}/task/{task}/children") as f:
            children += [int(pid) for pid in f.read().split()]
    ranks = {}
    for pid in children:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # it ended meanwhile
        for link in links:
            if link.endswith("/beat") and "/attempt_" in link:
                ranks[int(os.path.basename(os.path.dirname(link)))] = pid
    return ranks


def _stopped_by_sigterm_to(tmp_path, spec: dict, marker, ranks: list[int], command_too: bool) -> str:
    """`spec` run as a user's shell runs it until `marker` appears, then SIGTERM to `ranks` (and to
    the command, `command_too`). It must exit 143, its newest checkpoint the stop's, whole (the
    store verifies every file's checksum), summary.json saying stopped: that checkpoint's URI."""
    process = subprocess.Popen(_command(tmp_path, spec), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(marker.exists, timeout=240, interval=0.2)
        found = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(_ranks_of(process.pid)), timeout=30)
        assert found, "the ranks' processes were not found"
        for rank in ranks:
            os.kill(found[rank], signal.SIGTERM)
        if command_too:
            process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    first = next(line for line in output.splitlines() if not line.startswith("run name: "))
    assert first.startswith("local mode: "), output[:2000]
    assert process.returncode == 143, output[-4000:]
    assert "stopped by SIGTERM after step" in output, output[-4000:]
    store = CheckpointStore(storage.resolve(str(tmp_path / spec["name"])))
    assert store.committed(), "no checkpoint committed: the stop checkpoint was lost"
    newest = store.committed()[-1]
    assert newest.manifest.reason == "stop", [(i.step, i.manifest.reason) for i in store.committed()]
    store.open_uri(newest.uri)  # every file there, its checksum right
    summary = json.loads((tmp_path / spec["name"] / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["final_checkpoint"] == newest.uri, summary
    return newest.uri


def _resumes_from(tmp_path, spec: dict, uri: str) -> None:
    """The same command again: it resumes from `uri` and finishes."""
    done = subprocess.run(_command(tmp_path, spec), cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / spec["name"] / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_from"]["uri"] == uri, summary


@pytest.mark.timeout(500)
def test_a_ctx_run_whose_rank_0_alone_is_sent_sigterm_stops_with_a_checkpoint_exits_143_and_resumes(tmp_path):
    marker = tmp_path / "at-step-6"
    # Rank 0 holds at step 6 until the run's stop reaches it: the stop comes before the run's end,
    # however slow the machine. Rank 1 and the command are sent nothing.
    spec = torch_spec("rank-sigterm", tmp_path, loop="faulty:slow_loop", sleep_s=0.05, mark_at=6, marker=str(marker),
                      hold_s=240)
    spec["torch"]["max_epochs"] = 1
    uri = _stopped_by_sigterm_to(tmp_path, spec, marker, ranks=[0], command_too=False)
    _resumes_from(tmp_path, spec, uri)


@pytest.mark.timeout(500)
def test_a_lightning_run_whose_ranks_and_command_are_sent_sigterm_stops_once_with_a_checkpoint_and_resumes(
        tmp_path):
    marker = tmp_path / "at-step-8"
    spec = lightning_spec("rank-sigterm", tmp_path, "faulty.SlowClassifier", sleep_s=0.2, mark_at=8, marker=str(marker))
    spec["lightning"]["trainer"]["max_epochs"] = 2
    uri = _stopped_by_sigterm_to(tmp_path, spec, marker, ranks=[0, 1], command_too=True)
    _resumes_from(tmp_path, spec, uri)
