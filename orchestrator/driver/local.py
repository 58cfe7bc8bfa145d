"""Local mode: a run on this one machine without Ray. The node's agent (agent/supervisor.py) runs
in the command's own process and starts every rank itself; the run monitor is a plain object
beside it (handles.py). What one machine can give is kept: restarts in place, hang detection
with stacks, failure classification, checkpoints and exact resume, the lease, logs, `status`,
summary.json, goodput, and metrics on a Prometheus endpoint of the command's own. What needs
more than one machine (nodes, elasticity across them) needs Ray: `choose` says which mode runs
and why, on the run's first line.

A failure the agent cannot restart in place is handled as on Ray Train's controller, by the same
handler (monitor/group_failure.py), and the group is started again up to failure.max_failures
times, as Ray Train would start it again.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from orchestrator import handles
from orchestrator.errors import UserError
from orchestrator.spec import JobSpec
from orchestrator.worker_config import WorkerConfig

LOCAL, RAY, AUTO = "local", "ray", "auto"


@dataclass(frozen=True)
class Mode:
    local: bool
    # The run's first line: which mode runs, why, and how to choose the other.
    line: str
    # What the user should hear besides (a warm cluster's record whose cluster is gone, removed).
    notes: tuple[str, ...] = ()


def choose(job: JobSpec, address: str | None, requested: str = AUTO) -> Mode:
    """Local mode for a run of one node with no cluster named and none up (`orchestrator up`),
    unless `requested` says otherwise; a local mode the run cannot have is refused, saying why."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    nodes = job.scaling.num_workers if job.script is not None else 1
    ranks = job.scaling.num_workers * job.ranks_per_worker
    if requested == LOCAL:
        if address:
            raise UserError(f"--local runs without Ray, and a Ray cluster was named too ({address}, from --address or "
                            "RAY_ADDRESS). Fix: drop --local to run on that cluster, or unset the address.")
        if nodes > 1 or job.scaling.elastic:
            low, high = job.scaling.min_workers, job.scaling.num_workers
            what = (f"an elastic size ({low} to {high} {'nodes' if job.script is not None else 'workers'})"
                    if job.scaling.elastic else f"{nodes} nodes (--nnodes {nodes})")
            raise UserError(f"local mode runs on this one machine, and run '{job.name}' asks for {what}, which only a "
                            "Ray cluster gives: more nodes to place ranks on, and room to grow back to. Fix: drop "
                            "--local (or use --ray), or ask for one node of a fixed size.")
        return Mode(True, f"local mode: {ranks} rank(s) on this machine, no Ray (--local); --ray runs on Ray instead")
    if requested == RAY:
        return Mode(False, "on Ray (--ray)")
    if address:
        from orchestrator.cluster.environment import named

        return Mode(False, f"on Ray: joining the cluster at {named(address)}")
    from orchestrator.cluster import warm

    notes: list[str] = []
    if warm.current(on_stale=notes.append) is not None:
        return Mode(False, "on Ray: the warm local cluster is up (`orchestrator up`); --local runs without it")
    if nodes > 1:
        return Mode(False, f"on Ray: {nodes} nodes need a cluster (an embedded one on this machine)", tuple(notes))
    if job.scaling.elastic:
        return Mode(False, "on Ray: an elastic run needs a cluster to grow and shrink with (an embedded one here)",
                    tuple(notes))
    return Mode(True, f"local mode: one node, {ranks} rank(s) on this machine, no Ray cluster to start; --ray runs "
                      "on Ray (its dashboard, more nodes)", tuple(notes))


class Started(NamedTuple):
    """The mode a run goes in, and a local run's first ranks, started (`start`)."""
    mode: Mode
    spares: Any  # agent.spares.Spares | None


def start(job: JobSpec, address: str | None, requested: str = AUTO) -> Started:
    """Choose the mode from the spec's first, import-free pass (nothing the full validation adds
    changes it), and for local mode start the first attempt's ranks at once (`first_spares`), once
    they are known to fit on this machine: a run refused for its size starts none of them."""
    from orchestrator.cluster.environment import worker_env

    mode = choose(job, address, requested)
    if not mode.local:
        return Started(mode, None)
    if not job.scaling.use_gpu:  # (a GPU job starts no ranks ahead; its check imports torch, later)
        check_fits_here(job)
    return Started(mode, first_spares(job, worker_env(job.env)))


def check_fits_here(job: JobSpec) -> None:
    """Every rank of a local run is on this machine: what its workers ask for (resources_per_worker)
    must be here, or the run is refused at once, as Ray would never place it."""
    from orchestrator.cluster.capacity import fmt, worker_resources

    per_worker, workers = worker_resources(job), job.scaling.num_workers
    here = {"CPU": float(len(os.sched_getaffinity(0)))}
    if "GPU" in per_worker:
        import torch

        here["GPU"] = float(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    need = {key: value * workers for key, value in per_worker.items()}
    short = {key: value - here.get(key, 0.0) for key, value in need.items() if value > here.get(key, 0.0) + 1e-9}
    if not short:
        return
    shape = (f"1 node(s) x {job.ranks_per_worker} rank(s)" if job.script is not None
             else f"{workers} worker(s) x {job.ranks_per_worker} rank(s)")
    has = fmt({key: here.get(key, 0.0) for key in need})
    raise UserError(
        f"{shape} cannot run on this machine in local mode: they ask for {fmt(need)} "
        f"(scaling.resources_per_worker {fmt(per_worker)} each), and it has {has}. "
        "Fix: lower the ranks (--nproc_per_node, scaling.num_workers) or scaling.resources_per_worker (e.g. "
        "--set scaling.resources_per_worker='{CPU: 1}'), or run on a cluster that has them (--address, --ray).")


def start_monitor(job: JobSpec) -> handles.InProcess:
    """The run monitor as a plain object in this process, called as the actor is."""
    from orchestrator.monitor.actor import RunMonitor

    monitor = RunMonitor.__ray_actor_class__(job.failure, job.name)
    return handles.InProcess(monitor)


@contextlib.contextmanager
def session(job: JobSpec, worker_env: dict[str, str]) -> Iterator[None]:
    """The agent's process is this one: it gets the variables a Ray worker would (the job's env,
    PYTHONPATH) for the run's length, and the run's metrics are served from here."""
    from orchestrator.cluster.records import reap_orphans
    from orchestrator.observe import metrics

    reap_orphans()  # what an embedded cluster whose driver was killed left, as every Ray run's start does
    worker_env = _agent_env(job, worker_env)
    saved = {key: os.environ.get(key) for key in worker_env}
    os.environ.update(worker_env)
    metrics.serve_locally()
    try:
        yield
    finally:
        metrics.stop_serving_locally()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _agent_env(job: JobSpec, worker_env: dict[str, str]) -> dict[str, str]:
    """The variables the agent's process gets for the run: a Ray worker's (`worker_env`), and the
    threads Ray would give the one agent that holds every worker's ranks (agent/rank_env.py)."""
    from orchestrator.agent.rank_env import local_agent_env

    return local_agent_env(job, os.environ, worker_env)


def ranks_here(job: JobSpec) -> int:
    """The ranks of a local run's one agent: every worker's."""
    return job.scaling.num_workers * job.ranks_per_worker


def first_spares(job: JobSpec, worker_env: dict[str, str]):
    """The first attempt's ranks of a ctx or Lightning job, started now, before the command itself
    imports the job's code: spares (agent/spares.py) that import torch and Lightning at the lowest
    priority while the command validates the spec, takes the lease and chooses the checkpoint, on a
    core it leaves idle, then are handed the attempt (`LocalTrainer`). Each imports under the
    environment its rank will have: the agent's own recipe (agent/session_ranks.py `session_env`)
    on the environment `session` gives the agent and the agent's rank count (`ranks_here`). None
    for a script (its own imports come first, as under torchrun) and for a GPU job (its devices are
    chosen with the attempt). The caller closes what is not taken."""
    if job.script is not None or job.scaling.use_gpu:
        return None
    from orchestrator.agent import session_ranks
    from orchestrator.agent.spares import Spares

    env = first_ranks_env(job, worker_env)
    spares = Spares(job.kind, session_ranks.COMMAND, session_ranks.cwd(), first=True)
    for local_rank in range(ranks_here(job)):
        spares.start(local_rank, env)
    return spares


def first_ranks_env(job: JobSpec, worker_env: dict[str, str]) -> dict[str, str]:
    """What a local run's first ranks import under: what their agent's recipe gives them, on the
    environment `session` will give the agent."""
    from orchestrator.agent import session_ranks

    return session_ranks.session_env(job, {**os.environ, **_agent_env(job, worker_env)}, ranks_here(job))


class LocalTrainer:
    """The agent of a local run, started by `fit()` as Ray Train starts its workers: in this process.
    `spares`: the first attempt's ranks, started ahead by the command (`first_spares`)."""

    def __init__(self, config: WorkerConfig, spares=None):
        self.config, self.spares = config, spares

    def fit(self) -> None:
        from orchestrator.agent.group import AgentGroup
        from orchestrator.agent.kinds import for_job
        from orchestrator.agent.supervisor import Supervisor

        spec = self.config.spec
        group = AgentGroup.on_this_machine(ranks_here(spec))
        group_failures = 0
        while True:
            try:
                spares, self.spares = self.spares, None  # the first attempt's only
                Supervisor(self.config, group, functools.partial(for_job, first_spares=spares)).run()
                return
            except Exception as exc:  # decided as on Ray Train's controller, and started again as it would
                from orchestrator.monitor import group_failure  # (Ray Train's import: only now)

                decision = group_failure.handle(self.config.monitor, {0: exc}, spec.failure.hang_timeout_s)
                if decision.end is not None:
                    raise decision.end from None
                group_failures += 1
                if 0 <= spec.failure.max_failures < group_failures:
                    raise
