"""`orchestrator report NAME_OR_RUN_DIR [--storage URI] [--output PATH]`: the run drawn as one
self-contained HTML page (cli/report_page.py), written into the run directory by default."""

from __future__ import annotations

import argparse
import json

from orchestrator.cli.common import EXIT_OK
from orchestrator.errors import UserError

REPORT_NAME = "report.html"


def add(commands) -> None:
    report = commands.add_parser("report", help="draw a run as one HTML page: its attempts, failures, checkpoints, "
                                                "each rank's step rate and its goodput")
    report.add_argument("run", help="run name (under --storage) or run directory / URI")
    report.add_argument("--storage", help="where run directories live (default ~/orchestrator-runs)")
    report.add_argument("--output", help=f"where to write the page (default: <run>/{REPORT_NAME})")
    report.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator import storage
    from orchestrator.cli.checkpoint_table import locate_run
    from orchestrator.observe import history
    from orchestrator.observe.result import SUMMARY_NAME

    try:
        import plotly  # noqa: F401 - the optional extra the page is drawn with

        from orchestrator.cli import report_page
    except ImportError as exc:
        raise UserError(f"`orchestrator report` draws with plotly, which is not installed here ({exc}). Fix: "
                        "pip install 'orchestrator[report]' (or pip install plotly), then run it again.") from None
    run = locate_run(args.run, args.storage)
    entries, unreadable = history.load(run)
    summary = None
    try:
        summary = json.loads(storage.read_bytes(run.join(SUMMARY_NAME)))
    except FileNotFoundError:
        pass
    except ValueError as exc:
        unreadable.append(f"{SUMMARY_NAME}: {exc}")
    if not entries and summary is None:
        raise UserError(f"{run.uri} holds no run to report: neither {history.HISTORY_DIR}/ nor {SUMMARY_NAME} is "
                        "there. Fix: give the run's name with the --storage it ran under, or its run directory (see "
                        "`orchestrator status --storage URI`).")
    notes = [f"could not read {item}" for item in unreadable]
    if not entries:
        notes.append(f"no history in {history.HISTORY_DIR}/ (the run predates it, or its driver was killed "
                     "outright): only summary.json's figures are shown")
    name = (summary or {}).get("name") or run.uri.rstrip("/").rsplit("/", 1)[-1]
    text = report_page.page(name, run.uri, summary, entries, notes).encode()
    target = storage.resolve(args.output) if args.output else run.join(REPORT_NAME)
    storage.write_atomic(target, text)
    drivers = f"{len(entries)} driver(s)" if entries else "summary.json only"
    print(f"report: {target.uri} ({len(text) / 1e6:.1f} MB, {drivers}); open it in a browser")
    return EXIT_OK
