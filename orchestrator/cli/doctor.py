"""`orchestrator doctor [SPEC] [--address ADDR] [--storage URI] [--set ...] [--check-gloo] [--nodes]
[--strict] [--slow-below FRACTION]`."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_FAILED, EXIT_OK
from orchestrator.cli.doctor_report import SLOW_BELOW
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
    doctor.add_argument("--nodes", dest="node_health", action="store_true",
                        help="also measure every node against its peers: matmul throughput on its CPUs or each GPU, "
                             "and its links in pairs; a node below --slow-below of its peers' median is named")
    doctor.add_argument("--strict", action="store_true",
                        help="fail (exit 1) on a warning too, such as a slow node: a gate before a launch")
    doctor.add_argument("--slow-below", dest="slow_below", type=_fraction, default=SLOW_BELOW, metavar="FRACTION",
                        help=f"with --nodes: name a node below this fraction of its peers' median "
                             f"(default {SLOW_BELOW})")
    doctor.set_defaults(handle=handle)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction between 0 and 1 (e.g. 0.7: below 70% of "
                                         "its peers' median)")
    return value


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
    report = diagnose(spec, args.address, storage_uri=args.storage, check_gloo=args.check_gloo,
                      node_health=args.node_health, strict=args.strict, slow_below=args.slow_below)
    print(report.text())
    return EXIT_OK if report.ok else EXIT_FAILED
