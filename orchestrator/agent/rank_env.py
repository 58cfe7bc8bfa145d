"""The environment every rank starts with, whatever its kind: one recipe, used by the agent's
launchers at each attempt (rank_start.py, session_ranks.py) and by a local run's command for its
first ranks, started before their attempt is known (driver/local.py `first_spares`): a rank made
from a spare imports under the environment its attempt gives, by construction.

The environment is torchrun's, built from the Ray worker's (the agent's) without Ray's own
variables: a rank has no Ray in it, and must not be handed the cluster's address or its auth
token (RAY_AUTH_TOKEN, on a cluster with token auth). What the user's shell had in front of a
script's command (NCCL_*, TORCH_*, GLOO_*, OMP_NUM_THREADS) and the spec's `env:` come on top. On
Ray the spec's `env:` reaches the agent in its config, not in Ray's runtime environment (which
Ray logs and shows: cluster/connection.py); `take_job_env` sets it in the agent's own process.

What differs by kind is said once, in `Rules`: a rank's threads, and whether the user's choice
of buffering stands. Importing this module imports no torch (a local run's command starts its
first ranks before it imports torch itself).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.agent.children import RAY_TRAIN_VARS
from orchestrator.rank.agent_contract import NICENESS_VAR
from orchestrator.spec import JobSpec

# Variables of the Ray worker a rank never gets: Ray's own.
RAY_VARS_PREFIX = "RAY_"
THREADS = "OMP_NUM_THREADS"
UNBUFFERED = "PYTHONUNBUFFERED"


def torchrun_threads(agent_threads: str | None, local_world_size: int) -> str | None:
    """torchrun's rule: one thread a rank where a node runs more than one, else the library's own
    default (not Ray's count for its worker, which the rank is not)."""
    return "1" if local_world_size > 1 else None


def share_of_agents(agent_threads: str | None, local_world_size: int) -> str | None:
    """Ray Train's rule for its workers (their CPUs), shared by the worker's ranks: a rank computes
    with the same threads whether its peers are on its agent or another. None: the agent has no count."""
    if agent_threads is None:
        return None
    return str(max(1, int(agent_threads) // local_world_size))


def local_agent_env(job: JobSpec, environ: Mapping[str, str], worker_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a local run's agent's process gets: a Ray worker's (`worker_env`), and the
    threads Ray would give the one agent that holds every worker's ranks (their CPUs), which its
    ctx or Lightning ranks share (`share_of_agents`), so that each computes with the threads it has
    on Ray. No threads for a script (its ranks follow torchrun's rule), nor where the user set them
    (in the shell, `environ`, or the job's env)."""
    env = dict(worker_env)
    if job.script is None and THREADS not in environ and THREADS not in job.env:
        cpus = float(job.scaling.resources_per_worker.get("CPU", 1.0)) * job.scaling.num_workers
        env[THREADS] = str(max(1, int(cpus)))
    return env


@dataclass(frozen=True)
class Rules:
    """What a kind of rank's environment differs in."""

    # A rank's OMP_NUM_THREADS where the user set none: from the agent's and the node's rank count.
    threads: Callable[[str | None, int], str | None]
    # Whether a PYTHONUNBUFFERED of the user's stands (a script's). A ctx or Lightning rank's output
    # is always unbuffered: a spare takes it at its handover (rank/spare.py), a killed rank's last
    # lines would be lost otherwise.
    users_buffering: bool


SCRIPT = Rules(torchrun_threads, users_buffering=True)
SESSION = Rules(share_of_agents, users_buffering=False)


def rank_env(rules: Rules, environ: Mapping[str, str], job_env: Mapping[str, str], local_world_size: int,
             shell: Mapping[str, str] | None = None, niceness: int | None = None,
             extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A rank's environment, whatever its attempt: the agent's `environ` without Ray's variables,
    the user's `shell` (a script's) and the `job_env` on top, its threads, `extra` (the launcher's
    own variables), its `niceness` (the user's shell's, which Ray's workers do not run at: 15;
    None: its parent's), and unbuffered output."""
    shell = shell or {}
    env = {**without_ray(environ), **shell, **job_env}
    if THREADS not in shell and THREADS not in job_env:
        threads = rules.threads(environ.get(THREADS), local_world_size)
        if threads is not None:
            env[THREADS] = threads
    env.update(extra or {})
    if niceness is not None:
        env[NICENESS_VAR] = str(niceness)
    # Through a pipe Python would buffer the rank's prints: rank 0's are shown live, and a killed
    # rank's last lines reach its log.
    if rules.users_buffering:
        env.setdefault(UNBUFFERED, "1")
    else:
        env[UNBUFFERED] = "1"
    return env


def without_ray(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment for a rank: no Ray variable (the cluster's address, its auth
    token), and none of Ray Train's process-group variables (the rank gets torchrun's)."""
    return {k: v for k, v in environ.items() if k not in RAY_TRAIN_VARS and not k.startswith(RAY_VARS_PREFIX)}


def take_job_env(env: Mapping[str, str]) -> None:
    """The spec's `env:` in this agent's own process (a Ray Train worker), before it does anything:
    what it does itself (its storage, with credentials from the environment) sees it, as its ranks
    do. Python's tempfile keeps the folder it found at its first use: forgotten, so that a TMPDIR
    of the spec's holds for the agent's scratch too."""
    os.environ.update(env)
    if "TMPDIR" in env:
        tempfile.tempdir = None
