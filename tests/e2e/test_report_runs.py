"""`orchestrator report`: a local run that lost a rank, restarted it in place and was resumed by a
second driver, which hung, drawn as one self-contained page, which a real headless Chromium
renders.

The same local runs prove what the docs say of a hang and of the untimed block (docs/failures.md,
docs/torch.md): a block inside `ctx.untimed()` that outlasts failure.hang_timeout_s is no hang,
while a rank stuck later in the same attempt is one; at that hang every rank's flight-recorder
record is kept beside its log, the driver names the rank the others wait for, and the report shows
that line. A third command then starts the run afresh over its checkpoints (docs/checkpoints.md,
`--resume-from none --overwrite`)."""

from __future__ import annotations

import html
import json
import os
import re

import pytest
from browser import rendered_dom, screenshot
from cli_runs import run_spec
from conftest import REPO, run_cli
from specs import STEPS_PER_EPOCH, torch_spec

# Near the spec's minimum (5 s), with room for a slow step on a loaded machine.
HANG_TIMEOUT_S = 8


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_a_local_run_with_a_restart_a_hang_and_a_resume_is_drawn_on_one_page_then_overwrite_starts_it_afresh(
        tmp_path):
    fault = {"kill_at": 12, "marker": str(tmp_path / "killed"), "kill_rank": 1}
    # In the second epoch (the second driver's): a 12 s block in ctx.untimed() after step 25 on
    # every rank, then rank 1 stuck after step 32 (the newest checkpoint then is step 30's).
    untimed = {"at": 25, "seconds": HANG_TIMEOUT_S + 4, "dir": str(tmp_path)}
    stuck = {"kill_at": 32, "marker": str(tmp_path / "stuck"), "kill_rank": 1}
    spec = torch_spec("drawn", tmp_path, "report_jobs:slow_loop_killed_untimed_then_stuck", fault, sleep_s=0.15,
                      untimed=untimed, stuck=stuck)
    spec["torch"]["max_epochs"] = 1
    spec["failure"]["hang_timeout_s"] = HANG_TIMEOUT_S
    lines: list[str] = []
    first = run_spec(spec, str(tmp_path), lines=lines)
    assert lines[0].startswith("local mode: "), lines[0]
    assert first.status == "finished" and first.restarts == 1
    spec["torch"]["max_epochs"] = 2  # a second driver resumes the run and trains one more epoch
    second = run_spec(spec, str(tmp_path))
    assert second.status == "finished" and second.global_step == 2 * first.global_step

    run_dir = tmp_path / "drawn"
    # The untimed block outlasted the hang timeout on every rank, and was no hang: the one failure
    # of that driver is rank 1's, after it got stuck, in the same attempt.
    blocks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(b["end"] - b["start"] >= HANG_TIMEOUT_S + 4 for b in blocks), blocks
    assert [f["classification"] for f in second.failures] == ["hang"], second.failures
    stuck_at = os.path.getmtime(stuck["marker"])
    assert stuck_at > max(b["end"] for b in blocks)
    assert HANG_TIMEOUT_S - 1.5 <= second.failures[0]["time"] - stuck_at <= HANG_TIMEOUT_S + 10, second.failures
    assert [s["restored_step"] for s in second.starts] == [STEPS_PER_EPOCH, 30], second.starts
    # The flight recorder: each rank's record is kept beside its log, as torch wrote it, and the
    # driver named rank 1 as the one its peer waits for.
    for rank in (0, 1):
        record = json.loads((run_dir / "logs" / f"rank-{rank}.flight-recorder.json").read_text())
        assert record["entries"] and all("profiling_name" in e for e in record["entries"]), rank
    summary = json.loads((run_dir / "summary.json").read_text())
    [named] = summary["hang_collectives"]
    finding = re.search(r"flight recorder: rank 1 never entered collective #\d+ \S+ on \S+, which its peers wait in",
                        named["message"])
    assert named["ranks"] == [1] and finding, named

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
    # The hang's row (the ranks restarted in their agents), and the flight recorder's finding in a
    # row of its own.
    table = re.search(r"<table>.*?</table>", dom, re.DOTALL).group(0)
    assert re.search(rf"<td>restart in place</td><td>restart in place 1/2 after rank \d's hang failure: rank \d [^<]*"
                     rf"made no progress for more than {HANG_TIMEOUT_S} s \(failure.hang_timeout_s\)", table), table
    assert f"<td>hang collectives</td><td>{html.escape(finding.group(0))}" in table, table
    screenshot(str(page), str(tmp_path / "report.png"))

    # --resume-from none --overwrite: a fresh run over the old checkpoints, which are deleted, not
    # mixed with its own.
    assert len(os.listdir(run_dir / "checkpoints")) >= 2
    fresh = run_cli("run", str(tmp_path / "drawn.yaml"), "--resume-from", "none", "--overwrite",
                    "--set", "torch.max_steps=5", timeout=300,
                    env={"PYTHONPATH": os.path.join(REPO, "tests", "helpers")})
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert "fresh run (resume_from: none)" in fresh.stdout, fresh.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 5 and [s["restored_step"] for s in summary["starts"]] == [None], summary
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step-000000005"]
