"""The page `orchestrator report` writes (cli/report.py): a run drawn from its history files
(observe/history.py) and summary.json, as one self-contained HTML file (plotly's script inline, so
it opens anywhere, offline, and can be mailed or archived with the run).

- the run at a glance: status, steps, world sizes, wall time, goodput, the error if any;
- a time line: each driver's span, each attempt (a start of the ranks) with its world size, every
  failure with its class and message, the restarts in place, hangs, checkpoint commits, straggler
  and other warnings;
- each rank's step rate over time (the slowest, median and fastest rank's past 16 ranks);
- the goodput breakdown: productive seconds against what was lost, by cause, over every driver.
"""

from __future__ import annotations

import datetime
import html
import statistics
from typing import Any

from orchestrator.monitor.series import SAMPLE_S, step_rates

# Past this many ranks the step-rate chart draws the slowest, the median and the fastest rank's.
DRAWN_RANKS = 16
COLOURS = {"hang_collectives": "#9467bd",
           "failure": "#d62728", "restart_in_place": "#ff7f0e", "hang": "#9467bd", "checkpoint": "#2ca02c",
           "straggler": "#8c564b", "warning": "#7f7f7f", "preemption": "#e377c2", "resume_fallback": "#bcbd22",
           "stop_requested": "#17becf", "finished": "#1f77b4"}
ROWS = ("drivers", "attempts", "failures", "checkpoints", "warnings")
ROW_OF = {"hang_collectives": "failures",
          "failure": "failures", "restart_in_place": "failures", "hang": "failures", "checkpoint": "checkpoints",
          "straggler": "warnings", "warning": "warnings", "preemption": "warnings", "resume_fallback": "warnings",
          "stop_requested": "warnings", "finished": "checkpoints"}


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _first_line(text: Any, limit: int = 300) -> str:
    line = next((part.strip() for part in str(text or "").splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe_event(event: dict[str, Any]) -> str:
    """One line for an event's hover and the failures' table."""
    kind = event["kind"]
    if kind == "failure":
        ranks = event.get("ranks") or [{}]
        where = ", ".join(f"rank {r.get('rank')}" for r in ranks if r.get("rank", -1) >= 0) or "the group"
        return f"{event.get('classification', '?')} failure of {where}: {_first_line(ranks[0].get('error'))}"
    if kind == "restart_in_place":
        failure = event.get("failure") or {}
        return (f"restart in place {event.get('restarts')}/{event.get('max_restarts')} after rank "
                f"{failure.get('rank', '?')}'s {failure.get('kind', '?')} failure: {_first_line(failure.get('error'))}")
    if kind == "hang":
        return f"hang of rank(s) {event.get('ranks')}: {_first_line(event.get('message'))}"
    if kind == "checkpoint":
        reason = f" ({event['reason']})" if event.get("reason") else ""
        return f"checkpoint committed at step {event.get('step')}{reason}"
    if kind == "finished":
        return f"finished at step {event.get('step')}" + (" (stopped)" if event.get("stopped") else "")
    if kind == "preemption":
        return f"preemption notice at step {event.get('step')} for node(s) {', '.join(event.get('nodes') or [])}"
    if kind == "resume_fallback":
        return f"resumed from {event.get('uri')} instead of {event.get('wanted')}: {_first_line(event.get('cause'))}"
    if kind == "stop_requested":
        return "stop requested"
    return _first_line(event.get("message") or kind)


def attempts(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Each attempt of one driver: from its first rank's start to the next attempt's, else the
    failure that ended it, else the driver's end."""
    starts: dict[int, dict[str, Any]] = {}
    for event in entry["events"]:
        if event["kind"] == "rank_started":
            found = starts.setdefault(event["attempt"], {"attempt": event["attempt"], "start": event["time"],
                                                         "world_size": event["world_size"], "nodes": set()})
            found["start"] = min(found["start"], event["time"])
            found["nodes"].add(event.get("hostname") or event.get("node_id", "")[:12])
    ordered = [starts[a] for a in sorted(starts)]
    failures = [e for e in entry["events"] if e["kind"] in ("failure", "restart_in_place")]
    for i, attempt in enumerate(ordered):
        following = ordered[i + 1]["start"] if i + 1 < len(ordered) else entry["driver"]["ended"]
        ended_by = [e["time"] for e in failures if attempt["start"] <= e["time"] <= following]
        attempt["end"] = min(ended_by) if ended_by else following
    return ordered


def span(entries: list[dict[str, Any]]) -> list[str] | None:
    """The x range of both time charts: the first driver's start to the last one's end, so that a
    step rate lines up with the attempt and the failure above it."""
    if not entries:
        return None
    begin = min(e["driver"]["started"] for e in entries)
    end = max(e["driver"]["ended"] for e in entries)
    margin = max(1.0, (end - begin) * 0.02)
    return [_when(begin - margin), _when(end + margin)]


def timeline(entries: list[dict[str, Any]]):
    import plotly.graph_objects as go

    figure = go.Figure()
    for number, entry in enumerate(entries, 1):
        driver = entry["driver"]
        figure.add_trace(go.Bar(
            y=["drivers"], base=[_when(driver["started"])], x=[(driver["ended"] - driver["started"]) * 1000],
            orientation="h", marker_color="#c7c7c7", showlegend=False, name=f"driver {number}",
            text=[f"driver {number}: {entry['status']}"], textposition="inside", insidetextanchor="middle",
            hovertext=[f"driver {number} on {driver['host']} (pid {driver['pid']}): {entry['status']}"
                       + (f" — {_first_line(entry.get('error'))}" if entry.get("error") else "")],
            hoverinfo="text"))
        for attempt in attempts(entry):
            figure.add_trace(go.Bar(
                y=["attempts"], base=[_when(attempt["start"])], x=[(attempt["end"] - attempt["start"]) * 1000],
                orientation="h", marker_color="#aec7e8", marker_line_color="#1f77b4", marker_line_width=1,
                showlegend=False, text=[f"attempt {attempt['attempt']} · {attempt['world_size']} ranks"],
                textposition="inside", insidetextanchor="middle", hoverinfo="text",
                hovertext=[f"attempt {attempt['attempt']}: {attempt['world_size']} ranks on "
                           f"{', '.join(sorted(attempt['nodes']))}; {attempt['end'] - attempt['start']:.1f} s"]))
    shown: set[str] = set()
    for entry in entries:
        for event in entry["events"]:
            row = ROW_OF.get(event["kind"])
            if row is None:
                continue
            figure.add_trace(go.Scatter(
                x=[_when(event["time"])], y=[row], mode="markers", name=event["kind"].replace("_", " "),
                legendgroup=event["kind"], showlegend=event["kind"] not in shown, hoverinfo="text",
                hovertext=[f"{_when(event['time'])[11:19]} UTC — {describe_event(event)}"],
                marker={"size": 13, "color": COLOURS.get(event["kind"], "#333"),
                        "symbol": "x" if event["kind"] == "failure" else "diamond"}))
            shown.add(event["kind"])
    figure.update_layout(barmode="overlay", height=360, margin={"l": 90, "r": 20, "t": 40, "b": 40},
                         title="Time line (UTC)", xaxis={"type": "date", "range": span(entries)},
                         yaxis={"categoryorder": "array", "categoryarray": list(reversed(ROWS)), "range": [-0.5, 4.5]},
                         legend={"orientation": "h", "y": -0.15})
    return figure


def rank_rates(entries: list[dict[str, Any]]) -> dict[str, list[tuple[float, float | None]]]:
    """Each rank's (time, steps/s) over every driver; None between stretches breaks the line."""
    rates: dict[str, list[tuple[float, float | None]]] = {}
    for entry in entries:
        for rank, points in entry.get("step_series", {}).items():
            found = rates.setdefault(rank, [])
            if found:
                found.append((found[-1][0], None))
            found.extend(step_rates(points))
    return rates


def step_rate_figure(entries: list[dict[str, Any]]):
    import plotly.graph_objects as go

    rates = rank_rates(entries)
    figure = go.Figure()
    ranks = sorted((r for r in rates if any(v is not None for _, v in rates[r])), key=int)
    title = "Step rate by rank"
    if len(ranks) > DRAWN_RANKS:
        means = {r: statistics.fmean(v for _, v in rates[r] if v is not None) for r in ranks}
        ordered = sorted(ranks, key=means.get)
        ranks = sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]}, key=int)
        title = f"Step rate: the slowest, median and fastest of {len(ordered)} ranks"
    for rank in ranks:
        figure.add_trace(go.Scatter(
            x=[_when(t) for t, _ in rates[rank]], y=[v for _, v in rates[rank]], mode="lines+markers",
            name=f"rank {rank}", connectgaps=False, marker={"size": 4},
            hovertemplate=f"rank {rank}: %{{y:.2f}} steps/s at %{{x}}<extra></extra>"))
    if not ranks:
        figure.add_annotation(text=f"no rank trained for {SAMPLE_S:g} s on end between other phases: too short a run "
                                   "to draw a step rate", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    figure.update_layout(height=340, margin={"l": 90, "r": 20, "t": 40, "b": 40}, title=title,
                         xaxis={"type": "date", "range": span(entries)},
                         yaxis={"title": "optimizer steps / s", "rangemode": "tozero"})
    return figure


def goodput_totals(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Productive and lost seconds by cause, summed over every driver."""
    totals: dict[str, float] = {"productive": 0.0}
    for entry in entries:
        goodput = entry.get("goodput") or {}
        totals["productive"] += float(goodput.get("productive_s") or 0.0)
        for cause, seconds in (goodput.get("lost_s") or {}).items():
            totals[cause] = totals.get(cause, 0.0) + float(seconds or 0.0)
    return totals


def goodput_figure(entries: list[dict[str, Any]]):
    import plotly.graph_objects as go

    totals = goodput_totals(entries)
    wall = sum(totals.values()) or 1.0
    figure = go.Figure()
    for cause, seconds in totals.items():
        if seconds <= 0 and cause != "productive":
            continue
        figure.add_trace(go.Bar(
            x=[seconds], y=["wall time"], orientation="h", name=f"{cause.replace('_', ' ')} {seconds:.1f} s",
            marker_color="#2ca02c" if cause == "productive" else None, text=[f"{seconds / wall:.0%}"],
            textposition="inside", hovertemplate=f"{cause}: {seconds:.1f} s ({seconds / wall:.1%})<extra></extra>"))
    figure.update_layout(barmode="stack", height=220, margin={"l": 90, "r": 20, "t": 40, "b": 40},
                         title=f"Goodput: {totals['productive'] / wall:.1%} of {wall:.1f} s productive",
                         xaxis={"title": "seconds"}, legend={"orientation": "h", "y": -0.4})
    return figure


def page(name: str, run_uri: str, summary: dict[str, Any] | None, entries: list[dict[str, Any]],
         notes: list[str]) -> str:
    """The whole HTML page."""
    figures = [timeline(entries), step_rate_figure(entries), goodput_figure(entries)]
    charts = [f.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False},
                        div_id=f"chart-{kind}")
              for i, (f, kind) in enumerate(zip(figures, ("timeline", "step-rate", "goodput"), strict=True))]
    failures = [e for entry in entries for e in entry["events"]
                if e["kind"] in ("failure", "restart_in_place", "hang", "hang_collectives", "straggler")]
    rows = "".join(f"<tr><td>{_when(e['time'])[:19]}</td><td>{html.escape(e['kind'].replace('_', ' '))}</td>"
                   f"<td>{html.escape(describe_event(e))}</td></tr>" for e in failures)
    table = (f"<table><tr><th>UTC</th><th>what</th><th>detail</th></tr>{rows}</table>" if rows
             else "<p>No failure, restart or warning.</p>")
    facts = _facts(summary, entries)
    notes_html = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(name)}: run report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
h1 {{ margin-bottom: 4px; }} .uri {{ color: #666; font-family: monospace; }}
dl {{ display: grid; grid-template-columns: max-content auto; gap: 4px 16px; }} dt {{ font-weight: 600; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ddd; padding: 4px 8px; text-align: left; }}
.note {{ color: #a15c00; }}
</style></head><body>
<h1>{html.escape(name)}</h1><div class="uri">{html.escape(run_uri)}</div>
{notes_html}<dl>{facts}</dl>
{charts[0]}
<h2>Failures, restarts and warnings</h2>{table}
{charts[1]}
{charts[2]}
</body></html>
"""


def _facts(summary: dict[str, Any] | None, entries: list[dict[str, Any]]) -> str:
    summary = summary or {}
    totals = goodput_totals(entries)
    wall = sum(totals.values())
    facts = {
        "status": summary.get("status", entries[-1]["status"] if entries else "?"),
        "optimizer steps": summary.get("global_step", "?"),
        "world sizes": ", ".join(map(str, summary.get("world_sizes_seen") or [])) or "?",
        "drivers (starts of the run)": len(entries),
        "attempts": sum(len(attempts(entry)) for entry in entries),
        "checkpoints committed": sum(1 for entry in entries for e in entry["events"] if e["kind"] == "checkpoint"),
        "wall time": f"{wall:.1f} s" if wall else "?",
        "goodput": f"{totals['productive'] / wall:.1%}" if wall else "not measured",
    }
    if summary.get("slowest_rank"):
        slowest = summary["slowest_rank"]
        facts["slowest rank"] = (f"rank {slowest.get('rank')} on {slowest.get('host')}, "
                                 f"{float(slowest.get('ratio') or 0):.2f}x its peers' own work a step")
    if summary.get("error"):
        facts["error"] = _first_line(summary["error"], 500)
    return "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items())
