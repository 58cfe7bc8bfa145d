"""The command line: `orchestrator COMMAND ...`, one module per command.

Exit codes: 0 success, 1 training failed, 2 user error, 130 / 143 stopped by SIGINT / SIGTERM (the
next run resumes from the newest checkpoint). User errors print one paragraph and no traceback; so
do training failures (the worker logs hold the full traceback). `main` is the command line's: after
a finished or stopped `run` it ends the process itself (os._exit), so call `orchestrator.run` from
Python instead. Nothing here imports Ray or torch before a command needs them.

    run.py, torchrun.py, status.py, checkpoints.py, doctor.py, report.py, warm.py, schema.py
                        one module per command
    common.py           what every command shares: exit codes, a parser whose mistakes are user errors
    checkpoint_table.py a run's checkpoints and whether they are whole (checkpoints, doctor)
    run_states.py       the runs under a storage location (status)
    doctor_checks.py    doctor's preflight checks, from the command's process
    doctor_nodes.py     doctor --nodes: each node's health against its peers
    doctor_probes.py    what doctor runs on the cluster's nodes
    doctor_report.py    what doctor prints
    report_page.py      the page `orchestrator report` writes
"""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli import checkpoints, doctor, report, run, schema, status, torchrun, warm
from orchestrator.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USER_ERROR, Parser
from orchestrator.cluster.environment import keep_ray_on_loopback
from orchestrator.driver.signals import EXIT_CODES
from orchestrator.errors import OrchestratorError, RunStopped, TrainingFailed, UserError

COMMANDS = (run, torchrun, checkpoints, schema, status, report, warm, doctor)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="orchestrator", description="Elastic training on Ray from one job spec.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("run", "torchrun", "doctor"):
            keep_ray_on_loopback(args.address)  # before anything imports Ray
        return args.handle(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunStopped as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return EXIT_CODES.get(exc.signal_name, 130)
    except (TrainingFailed, OrchestratorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted; the newest committed checkpoint is kept and the next run resumes from it", file=sys.stderr)
        return 130


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USER_ERROR", "build_parser", "main"]
