"""`orchestrator doctor [SPEC] [--address ADDR] [--storage URI] [--set ...] [--check-gloo]`."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_FAILED, EXIT_OK
from orchestrator.errors import UserError


def add(commands) -> None:
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
    doctor.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.spec import parse_set_option, resolve_spec

    spec = None
    if args.spec:
        spec = resolve_spec(args.spec, dict(parse_set_option(option) for option in args.overrides))
    elif args.overrides:
        raise UserError("--set needs a job spec to override. Fix: `orchestrator doctor SPEC --set KEY=VALUE`.")
    from orchestrator.cli.doctor_checks import diagnose
    from orchestrator.cluster import connection as cluster

    cluster.check_address(args.address)
    report = diagnose(spec, args.address, storage_uri=args.storage, check_gloo=args.check_gloo)
    print(report.text())
    return EXIT_OK if report.ok else EXIT_FAILED
