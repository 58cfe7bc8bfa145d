"""`orchestrator run SPEC [--set KEY=VALUE]... [--address ADDR] [--storage URI] [--resume-from ...]`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

from orchestrator.cli.common import EXIT_OK, add_mode_options
from orchestrator.driver.signals import EXIT_CODES, job_stop_note
from orchestrator.errors import RunStopped, UserError


def add(commands) -> None:
    run = commands.add_parser("run", help="train a job spec")
    run.add_argument("spec", nargs="?", help="path to a YAML job spec (optional with --lightning-config)")
    run.add_argument("--lightning-config", dest="lightning_config", metavar="PATH",
                     help="a LightningCLI config file (model, data, trainer): the spec's Lightning section; "
                          "without SPEC the run is named after the file")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a spec field, e.g. --set scaling.num_workers=4 (repeatable)")
    run.add_argument("--address", help="Ray cluster address; default: RAY_ADDRESS, else the warm cluster if up, "
                          "else local mode (one node) or an embedded cluster")
    add_mode_options(run)
    run.add_argument("--storage", help="where run directories live (overrides the spec's storage)")
    run.add_argument("--resume-from", dest="resume_from", help="latest | none | <checkpoint URI>")
    run.add_argument("--overwrite", action="store_true",
                     help="with --resume-from none: delete the run's existing checkpoints first")
    run.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.spec import parse_set_option, resolve_spec

    overrides = dict(parse_set_option(option) for option in args.overrides)
    if args.storage:
        overrides["storage"] = args.storage
    if args.resume_from:
        overrides["resume_from"] = args.resume_from
    if args.lightning_config:
        overrides["lightning.config"] = args.lightning_config
    read = resolve_spec(_spec_source(args), overrides, read_only=True)
    refuse_a_second_driver(read)
    note = job_stop_note()  # under `ray job submit`: how long `ray job stop` leaves for a last checkpoint
    if note:
        print(note, flush=True)
    from orchestrator.driver import local

    # A local run's first ranks start importing torch and Lightning now, before this process does
    # (the driver, then the spec's validation in `run`, before Ray starts if it does).
    started = local.start(read, args.address, args.mode)
    from orchestrator.driver.launch import run

    try:
        run(_spec_source(args), address=args.address, mode=args.mode, overwrite=args.overwrite, _process_exits=True,
            _started=started, **overrides)
    except RunStopped as exc:
        return finish_process(exc)
    return finish_process(None)


def refuse_a_second_driver(read) -> None:
    """A live driver of the same run on this host refuses this one at once, before torch, Lightning
    or the job's own modules are imported (the lease judges any other holder, in `run`)."""
    from orchestrator.checkpoint.lease import refuse_if_held_here
    from orchestrator.run_dir import RunDir

    refuse_if_held_here(RunDir.of(read.storage, read.name))


def finish_process(stopped: RunStopped | None) -> int:
    """End the process after a finished (None) or stopped run, with its exit code."""
    code = EXIT_OK
    if stopped is not None:
        print(f"stopped: {stopped}", file=sys.stderr)
        code = EXIT_CODES.get(stopped.signal_name, 130)
    # Finished or stopped, summary written, lease released, Ray left (an embedded cluster's
    # processes ended): leave now. The interpreter's own teardown took 1.6 s after a stop here,
    # time `ray job stop` may not give, and Ray's exit handlers would wait on the cluster just ended.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _spec_source(args: argparse.Namespace):
    """The spec file, or with only --lightning-config a spec named after that file."""
    if args.spec:
        return args.spec
    if not args.lightning_config:
        raise UserError("orchestrator run needs a job spec, a LightningCLI config, or both. Fix: "
                        "`orchestrator run SPEC.yaml` or `orchestrator run --lightning-config config.yaml`.")
    stem = os.path.splitext(os.path.basename(args.lightning_config))[0]
    return {"name": re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-") or "lightning-run", "lightning": {}}


