"""What a rank is started with: its command, its directory and its environment (a torchrun
script's: RankStart; a ctx or Lightning rank's: session_command, session_env).

The environment is torchrun's, built from the Ray worker's (the agent's) without Ray's own
variables: a rank has no Ray in it, and must not be handed the cluster's address or its auth
token (RAY_AUTH_TOKEN, on a cluster with token auth). What the user's shell had in front of the
command (NCCL_*, TORCH_*, GLOO_*, OMP_NUM_THREADS) and the spec's `env:` come on top. On Ray
the spec's `env:` reaches the agent in its config, not in Ray's runtime environment (which Ray
logs and shows: cluster/connection.py); `take_job_env` sets it in the agent's own process.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Mapping

from orchestrator.agent.children import RAY_TRAIN_VARS, Placement
from orchestrator.rank.agent_contract import NICENESS_VAR
from orchestrator.run_dir import RunDir
from orchestrator.spec import JobSpec
from orchestrator.worker_config import ScriptContext

# Variables of the Ray worker a rank never gets: Ray's own.
RAY_VARS_PREFIX = "RAY_"


class RankStart:
    def __init__(self, spec: JobSpec, script_context: ScriptContext, run_dir: RunDir):
        self.spec, self.script, self.context, self.run_dir = spec, spec.script, script_context, run_dir

    def command(self) -> list[str]:
        """The script and its arguments, with {run_dir}, {name} and {storage} filled in."""
        values = {"{run_dir}": self.run_dir_text(), "{name}": self.spec.name, "{storage}": self.storage_text()}
        args = []
        for arg in self.script.args:
            for key, value in values.items():
                arg = arg.replace(key, value)
            args.append(arg)
        target = ["-m", self.script.module] if self.script.module else [self.script_path()]
        return [*target, *args]

    def run_dir_text(self) -> str:
        location = self.run_dir.location
        return location.path if location.is_local else location.uri

    def storage_text(self) -> str:
        """The run directory's parent, as the driver resolved it: a local storage absolute and
        ~-expanded (`~/orchestrator-runs` as written would be a folder named `~` in the script's
        directory), an object store's URI as the spec gives it."""
        location = self.run_dir.location
        return posixpath.dirname(location.path) if location.is_local else self.spec.storage

    def cwd(self) -> str:
        """The driver's directory where this node has it (a shared checkout), else this worker's."""
        wanted = self.context.cwd
        return wanted if wanted and os.path.isdir(wanted) else os.getcwd()

    def script_path(self) -> str:
        path = os.path.expanduser(self.script.path)
        if os.path.isabs(path):
            return path
        for base in (self.cwd(), os.getcwd()):
            if os.path.isfile(os.path.join(base, path)):
                return os.path.join(base, path)
        return path

    def env(self, placement: Placement) -> dict[str, str]:
        env = without_ray(os.environ)
        shell = self.context.env
        env.update(shell)
        env.update(self.spec.env)
        if "OMP_NUM_THREADS" not in shell and "OMP_NUM_THREADS" not in self.spec.env:
            env.pop("OMP_NUM_THREADS", None)  # Ray's, for the worker: the ranks get torchrun's rule
            if placement.local_world_size > 1:
                env["OMP_NUM_THREADS"] = "1"
        env["ORCHESTRATOR_RUN_DIR"] = self.run_dir_text()
        # Ray starts its workers at a lower priority (niceness 15); the ranks take the user's shell's.
        env[NICENESS_VAR] = str(self.context.niceness)
        # Through a pipe Python would buffer the script's prints: rank 0's are shown live.
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env


def without_ray(environ) -> dict[str, str]:
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


def session_command() -> list[str]:
    """A ctx or Lightning rank's command (after the bootstrap): the worker session's own module."""
    return ["-m", "orchestrator.rank.rank_main"]


def session_env(spec: JobSpec, environ: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    """What a ctx or Lightning rank imports and runs under, whatever its attempt: the agent's
    environment without Ray's variables, the job's env, and its share of the agent's threads.
    (Here, not in session_ranks.py, which imports torch: a local run's command starts its first
    ranks with it before it imports torch itself.)"""
    env = {**without_ray(environ), **spec.env}
    # Through a pipe Python would buffer the rank's prints (a killed rank's last lines lost), and
    # it takes this at its start: a local run's first ranks start with this environment.
    env["PYTHONUNBUFFERED"] = "1"
    if "OMP_NUM_THREADS" in environ and "OMP_NUM_THREADS" not in spec.env:
        # Ray Train's rule for its workers (their CPUs), shared by the worker's ranks: a rank
        # computes with the same threads whether its peers are on its agent or another.
        threads = int(environ["OMP_NUM_THREADS"]) // local_world_size
        env["OMP_NUM_THREADS"] = str(max(1, threads))
    return env
