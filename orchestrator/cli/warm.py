"""`orchestrator up [--num-cpus N]` / `orchestrator down`: the warm local cluster."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_OK


def add(commands) -> None:
    up = commands.add_parser("up", help="start a warm local Ray cluster that `orchestrator run` uses until `down`")
    up.add_argument("--num-cpus", type=int, help="CPUs it offers (default: the machine's)")
    down = commands.add_parser("down", help="stop the warm local cluster of `orchestrator up`, leaving nothing behind")
    up.set_defaults(handle=handle)
    down.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.cluster import warm

    if args.command == "up":
        cluster, started = warm.up(args.num_cpus)
        print(f"warm local cluster {'up' if started else 'already up'} at {cluster.address} (session "
              f"{cluster.session_dir}): `orchestrator run` without --address uses it; `orchestrator down` stops it")
    else:
        stopped = warm.down()
        print(f"warm local cluster at {stopped.address} stopped; its processes and files are gone" if stopped
              else "no warm local cluster is up")
    return EXIT_OK
