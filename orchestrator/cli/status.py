"""`orchestrator status [NAME] [--storage URI] [--json]`."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_OK


def add(commands) -> None:
    status = commands.add_parser("status", help="list runs: state, step, newest checkpoint, restarts, goodput")
    status.add_argument("run", nargs="?", help="one run's name (default: every run under --storage)")
    status.add_argument("--storage", help="where run directories live (default ~/orchestrator-runs)")
    status.add_argument("--json", action="store_true", help="print JSON records, for scripts")
    status.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.cli.run_states import as_json, run_states, table

    records = run_states(args.storage, args.run)
    print(as_json(records) if args.json else table(records))
    return EXIT_OK
