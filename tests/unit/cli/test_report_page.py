"""The report's page from history entries: attempts, events, step rates and goodput over every
driver, and text from the run escaped (cli/report_page.py)."""

from __future__ import annotations

import pytest

from orchestrator.cli.report_page import attempts, describe_event, goodput_totals, page, step_rate_figure


def _entry(started: float, events: list[dict], series: dict | None = None, goodput: dict | None = None) -> dict:
    return {"version": 1, "driver": {"host": "vm", "pid": 1, "started": started, "ended": started + 100},
            "status": "finished", "error": None, "goodput": goodput or {}, "events": events,
            "step_series": series or {}}


def _started(attempt: int, rank: int, at: float, world: int = 2) -> dict:
    return {"kind": "rank_started", "time": at, "attempt": attempt, "rank": rank, "world_size": world,
            "hostname": f"node-{rank}", "node_id": "n" * 12}


RESTART = {"kind": "restart_in_place", "time": 1030.0, "attempt": 2, "restarts": 1, "max_restarts": 2,
           "failure": {"kind": "user", "rank": 1, "error": "ValueError: bad batch <script>alert(1)</script>\n  at x"}}


def test_each_attempt_runs_from_its_first_rank_to_the_failure_that_ended_it_or_the_driver_end():
    entry = _entry(1000.0, [_started(1, 0, 1010.0), _started(1, 1, 1009.0), RESTART,
                            _started(2, 1, 1040.0), _started(2, 0, 1041.0)])
    spans = [(a["attempt"], a["start"], a["end"], a["world_size"]) for a in attempts(entry)]
    assert spans == [(1, 1009.0, 1030.0, 2), (2, 1040.0, 1100.0, 2)]


@pytest.mark.parametrize("event, line", [
    (RESTART, "restart in place 1/2 after rank 1's user failure: ValueError: bad batch <script>alert(1)</script>"),
    ({"kind": "failure", "time": 1.0, "classification": "hang", "ranks": [{"rank": 3, "error": "rank 3 froze"}]},
     "hang failure of rank 3: rank 3 froze"),
    ({"kind": "checkpoint", "time": 1.0, "step": 40, "reason": "epoch_end"}, "checkpoint committed at step 40 (epoch_end)"),
    ({"kind": "straggler", "time": 1.0, "message": "rank 1 is a straggler"}, "rank 1 is a straggler"),
])
def test_each_event_is_one_line(event, line):
    assert describe_event(event) == line


def test_goodput_sums_every_driver_and_the_page_escapes_what_the_run_wrote():
    first = _entry(1000.0, [_started(1, 0, 1010.0), RESTART], goodput={"productive_s": 50.0,
                                                                    "lost_s": {"startup": 10.0, "restarts": 5.0}})
    second = _entry(2000.0, [_started(1, 0, 2010.0)], goodput={"productive_s": 80.0, "lost_s": {"startup": 8.0}})
    assert goodput_totals([first, second]) == {"productive": 130.0, "startup": 18.0, "restarts": 5.0}
    html = page("nightly <b>", "file:///runs/nightly", {"status": "finished", "global_step": 9}, [first, second], [])
    assert "nightly &lt;b&gt;" in html and "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script") >= 3 and "<script src" not in html  # plotly inline, once a chart


def test_past_sixteen_ranks_the_slowest_median_and_fastest_are_drawn():
    series = {str(rank): [[0.0, 1, 0], [2.0, 1, 20 + rank], [4.0, 1, 40 + 2 * rank]] for rank in range(32)}
    figure = step_rate_figure([_entry(0.0, [], series)])
    assert [trace.name for trace in figure.data] == ["rank 0", "rank 16", "rank 31"]
    assert "slowest, median and fastest of 32 ranks" in figure.layout.title.text
    few = step_rate_figure([_entry(0.0, [], {"0": series["0"], "1": series["1"]})])
    assert [trace.name for trace in few.data] == ["rank 0", "rank 1"]
