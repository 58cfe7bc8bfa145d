"""`orchestrator up [--num-cpus N] [--no-dashboard] [--token]` / `orchestrator down`: the warm local cluster."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_OK
from orchestrator.errors import UserError


def add(commands) -> None:
    up = commands.add_parser("up", help="start a warm local Ray cluster that `orchestrator run` uses until `down`")
    up.add_argument("--num-cpus", type=int, help="CPUs it offers (default: the machine's)")
    up.add_argument("--no-dashboard", dest="dashboard", action="store_false",
                    help="start it without Ray's dashboard (and Jobs API): a little less memory and CPU")
    up.add_argument("--token", action="store_true",
                    help="print the running warm cluster's token alone (for its dashboard and `ray job submit`)")
    down = commands.add_parser("down", help="stop the warm local cluster of `orchestrator up`, leaving nothing behind")
    up.set_defaults(handle=handle)
    down.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.cluster import warm

    if args.command == "up" and args.token:
        cluster = warm.current()
        if cluster is None:
            raise UserError("no warm local cluster is up, so there is no token to print. Fix: `orchestrator up` first.")
        print(cluster.token)
    elif args.command == "up":
        cluster, started = warm.up(args.num_cpus, dashboard=args.dashboard)
        print(f"warm local cluster {'up' if started else 'already up'} at {cluster.address} (session "
              f"{cluster.session_dir}): `orchestrator run` without --address uses it; `orchestrator down` stops it")
        if cluster.dashboard:
            print(f"dashboard: {cluster.dashboard} (Ray asks for the cluster's token: `orchestrator up --token` "
                  "prints it); submit jobs with\n  RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(orchestrator up --token) "
                  f"ray job submit --address {cluster.dashboard} -- orchestrator run SPEC")
    else:
        stopped = warm.down()
        print(f"warm local cluster at {stopped.address} stopped; its processes and files are gone" if stopped
              else "no warm local cluster is up")
    return EXIT_OK
