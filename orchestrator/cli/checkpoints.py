"""`orchestrator checkpoints NAME_OR_RUN_DIR [--storage URI] [--verify]`."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_FAILED, EXIT_OK


def add(commands) -> None:
    ckpts = commands.add_parser("checkpoints", help="list a run's checkpoints and their status")
    ckpts.add_argument("run", help="run name (under --storage) or run directory / URI")
    ckpts.add_argument("--storage", help="where run directories live (default ~/orchestrator-runs)")
    ckpts.add_argument("--verify", action="store_true", help="re-check every file's sha256")
    ckpts.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.cli.checkpoint_table import show

    text, infos = show(args.run, storage_uri=args.storage, verify=args.verify)
    print(text)
    # With --verify, a damaged checkpoint is worth a non-zero exit for scripts.
    return EXIT_FAILED if args.verify and any(i.status not in ("committed", "superseded") for i in infos) else EXIT_OK
