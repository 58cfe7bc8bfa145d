"""The grace a failing rank gets on Ray (docs/failures.md, "How a failure is classified", phases
with limits of their own): a Lightning rank whose training raised is `finishing` until its process
exits, even in a C call that keeps its heartbeat thread from running; its own error is what the run
reports, on its first attempt, not a hang; a rank still on its way out after
`failure.hang_timeout_s` is ended by its agent, and the run reports the same error with that note.
The local-mode run of the same case is in test_local_mode.py; this one joins the warm cluster."""

from __future__ import annotations

import json

import pytest
from cli_runs import failure_of, run_command
from specs import lightning_spec

pytestmark = pytest.mark.slow

# Short, so that the wait for the rank's end is short; the run's first step (not timed) may take longer.
HANG_TIMEOUT_S = 8


@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
def test_a_lightning_rank_on_ray_that_never_ends_after_its_bug_is_ended_by_its_agent_and_the_bug_fails_the_run_once(
        tmp_path):
    # Rank 1 pauses 2 s in step 3 (its heartbeats say it trains, at that step), raises, and its
    # callback's on_exception then stays in libc's sleep with the GIL held for an hour.
    spec = lightning_spec("buggy", tmp_path, "faulty.BuggyClassifier", raise_at=3, pause_s=2.0)
    spec["lightning"]["callbacks"] = [{"class_path": "faulty.SlowToFail", "init_args": {"seconds": 3600}}]
    spec["failure"]["hang_timeout_s"] = HANG_TIMEOUT_S
    done = run_command(spec, str(tmp_path), timeout=300)
    assert done.stdout.splitlines()[0].startswith("on Ray"), done.stdout[:2000]
    error = failure_of(done)
    assert "failed on its first attempt: rank 1: KeyError" in error and "no such feature at step 3" in error, error
    assert "tests/helpers/faulty.py:" in error, error
    assert "failure (hang)" not in done.stdout, done.stdout[-3000:]
    summary = json.loads((tmp_path / "buggy" / "summary.json").read_text())
    [failure] = summary["failures"]
    assert failure["classification"] == "user", failure
    assert "had not ended within failure.hang_timeout_s of this error" in failure["ranks"][0]["note"], failure
    assert len(summary["starts"]) == 1, summary["starts"]
