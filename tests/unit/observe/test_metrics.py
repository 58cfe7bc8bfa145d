"""The run's metrics (orchestrator/observe/metrics.py): what the driver derives from the run's events, and
a real run's metrics scraped from its node's Prometheus endpoint."""

from __future__ import annotations

import math
import os
import re
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
                  RestartInPlace(attempt=2, restarts=1, max_restarts=3, failure={"rank": 1, "kind": "infrastructure"}),
                  _started(2, 2, 3.0),
                  RestartInPlace(attempt=3, restarts=2, max_restarts=3, failure={"rank": 0, "kind": "hang"}),
                  _started(3, 2, 5.0),
                  RestartInPlace(attempt=4, restarts=3, max_restarts=3, failure={"rank": 0, "kind": "exit"}),
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
    import json
    import os

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
@pytest.mark.timeout(1200)
def test_a_runs_metrics_reach_its_nodes_prometheus_endpoint_with_plausible_values(tmp_path):
    """Step, throughput, step time, loss, user metrics, world size, a restart by its cause,
    checkpoints, their age and the stall, goodput, and every worker's step time. The same run
    checks that the spec's `env:` reaches every worker process, the restarted ones included, and
    that its embedded cluster neither writes nor depends on ~/.ray/auth_token: another cluster's
    first start rewrites that file while this run goes on, and the restart still comes back (it
    waited forever, its new workers refused with the other token)."""
    marker, seen_env = tmp_path / "killed", tmp_path / "env"
    seen_env.mkdir()
    spec = torch_spec("metered", tmp_path, loop="faulty:slow_loop_killed_once", sleep_s=0.1, every=5,
                      fault={"marker": str(marker), "kill_at": KILL_AT, "kill_rank": 1},
                      env_record={"dir": str(seen_env), "variable": "JOB_SETTING"})
    spec["env"] = {"JOB_SETTING": "from the spec"}
    spec["torch"]["max_epochs"] = 30  # long enough to be scraped; stopped once it has been
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    # Ray exports every 10 s by default: once a second keeps the test short.
    # A home of its own: the token file it checks and rewrites is this test's alone.
    home = tmp_path / "home"
    env = {"RAY_metrics_report_interval_ms": "1000", "PYTHONPATH": f"{REPO}/tests/helpers", "HOME": str(home)}
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(spec_path)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **env})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(driver.stdout), daemon=True)
    reader.start()
    try:
        # One bound for the whole start (cluster, metrics endpoint, workers): on a machine whose
        # cores other tests' clusters hold, CI's start took longer than 120 s from the endpoint to
        # the workers; alone it takes under 30 s.
        started_by = time.monotonic() + START_S
        url = _wait(lambda: next((m.group(1) for line in list(lines)
                                  if (m := re.match(r"metrics: (http://\S+/metrics)", line))), None),
                    started_by - time.monotonic(), lines)
        assert url.startswith("http://127.0.0.1:"), url
        _wait(lambda: any("workers up" in line for line in list(lines)), started_by - time.monotonic(), lines)
        token_file = home / ".ray" / "auth_token"
        assert not token_file.exists(), "an embedded run wrote the user's token file"
        token_file.parent.mkdir(parents=True)
        token_file.write_text("f" * 64)  # as `ray start` or another first ray.init would

        def complete():
            series = _scrape(url)
            restarted = _value(series, "ray_orchestrator_restarts_total", run="metered", cause="infrastructure")
            ranks = [_value(series, "ray_orchestrator_worker_step_time_seconds", run="metered", rank=str(r))
                     for r in (0, 1)]
            step = _value(series, "ray_orchestrator_global_step", run="metered")
            # Every series asserted below (samples/s and step time need two reports of a group).
            present = all(_value(series, f"ray_orchestrator_{name}", run="metered") is not None for name in (
                "checkpoint_age_seconds", "samples_per_second", "step_time_seconds", "loss", "goodput",
                "checkpoints_committed_total", "checkpoint_step", "checkpoint_stall_seconds", "epoch"))
            # A checkpoint committed after the restart: until then its age counts the restart too
            # (120 s on CI's loaded machine), not the interval between checkpoints asserted below.
            checkpoint = _value(series, "ray_orchestrator_checkpoint_step", run="metered")
            ready = restarted and all(ranks) and step and step > 12 and present and checkpoint > KILL_AT
            return series if ready else None

        # Bounds with room for a machine where other tests' Ray clusters take most of the cores.
        series = _wait(complete, 480, lines)
    finally:
        driver.send_signal(2)  # Ctrl-C: the run checkpoints and stops
        try:
            driver.wait(timeout=90)
        except subprocess.TimeoutExpired:
            driver.kill()
        reader.join(timeout=10)

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
    assert driver.returncode != 0 and any("stopped by SIGINT" in line for line in lines), "".join(lines[-20:])


# The run's start, from the command to its workers, on a loaded machine.
START_S = 480
# The step at which rank 1 is killed once.
KILL_AT = 30


def _wait(predicate, timeout, lines):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(1)
    # The run's own Ray logs say why workers did not come (the driver's output is silent on it).
    sessions = ray_logs.session_dirs_of_drivers(os.environ["ORCHESTRATOR_STATE_DIR"])
    raise AssertionError("not seen in time; the driver said:\n" + "".join(lines[-30:]) + "\n" + ray_logs.stories(sessions))
