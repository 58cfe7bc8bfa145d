"""`orchestrator run SPEC [...]`. Exit codes: 0 success, 1 training failed, 2 user error,
130 / 143 stopped by SIGINT / SIGTERM (the next run resumes from the newest checkpoint).

`main` is the command line's: after a finished or stopped `run` it ends the process itself
(os._exit), so call `orchestrator.run` from Python instead.

User errors print one paragraph and no traceback; so do training failures (the worker logs
hold the full traceback).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

from orchestrator.errors import OrchestratorError, RunStopped, TrainingFailed, UserError
from orchestrator.loopback import keep_ray_on_loopback
from orchestrator.signals import EXIT_CODES, job_stop_note

EXIT_OK, EXIT_FAILED, EXIT_USER_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own mistakes are user errors too: exit 2, no traceback
        self.print_usage(sys.stderr)
        raise UserError(f"{message}. Fix: see `{self.prog} --help`.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="orchestrator", description="Elastic training on Ray from one job spec.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="train a job spec")
    run.add_argument("spec", nargs="?", help="path to a YAML job spec (optional with --lightning-config)")
    run.add_argument("--lightning-config", dest="lightning_config", metavar="PATH",
                     help="a LightningCLI config file (model, data, trainer): the spec's Lightning section; "
                          "without SPEC the run is named after the file")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a spec field, e.g. --set scaling.num_workers=4 (repeatable)")
    run.add_argument("--address", help="Ray cluster address; default: RAY_ADDRESS, else an embedded local cluster")
    run.add_argument("--storage", help="where run directories live (overrides the spec's storage)")
    run.add_argument("--resume-from", dest="resume_from", help="latest | none | <checkpoint URI>")
    run.add_argument("--overwrite", action="store_true",
                     help="with --resume-from none: delete the run's existing checkpoints first")

    ckpts = commands.add_parser("checkpoints", help="list a run's checkpoints and their status")
    ckpts.add_argument("run", help="run name (under --storage) or run directory / URI")
    ckpts.add_argument("--storage", help="where run directories live (default ~/orchestrator-runs)")
    ckpts.add_argument("--verify", action="store_true", help="re-check every file's sha256")
    commands.add_parser("schema", help="print the JSON Schema of the job spec (for editors: "
                                       "# yaml-language-server: $schema=spec.schema.json)")

    status = commands.add_parser("status", help="list runs: state, step, newest checkpoint, restarts, goodput")
    status.add_argument("run", nargs="?", help="one run's name (default: every run under --storage)")
    status.add_argument("--storage", help="where run directories live (default ~/orchestrator-runs)")
    status.add_argument("--json", action="store_true", help="print JSON records, for scripts")

    up = commands.add_parser("up", help="start a warm local Ray cluster that `orchestrator run` uses until `down`")
    up.add_argument("--num-cpus", type=int, help="CPUs it offers (default: the machine's)")
    commands.add_parser("down", help="stop the warm local cluster of `orchestrator up`, leaving nothing behind")

    doctor = commands.add_parser("doctor", help="check the cluster before a run: versions, storage, capacity, "
                                                "network interfaces, an all-reduce across the nodes")
    doctor.add_argument("spec", nargs="?", help="a job spec: also check its storage and that its workers fit")
    doctor.add_argument("--address", help="Ray cluster address; default: RAY_ADDRESS, else an embedded local cluster")
    doctor.add_argument("--storage", help="storage to check (overrides the spec's storage)")
    doctor.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, e.g. --set scaling.num_workers=8 (repeatable)")
    doctor.add_argument("--check-gloo", dest="check_gloo", action="store_true",
                        help="also check that a separate gloo group forms between the nodes, as the orchestrator's "
                             "coordination does beside NCCL (always checked when the spec uses GPUs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("run", "doctor"):  # before anything imports Ray
            keep_ray_on_loopback(args.address)
        if args.command == "run":
            return _run(args)
        if args.command == "checkpoints":
            return _checkpoints(args)
        if args.command == "status":
            return _status(args)
        if args.command in ("up", "down"):
            return _warm(args)
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "schema":
            from orchestrator.spec_schema import schema_text

            print(schema_text(), end="")
            return EXIT_OK
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunStopped as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return EXIT_CODES.get(exc.signal_name, 130)
    except TrainingFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted; the newest committed checkpoint is kept and the next run resumes from it", file=sys.stderr)
        return 130
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from orchestrator.spec import parse_set_option, resolve_spec

    overrides = dict(parse_set_option(option) for option in args.overrides)
    if args.storage:
        overrides["storage"] = args.storage
    if args.resume_from:
        overrides["resume_from"] = args.resume_from
    if args.lightning_config:
        overrides["lightning.config"] = args.lightning_config
    spec = resolve_spec(_spec_source(args), overrides)  # validate before paying for Ray start-up
    note = job_stop_note()  # under `ray job submit`: how long `ray job stop` leaves for a last checkpoint
    if note:
        print(note, flush=True)

    from orchestrator.launch import run

    try:
        run(spec, address=args.address, overwrite=args.overwrite, _process_exits=True)
    except RunStopped as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        code = EXIT_CODES.get(exc.signal_name, 130)
    else:
        code = EXIT_OK
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


def _warm(args: argparse.Namespace) -> int:
    from orchestrator import warm

    if args.command == "up":
        cluster, started = warm.up(args.num_cpus)
        print(f"warm local cluster {'up' if started else 'already up'} at {cluster.address} (session "
              f"{cluster.session_dir}): `orchestrator run` without --address uses it; `orchestrator down` stops it")
    else:
        stopped = warm.down()
        print(f"warm local cluster at {stopped.address} stopped; its processes and files are gone" if stopped
              else "no warm local cluster is up")
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    from orchestrator.spec import parse_set_option, resolve_spec

    spec = None
    if args.spec:
        spec = resolve_spec(args.spec, dict(parse_set_option(option) for option in args.overrides))
    elif args.overrides:
        raise UserError("--set needs a job spec to override. Fix: `orchestrator doctor SPEC --set KEY=VALUE`.")
    from orchestrator import cluster
    from orchestrator.doctor import diagnose

    cluster.check_address(args.address)
    report = diagnose(spec, args.address, storage_uri=args.storage, check_gloo=args.check_gloo)
    print(report.text())
    return EXIT_OK if report.ok else EXIT_FAILED


def _status(args: argparse.Namespace) -> int:
    from orchestrator.run_status import as_json, run_states, table

    records = run_states(args.storage, args.run)
    print(as_json(records) if args.json else table(records))
    return EXIT_OK


def _checkpoints(args: argparse.Namespace) -> int:
    from orchestrator.inspect_checkpoints import show

    text, infos = show(args.run, storage_uri=args.storage, verify=args.verify)
    print(text)
    # With --verify, a damaged checkpoint is worth a non-zero exit for scripts.
    return EXIT_FAILED if args.verify and any(i.status not in ("committed", "superseded") for i in infos) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
