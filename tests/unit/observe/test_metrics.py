"""The run's metrics (orchestrator/observe/metrics.py): what the driver derives from the run's events, and
a real run's metrics on Ray, scraped from the Prometheus endpoint Ray exports them at; the same run
proves the embedded cluster's own token and the Ctrl-C stop checkpoint, which the same command
resumes from."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import ray_logs
import yaml
from conftest import REPO
from specs import STEPS_PER_EPOCH, torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.failures import FailureRecord
from orchestrator.observe import metrics as run_metrics
from orchestrator.observe.metrics import RunMetrics
from orchestrator.protocol import CheckpointCommitted, Failure, Progress, RankStarted, RestartInPlace


def _started(attempt, size, at):
    return RankStarted(rank=0, attempt=attempt, world_size=size, time=at)


def _progress(attempt, step, at, **metrics):
    return Progress(attempt=attempt, step=step, epoch=0, batch_in_epoch=step, time=at, samples_per_s=100.0,
                    stall_s=0.5, metrics=metrics)


def test_restarts_are_counted_by_the_cause_of_the_failure_before_them_and_a_start_without_one_is_a_resize():
    metrics = RunMetrics("r", started=0.0)
    for event in (_started(1, 2, 1.0), Failure(classification="hang", ranks=[], time=2.0),
                  _started(2, 2, 3.0), Failure(classification="infrastructure", ranks=[], time=4.0),
                  _started(3, 1, 5.0), _started(4, 2, 6.0)):
        metrics.observe(event)
    assert metrics.restarts == {"hang": 1, "infrastructure": 1, "resize": 1}


def test_a_restart_in_place_counts_by_the_cause_of_the_rank_that_failed_not_as_a_resize():
    metrics = RunMetrics("r", started=0.0)
    for event in (_started(1, 2, 1.0),
                  RestartInPlace(attempt=2, restarts=1, max_restarts=3, failure=FailureRecord(1, "infrastructure", "")),
                  _started(2, 2, 3.0),
                  RestartInPlace(attempt=3, restarts=2, max_restarts=3, failure=FailureRecord(0, "hang", "")),
                  _started(3, 2, 5.0),
                  RestartInPlace(attempt=4, restarts=3, max_restarts=3, failure=FailureRecord(0, "exit", "")),
                  _started(4, 2, 7.0)):
        metrics.observe(event)
    assert metrics.restarts == {"infrastructure": 2, "hang": 1}
    assert metrics.values["world_size"] == 2


def test_step_time_stall_loss_user_metrics_checkpoint_age_and_goodput_follow_the_events():
    metrics = RunMetrics("r", started=0.0)
    metrics.observe(_started(1, 2, 1.0))
    metrics.observe(_progress(1, 1, 2.0, loss=0.9, acc=0.5))
    metrics.observe(_progress(1, 11, 4.0, loss=0.7, acc=0.6, bad=float("nan")))
    metrics.observe(CheckpointCommitted(step=10, time=3.5, uri="u", reason="steps"))
    # A restarted group: its own stall adds to the first group's; step time is measured within it.
    metrics.observe(_started(2, 2, 5.0))
    metrics.observe(_progress(2, 12, 6.0, loss=0.6))
    metrics.refresh(now=8.0)
    values = metrics.values
    assert values["step_time_seconds"] == pytest.approx(0.2)  # (4 - 2) / (11 - 1), not across groups
    assert values["checkpoint_stall_seconds"] == pytest.approx(1.0)
    assert values["loss"] == 0.6 and metrics.user == {"acc": 0.6}
    assert values["checkpoint_step"] == 10 and values["checkpoint_age_seconds"] == pytest.approx(4.5)
    assert values["global_step"] == 12
    assert 0 < values["goodput"] < 1


def test_goodput_waits_for_a_step_time_instead_of_reporting_a_false_zero():
    """A group killed after one report, and its successor's first report: no step time is known
    yet, so the steps cannot be valued. The gauge stays unset until they can."""
    metrics = RunMetrics("r", started=0.0)
    for event in (_started(1, 2, 1.0), _progress(1, 8, 2.0), _started(2, 2, 5.0), _progress(2, 9, 6.0)):
        metrics.observe(event)
    metrics.refresh(now=7.0)
    assert "goodput" not in metrics.values
    metrics.observe(_progress(2, 19, 8.0))
    metrics.refresh(now=13.0)
    assert 0 < metrics.values["goodput"] < 1


def test_the_grafana_dashboard_plots_every_exported_metric_and_only_those():
    dashboard = json.loads(open(os.path.join(REPO, "dashboards", "orchestrator_grafana_dashboard.json")).read())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"ray_orchestrator_\w+", target["expr"])}
    exported = {f"ray_{run_metrics.PREFIX}{name}" for name in run_metrics.RUN_GAUGES}
    exported |= {f"ray_{run_metrics.PREFIX}{name}" for name, _ in (run_metrics.USER_METRIC, run_metrics.WORKER_STEP_TIME)}
    exported |= {f"ray_{run_metrics.PREFIX}{name}_total" for name, _ in (run_metrics.RESTARTS, run_metrics.CHECKPOINTS)}
    assert used == exported
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "run")
    assert "ray_orchestrator_global_step" in variable["definition"]


# --- a real run, scraped --------------------------------------------------------------------------

def _scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text -> {(name, labels): value}, for our series only."""
    found = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        match = re.match(r"(ray_orchestrator_\w+)\{(.*)\} (\S+)$", line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            found[(match.group(1), labels)] = float(match.group(3))
    return found


def _value(series, name, **labels):
    wanted = set(labels.items())
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if values else None


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_run_on_ray_exports_its_metrics_at_rays_endpoint_keeps_its_own_token_and_resumes_from_its_ctrl_c_checkpoint(
        tmp_path):
    """One run on the embedded Ray cluster (`--ray`), as its docs name it, proves three promises.

    Metrics (metrics.md): Ray's own export, at the port Ray records for the node in its session
    folder (not the driver's line), serves the run's series, with plausible values, beside Ray's
    own series.
    Step, throughput, step time, loss, world size, a restart by its cause, checkpoints, their
    age and the stall, goodput, and every worker's step time.

    Tokens (cluster.md, "The tokens of local clusters"): Ray 2.60 turns token auth on for a local
    cluster and, left to itself, writes ~/.ray/auth_token, which each Ray process reads as it
    starts. The run's agents have token auth on with a token of the cluster's own, and no file is
    written; then Ray's own `ray get-auth-token --generate` writes one (as another cluster's first
    start would), an agent is SIGKILLed, and Ray Train's new worker process still joins with the
    cluster's token (with the file's, it was refused and the run waited forever). The spec's
    `env:` reaches every rank of both attempts.

    Ctrl-C (running.md): exit 130, a stop checkpoint that the product's own reading lists and
    verifies, at the step rank 0 recorded last; the same command then resumes from it, its rank 0
    going on at the next step."""
    record, seen_env, home = tmp_path / "record", tmp_path / "env", tmp_path / "home"
    record.mkdir()
    seen_env.mkdir()
    spec = torch_spec("metered", tmp_path, loop="ray_path_jobs:recorded_loop", sleep_s=0.1, every=5,
                      record_dir=str(record), env_record={"dir": str(seen_env), "variable": "JOB_SETTING"})
    spec["env"] = {"JOB_SETTING": "from the spec"}
    spec["torch"]["max_epochs"] = 200  # long enough to be scraped; stopped once it has been
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    # Ray exports every 10 s by default: once a second keeps the test short. A home of its own:
    # the token file it checks and writes is this test's alone. No token of the test's shell.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")},
           "RAY_metrics_report_interval_ms": "1000", "PYTHONPATH": f"{REPO}/tests/helpers", "HOME": str(home)}
    token_file = home / ".ray" / "auth_token"

    first = _Command(["run", str(spec_path), "--ray"], env)
    try:
        first.wait_for(lambda: first.lines, START_S)
        assert first.lines[0].startswith("on Ray (--ray)"), first.lines[:3]
        printed = first.wait_for(lambda: next((m.group(1) for line in first.lines
                                               if (m := re.match(r"metrics: (http://\S+/metrics)", line))), None),
                                 START_S)
        first.wait_for(lambda: any("workers up" in line for line in first.lines), START_S)
        agents = first.wait_for(lambda: _agents(record, attempt=1), START_S)
        assert not token_file.exists(), "an embedded run wrote the user's token file"
        cluster_token = {_token_of(agent) for agent in agents}
        assert len(cluster_token) == 1 and len(next(iter(cluster_token))) >= 32, cluster_token
        written = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "get-auth-token",
                                  "--generate"], capture_output=True, text=True, env=env, timeout=120)
        assert written.returncode == 0 and token_file.exists(), written.stdout + written.stderr
        assert token_file.read_text().strip() not in cluster_token  # another token: one a new process must not take

        # A lost agent, once checkpoints are committed: Ray Train starts a new worker group.
        first.wait_for(lambda: _steps(record) and _steps(record)[-1]["step"] >= KILL_AT, 480)
        lost = max(agents)
        os.kill(lost, signal.SIGKILL)
        restarted = first.wait_for(lambda: _agents(record, attempt=2), 480)
        assert lost not in restarted, (lost, restarted)  # new Ray processes, which read a token as they start
        assert {_token_of(agent) for agent in restarted} == cluster_token

        url = _export_endpoint(first)
        assert printed == url, (printed, url)  # the driver names the node's endpoint
        series = first.wait_for(lambda: _complete(url), 480)
        assert _rays_own_series(url), "the endpoint scraped is not Ray's export"
    finally:
        first.stop(signal.SIGINT)  # Ctrl-C: the run checkpoints and stops

    def value(name, **labels):
        return _value(series, f"ray_orchestrator_{name}", run="metered", **labels)

    assert value("restarts_total", cause="infrastructure") == 1
    assert value("world_size") == 2
    assert value("samples_per_second") > 0
    # slow_loop sleeps 0.1 s per step: the step time is at least that, and not absurd.
    assert 0.1 <= value("step_time_seconds") < 10
    for rank in ("0", "1"):
        assert 0.1 <= value("worker_step_time_seconds", rank=rank) < 10
    assert math.isfinite(value("loss")) and value("loss") > 0
    assert value("checkpoints_committed_total") >= 2
    # every_n_steps: 5, and one at each epoch's end.
    checkpoint = value("checkpoint_step")
    assert (checkpoint % 5 == 0 or checkpoint % STEPS_PER_EPOCH == 0) and checkpoint <= value("global_step")
    assert 0 <= value("checkpoint_age_seconds") < 60
    assert 0 <= value("checkpoint_stall_seconds") < 30
    assert 0 < value("goodput") < 1
    assert value("epoch") >= 0
    seen = {path.name: path.read_text() for path in seen_env.iterdir()}
    assert seen == {f"rank-{rank}-attempt-{attempt}": "from the spec" for rank in (0, 1) for attempt in (1, 2)}

    stop_step, stop_uri = _stopped_at_a_stop_checkpoint(first, tmp_path)
    assert _steps(record)[-1]["step"] == stop_step  # where rank 0 was when it stopped

    recorded = len(_steps(record))
    again = _Command(["run", str(spec_path), "--ray"], env)  # the same command
    try:
        again.wait_for(lambda: again.lines, START_S)
        assert again.lines[0].startswith("on Ray (--ray)"), again.lines[:3]
        resumed = again.wait_for(lambda: _steps(record)[recorded:], START_S)
        assert resumed[0]["step"] == stop_step + 1, resumed[:3]
        assert any(f"resuming from step {stop_step}" in line for line in again.lines), again.lines[-20:]
    finally:
        again.stop(signal.SIGINT)
    assert again.code == 130, again.tail()
    with open(tmp_path / "metered" / "summary.json") as f:
        assert json.load(f)["resumed_from"]["uri"] == stop_uri
    assert token_file.read_text().strip() == written.stdout.strip()  # nor did the second run touch the file


def _stopped_at_a_stop_checkpoint(command, tmp_path) -> tuple[int, str]:
    """The command was stopped by Ctrl-C as a user's is: exit 130, the step it says it stopped after,
    and a stop checkpoint at that step which `orchestrator checkpoints --verify` lists as verified
    and the store verifies file by file. That step and the checkpoint's URI."""
    assert command.code == 130, command.tail()
    said = next((m for line in command.lines if (m := re.search(r"stopped by SIGINT after step (\d+)", line))), None)
    assert said, command.tail()
    step = int(said.group(1))
    store = CheckpointStore(storage.resolve(str(tmp_path / "metered")))
    newest = store.committed()[-1]
    assert (newest.step, newest.manifest.reason) == (step, "stop"), [(i.step, i.manifest.reason)
                                                                     for i in store.committed()]
    assert store.verify(newest).status == "committed", newest.problem
    listed = subprocess.run([sys.executable, "-m", "orchestrator", "checkpoints", "metered", "--storage", str(tmp_path),
                             "--verify"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # Its row: checkpoint, step, epoch, batch, reason, written, size, status (after --verify), metrics.
    row = next((re.split(r"\s{2,}", line) for line in listed.stdout.splitlines() if line.startswith(newest.name)), [])
    assert row[1:2] == [str(step)] and row[4:5] == ["stop"] and row[7:8] == ["committed"], listed.stdout
    return step, newest.uri


class _Command:
    """`orchestrator ARGS` in the background with `env`, its output read line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.lines: list[str] = []
        self.code: int | None = None
        self._process = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=REPO, text=True, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=lambda: self.lines.extend(
            line.rstrip("\n") for line in self._process.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, predicate, timeout: float):
        """What `predicate` returns once it is true; an AssertionError with the run's story if it is not
        in `timeout` s, or if the command ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except OSError:
                value = None
            if value:
                return value
            if self._process.poll() is not None:
                break
            time.sleep(0.5)
        sessions = ray_logs.session_dirs_of_drivers(os.environ["ORCHESTRATOR_STATE_DIR"])
        raise AssertionError(f"not seen in time; the command said:\n{self.tail()}\n{ray_logs.stories(sessions)}")

    def stop(self, signum: int) -> None:
        """Send `signum` and wait for the end (SIGKILL past 120 s)."""
        if self._process.poll() is None:
            self._process.send_signal(signum)
        try:
            self.code = self._process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=10)

    def tail(self) -> str:
        return "\n".join(self.lines[-30:])


def _agents(record, attempt: int) -> set[int] | None:
    """The parents (on Ray, the agents) of both ranks of `attempt`, once both recorded their start."""
    found = [json.loads(path.read_text())["parent"] for path in record.glob(f"rank-*-attempt-{attempt}.json")]
    return set(found) if len(found) == 2 else None


def _token_of(pid: int) -> str:
    """The Ray token an agent process authenticates with, read from its environment (/proc):
    asserting that it runs as a Ray worker, with token auth on."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().startswith(b"ray::"), f"process {pid} is not a Ray worker"
    with open(f"/proc/{pid}/environ", "rb") as f:
        environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    assert environ.get(b"RAY_AUTH_MODE") == b"token", f"process {pid} runs without token auth"
    return environ[b"RAY_AUTH_TOKEN"].decode()


def _steps(record) -> list[dict]:
    path = record / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _export_endpoint(command) -> str:
    """The node's metrics endpoint as Ray records it in the session folder, where the node's raylet
    and agent find their ports (`metrics_export_port_<node id>`): not the driver's line. The
    embedded cluster has one node, on loopback."""
    sessions = ray_logs.session_dirs_of_drivers(os.environ["ORCHESTRATOR_STATE_DIR"])
    assert len(sessions) == 1, sessions
    ports = command.wait_for(lambda: list(pathlib.Path(sessions[0]).glob("metrics_export_port_*")), 120)
    assert len(ports) == 1, ports
    return f"http://127.0.0.1:{ports[0].read_text().strip()}/metrics"


def _rays_own_series(url: str) -> bool:
    """Ray's export serves Ray's own series (its raylet's, its workers') beside ours."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return re.search(r"^ray_(?!orchestrator_)\w+", text, re.MULTILINE) is not None


def _complete(url: str):
    """Every series the test asserts, once each has a value worth asserting; else None."""
    series = _scrape(url)
    restarted = _value(series, "ray_orchestrator_restarts_total", run="metered", cause="infrastructure")
    ranks = [_value(series, "ray_orchestrator_worker_step_time_seconds", run="metered", rank=str(r)) for r in (0, 1)]
    step = _value(series, "ray_orchestrator_global_step", run="metered")
    # samples/s and step time need two reports of a group.
    present = all(_value(series, f"ray_orchestrator_{name}", run="metered") is not None for name in (
        "checkpoint_age_seconds", "samples_per_second", "step_time_seconds", "loss", "goodput",
        "checkpoints_committed_total", "checkpoint_step", "checkpoint_stall_seconds", "epoch", "world_size"))
    # A checkpoint committed after the restart: until then its age counts the restart too, not
    # the interval between checkpoints asserted.
    checkpoint = _value(series, "ray_orchestrator_checkpoint_step", run="metered")
    ready = restarted and all(ranks) and step and step > KILL_AT and present and checkpoint > KILL_AT
    return series if ready else None


# The run's start, from the command to its workers, on a loaded machine.
START_S = 480
# The step after which an agent is SIGKILLed.
KILL_AT = 12
