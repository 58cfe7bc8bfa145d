"""`orchestrator torchrun [OPTIONS] (SCRIPT | -m MODULE) [SCRIPT_ARGS...]`: a torchrun command with
one word changed. torchrun's flags keep their meaning (both spellings, `--nproc_per_node` and
`--nproc-per-node`); its rendezvous flags are accepted and ignored, since Ray places the ranks and
gives them MASTER_ADDR/MASTER_PORT. Everything after SCRIPT goes to the script untouched.
The command writes a spec with a `script:` section and runs it as `orchestrator run` would."""

from __future__ import annotations

import argparse
import re

from orchestrator.cli.common import add_mode_options
from orchestrator.errors import UserError
from orchestrator.spec.script import default_run_name

# torchrun's rendezvous flags: Ray does the rendezvous, so their values do not matter here.
RENDEZVOUS_FLAGS = ("rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "master_addr", "master_port",
                    "node_rank", "local_addr", "rdzv_timeout")


def _spellings(name: str) -> list[str]:
    return list(dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"]))


def add(commands) -> None:
    cmd = commands.add_parser(
        "torchrun", help="run an unmodified torchrun script on Ray: `torchrun ARGS` -> `orchestrator torchrun ARGS`",
        description="Run a torchrun-style training script unchanged: N nodes x K ranks placed by Ray, each node's "
                    "ranks supervised and restarted in place, hangs caught, logs in <storage>/<name>/logs.")
    cmd.add_argument(*_spellings("nnodes"), dest="nnodes", default="1", metavar="N|MIN:MAX",
                     help="nodes (one Ray Train worker each); MIN:MAX is elastic (default 1)")
    cmd.add_argument(*_spellings("nproc_per_node"), dest="nproc_per_node", default="1", metavar="K",
                     help="ranks per node (default 1)")
    cmd.add_argument(*_spellings("max_restarts"), dest="max_restarts", type=int, default=None, metavar="R",
                     help="restarts (in place, or of a lost node) before the run fails (default: "
                          "failure.max_failures, 3; -1: unlimited)")
    cmd.add_argument("--name", help="the run's name: <storage>/<name>/ (default: the script's name and 8 hex digits of "
                                    "a hash of its real path, e.g. train-1a2b3c4d, printed at the start; the same "
                                    "script resumes the same run)")
    cmd.add_argument("--storage", help="where run directories live (default ~/orchestrator-runs)")
    cmd.add_argument("--address", help="Ray cluster address; default: RAY_ADDRESS, else the warm cluster if up, "
                          "else local mode (one node) or an embedded cluster")
    add_mode_options(cmd)
    cmd.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="an environment variable for every rank (repeatable)")
    cmd.add_argument("--gpu", action="store_true", help="give each rank one GPU of its node (NCCL scripts)")
    cmd.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="any other spec field, e.g. --set failure.hang_timeout_s=120 (repeatable)")
    cmd.add_argument("-m", *_spellings("module"), dest="module", action="store_true",
                     help="SCRIPT is a module, run as with `python -m`")
    cmd.add_argument("--no-python", "--no_python", dest="no_python", action="store_true", help=argparse.SUPPRESS)
    cmd.add_argument("--standalone", action="store_true", help="accepted and ignored (Ray does the rendezvous)")
    for flag in RENDEZVOUS_FLAGS:
        cmd.add_argument(*_spellings(flag), dest=flag, default=None, help=argparse.SUPPRESS)
    # Optional to argparse only so that a missing one gets our message (argparse's would call the
    # script's own arguments required too); spec_from_args refuses it.
    cmd.add_argument("script", metavar="SCRIPT", nargs="?", help="the training script (or module, with -m)")
    cmd.add_argument("script_args", nargs=argparse.REMAINDER, metavar="SCRIPT_ARGS",
                     help="the script's own arguments, untouched; {run_dir}, {name} and {storage} are filled in")
    cmd.set_defaults(handle=handle)


def spec_from_args(args: argparse.Namespace) -> dict:
    """The job spec a torchrun command stands for (validated later, like any spec)."""
    if args.no_python:
        raise UserError("--no-python is not supported: the ranks run a Python script (or -m module) under a "
                        "small bootstrap that reports their progress and errors. Fix: name the Python script.")
    if args.script is None:
        raise UserError("no training script was given. Fix: name it after the flags, as with torchrun: "
                        "`orchestrator torchrun --nproc_per_node 2 train.py [SCRIPT_ARGS...]` "
                        "(or `-m package.module`).")
    nproc = _count(args.nproc_per_node, "--nproc_per_node")
    nodes = _nodes(args.nnodes)
    target = {"module": args.script} if args.module else {"path": args.script}
    name = args.name or default_run_name(**target).name
    spec: dict = {"name": name, "script": {**target, "args": list(args.script_args), "nproc_per_node": nproc},
                  "scaling": {"num_workers": nodes, "use_gpu": bool(args.gpu)},
                  "env": dict(_pair(item, "--env") for item in args.env)}
    if args.storage:
        spec["storage"] = args.storage
    if args.max_restarts is not None:
        spec["failure"] = {"max_failures": args.max_restarts}
    return spec


def handle(args: argparse.Namespace) -> int:
    from orchestrator.cli.run import finish_process, refuse_a_second_driver
    from orchestrator.driver.signals import job_stop_note
    from orchestrator.errors import RunStopped
    from orchestrator.spec import parse_set_option, resolve_spec

    ignored = [f"--{flag}" for flag in RENDEZVOUS_FLAGS if getattr(args, flag) is not None]
    ignored += ["--standalone"] if args.standalone else []
    if ignored:
        print(f"note: {', '.join(ignored)} ignored: Ray places the ranks and does the rendezvous (each start gets "
              "its own MASTER_ADDR and MASTER_PORT)", flush=True)
    overrides = dict(parse_set_option(option) for option in args.overrides)
    refuse_a_second_driver(resolve_spec(spec_from_args(args), overrides, read_only=True))
    spec = resolve_spec(spec_from_args(args), overrides)  # a missing script or a bad flag: exit 2 here
    if args.name is None and "name" not in overrides:
        print(name_note(args, spec.name), flush=True)
    note = job_stop_note()
    if note:
        print(note, flush=True)

    from orchestrator.driver.launch import run

    try:
        run(spec, address=args.address, mode=args.mode, _process_exits=True)
    except RunStopped as exc:
        return finish_process(exc)
    return finish_process(None)


def name_note(args: argparse.Namespace, name: str) -> str:
    """The line that says which run a command without --name trains, so that it can be found and named again."""
    default = default_run_name(**({"module": args.script} if args.module else {"path": args.script}))
    shared = ("; any job with the same path in its working_dir gets it too, so give each project its own --name"
              if default.in_ray_job else "")
    return (f"run name: {name} (the script's name and a hash of {default.source}: a re-run of the same script "
            f"resumes it{shared}; --name {name} keeps it if the script moves, --name NAME chooses another)")


def _count(value: str, flag: str) -> int:
    if not re.fullmatch(r"\d+", str(value)) or int(value) < 1:
        raise UserError(f"{flag} {value!r} is not a number of processes. Fix: give a whole number >= 1, e.g. "
                        f"{flag} 2 (one rank per GPU on a GPU node, with --gpu).")
    return int(value)


def _nodes(value: str) -> int | list[int]:
    match = re.fullmatch(r"(\d+)(?::(\d+))?", str(value))
    if not match or int(match[1]) < 1 or (match[2] and int(match[2]) < int(match[1])):
        raise UserError(f"--nnodes {value!r} is neither a number of nodes nor MIN:MAX. Fix: e.g. --nnodes 2, or "
                        "--nnodes 1:4 for an elastic run of 1 to 4 nodes.")
    low, high = int(match[1]), int(match[2] or match[1])
    return low if low == high else [low, high]


def _pair(item: str, flag: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise UserError(f"{flag} {item!r} is not KEY=VALUE. Fix: e.g. {flag} NCCL_DEBUG=INFO.")
    return key, value
