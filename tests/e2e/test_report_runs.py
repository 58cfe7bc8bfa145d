"""`orchestrator report`: a run that lost a rank, restarted it in place and was resumed by a
second driver, drawn as one self-contained page, which a real headless Chromium renders."""

from __future__ import annotations

import json
import re

import pytest
from browser import rendered_dom, screenshot
from cli_runs import run_spec
from conftest import run_cli
from specs import torch_spec


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_with_a_restart_and_a_resume_is_drawn_on_one_page_a_browser_renders(tmp_path):
    fault = {"kill_at": 12, "marker": str(tmp_path / "killed"), "kill_rank": 1}
    spec = torch_spec("drawn", tmp_path, "faulty:slow_loop_killed_once", fault, sleep_s=0.15)
    spec["torch"]["max_epochs"] = 1
    first = run_spec(spec, str(tmp_path))
    assert first.status == "finished" and first.restarts == 1
    spec["torch"]["max_epochs"] = 2  # a second driver resumes the run and trains one more epoch
    second = run_spec(spec, str(tmp_path))
    assert second.status == "finished" and second.global_step == 2 * first.global_step

    run_dir = tmp_path / "drawn"
    histories = sorted((run_dir / "history").iterdir())
    assert len(histories) == 2  # one file a driver, the first kept by the second
    kinds = [e["kind"] for e in json.loads(histories[0].read_text())["events"]]
    assert "restart_in_place" in kinds and "checkpoint" in kinds and "progress" not in kinds

    done = run_cli("report", str(run_dir), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    page = run_dir / "report.html"
    assert f"report: {page} (" in done.stdout and "2 driver(s)" in done.stdout
    text = page.read_text()
    # Self-contained: plotly's script is inline, nothing is fetched.
    assert not re.search(r"<script[^>]+src=", text) and "<link" not in text

    dom = rendered_dom(str(page))
    for chart in ("chart-timeline", "chart-step-rate", "chart-goodput"):
        drawn = re.search(rf'<div id="{chart}"[^>]*class="[^"]*js-plotly-plot[^"]*"', dom)
        assert drawn, f"{chart} was not drawn by plotly in the browser"
    assert dom.count('class="main-svg"') >= 6  # each chart's two SVG layers
    # The time line: both drivers, the attempts (the restart in place is attempt 2), the events.
    for label in ("driver 1: finished", "driver 2: finished", "attempt 1 · 2 ranks", "attempt 2 · 2 ranks",
                  "restart in place", "checkpoint"):
        assert label in dom, label
    # The failures' table names the rank, the class and the cause.
    assert re.search(r"restart in place 1/2 after rank 1's infrastructure failure: the process was killed by "
                     r"SIGKILL", dom)
    # Each rank's step rate is a line of its own; the goodput bar sums both drivers.
    assert ">rank 0<" in dom and ">rank 1<" in dom
    assert re.search(r"Goodput: [\d.]+% of [\d.]+ s productive", dom)
    screenshot(str(page), str(tmp_path / "report.png"))
