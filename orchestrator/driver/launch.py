"""The driver: spec -> checkpoint choice -> Ray (or local mode) -> the agents -> progress -> summary.json.

`run()` is the Python API and what the CLI calls. It only wires things together: the choice of
checkpoint is `resume.py`'s, the mode `local.py`'s, the Ray connection `cluster/connection.py`'s,
what each node runs `agent/`'s and `rank/`'s. A local run imports none of Ray's training library.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.checkpoint.lease import LeaseLost, RunLease, refuse_if_held_here
from orchestrator.cluster.environment import worker_env
from orchestrator.data.sources import check_data_input
from orchestrator.driver import local, resume
from orchestrator.driver.attempt import Attempt
from orchestrator.driver.console import Console, taken_over_message
from orchestrator.driver.failure_timeouts import recovery_settings
from orchestrator.errors import RunStopped, TrainingFailed, UserError
from orchestrator.observe.metrics import endpoint as metrics_endpoint
from orchestrator.observe.result import RunResult, RunStatus, write_summary
from orchestrator.run_dir import RunDir, write_storage_marker
from orchestrator.spec import JobSpec, resolve_spec
from orchestrator.worker_config import LeaseFence, ScriptContext, WorkerConfig

PLACEMENT_STRATEGIES = {"spread": "SPREAD", "pack": "PACK"}
# Seconds a CLI run on its own embedded cluster still waits for trainer.fit() after rank 0
# reported the end and every agent cleaned up: a failure reported right after it still counts.
FINISHED_GRACE_S = 0.5
# On the warm local cluster, which outlives the run, its dashboard and Ray Train's state API keep
# the run: fit() is given this long to return (Ray Train's teardown, a second or two), so that they
# record it as finished, not as aborted by a driver that left.
WARM_FINISHED_GRACE_S = 10.0


def _print(line: str) -> None:
    print(line, flush=True)


def run(spec: JobSpec | Mapping[str, Any] | str | os.PathLike, *, address: str | None = None,
        mode: str = local.AUTO, overwrite: bool = False, console: Console | None = _print,
        _process_exits: bool = False, _started: local.Started | None = None, **overrides: Any) -> RunResult:
    """Train the job described by `spec` and return a typed result.

    `spec` is a path to a YAML file, a mapping, or a JobSpec. `overrides` set fields by name; use
    `__` for nested fields (scaling__num_workers=4) or pass a dict for a section. `mode`: "auto"
    (local mode for one node with no cluster named or up, else Ray), "local" or "ray" (local.py).
    `_process_exits` (the CLI's): the process ends with os._exit once this returns a finished
    run, so the run need not wait for Ray's orderly teardown (see attempt.py and
    `cluster.disconnect`). `_started` (the CLI's): the mode it chose, and a local run's first ranks
    it started, before it imported this module (local.start).
    """
    say = console or (lambda line: None)
    with contextlib.ExitStack() as cleanup:
        # A local run's first ranks not taken by an attempt (the spec refused, the run finished) end.
        if _started is not None and _started.spares is not None:
            cleanup.callback(_started.spares.close)
        # The run's name and storage first, importing nothing: a second driver of a live run on this
        # host is refused at once, before torch, Lightning or the user's code is imported.
        flat = _flatten_overrides(overrides)
        read = resolve_spec(spec, flat, read_only=True)
        if mode not in (local.AUTO, local.LOCAL, local.RAY):
            raise UserError(f"mode {mode!r} is not one of 'auto', 'local', 'ray'.")
        if mode != local.LOCAL and (address or os.environ.get("RAY_ADDRESS")):
            from orchestrator.cluster.connection import check_address  # (it imports Ray: only for an address)

            check_address(address)
        layout = RunDir.of(read.storage, read.name)
        refuse_if_held_here(layout)
        if _started is None:  # a local run's ranks start importing now, beside this process's imports of the job
            _started = local.start(read, address, mode)
            if _started.spares is not None:
                cleanup.callback(_started.spares.close)
        chosen, spares = _started
        job = resolve_spec(spec, flat)
        if chosen.local:  # again on the validated spec; a GPU job's first check (local.start leaves it here)
            local.check_fits_here(job)
        say(chosen.line)
        for note in chosen.notes:
            say(f"note: {note}")
        check_data_input(job)  # reads the Parquet footers: bad input fails here, before Ray starts
        storage.ensure_dir(layout.location)
        # One writer per run: a second driver is refused here, naming the one that holds the run. A
        # holder this host cannot check by pid is watched for up to LEASE_TTL_S first (said on the console).
        def lease_lost(exc: LeaseLost) -> None:
            # On the lease's heartbeat thread: Attempt._fit ends the workers within its next poll.
            say(f"run '{job.name}' was taken over by another driver: ending this driver's workers now")

        with RunLease.acquire(layout, on_wait=say).start_heartbeat(on_lost=lease_lost) as run_lease:
            return _run_holding(job, layout, run_lease, address, chosen, overwrite, say, _process_exits, spares)


def _run_holding(job: JobSpec, layout: RunDir, run_lease: RunLease, address: str | None, mode: local.Mode,
                 overwrite: bool, say: Console, process_exits: bool, spares=None) -> RunResult:
    run_dir = layout.location
    store = CheckpointStore(run_dir, fence=run_lease.check)
    choice = resume.choose(job, store, overwrite=overwrite)
    for warning in choice.warnings:
        say(f"warning: {warning}")
    resume.check_compatible(job, choice)
    say(f"run '{job.name}' in {run_dir.uri}: {choice.reason}" + (f" -> {choice.uri}" if choice.uri else ""))
    changes = resume.spec_changes(job, choice.manifest)
    if changes:
        say(f"note: {changes}")

    if resume.is_finished(job, choice.manifest):
        say(f"run '{job.name}' already finished at step {choice.step}; nothing to do "
            "(raise max_epochs or max_steps to train further)")
        return _already_finished(job, run_dir, choice)
    branched = resume.branch(store, choice)
    if branched:
        say(f"note: {branched}")

    started = time.time()
    env = worker_env(job.env)
    if mode.local:
        with local.session(job, env):
            result, error, attempt = _watch(job, layout, choice, run_lease, local.start_monitor(job),
                                            functools.partial(local.LocalTrainer, spares=spares), say, started,
                                            grace=None)
    else:
        result, error, attempt = _on_ray(job, layout, choice, run_lease, address, env, say, started,
                                         process_exits)

    if result.status == RunStatus.STOPPED:
        stopped_by = attempt.signals.received or "SIGINT"
        raise RunStopped(_stopped_message(job, stopped_by, result), signal_name=stopped_by)
    if error is not None:
        raise TrainingFailed(result.error)
    say(result.describe())
    return result


def _on_ray(job: JobSpec, layout: RunDir, choice: resume.ResumeChoice, run_lease: RunLease, address: str | None,
           worker_env: dict[str, str], say: Console, started: float, process_exits: bool):
    """The run on a Ray cluster: an embedded one, the warm one, or the one at `address`."""
    from orchestrator.cluster import connection as cluster

    with recovery_settings(job.failure, job.scaling) as controller_env:
        result: RunResult | None = None
        error: BaseException | None = None
        connection = cluster.connect(address, job_env={**worker_env, **controller_env}, job_name=job.name)
        for note in connection.notes:
            say(f"note: {note}")
        if job.kind == "script" and (connection.embedded or connection.warm):
            _check_script_fits(job, connection.address)
        if connection.warm:
            say(f"using the warm local cluster at {connection.address} (`orchestrator up`; "
                "`orchestrator down` stops it)")
        try:
            from orchestrator.monitor.actor import start_monitor

            monitor = start_monitor(job.name, job.failure)
            # The CLI leaves as soon as the run is done on its own embedded cluster (ended by pid
            # right after): waiting for Ray Train's teardown would only delay the user.
            grace = (FINISHED_GRACE_S if connection.embedded else WARM_FINISHED_GRACE_S if connection.warm
                     else None) if process_exits else None
            result, error, attempt = _watch(
                job, layout, choice, run_lease, monitor,
                # The caller's own ray.init (the Python API): only Ray's tunables in Ray's runtime env,
                # which it shows and logs; the agents set the rest themselves (agent/worker.py).
                lambda config: _build_trainer(job, config, None if connection.job_env_applied
                                              else cluster.runtime_env_vars(worker_env)),
                say, started, grace)
        finally:
            done = result is not None and error is None and result.status == RunStatus.FINISHED
            cluster.disconnect(connection, process_exits=process_exits and done)
    return result, error, attempt


def _watch(job: JobSpec, layout: RunDir, choice: resume.ResumeChoice, run_lease: RunLease, monitor, trainer_for,
           say: Console, started: float, grace: float | None):
    """The workers' configuration, their trainer (`trainer_for(config)`: Ray Train's, or a local
    run's agent) watched to its end, and summary.json and the history written."""
    run_dir = layout.location
    worker_config = WorkerConfig(spec=job, run_uri=run_dir.uri, resume_uri=choice.uri, monitor=monitor,
                                 log_dir=layout.logs, fence=LeaseFence(run_lease.generation, run_lease.nonce),
                                 storage_nonce=write_storage_marker(layout, socket.gethostname()),
                                 script_context=_script_context() if job.kind == "script" else None,
                                 niceness=os.nice(0))
    trainer = trainer_for(worker_config)
    where = metrics_endpoint()
    if where:
        say(f"metrics: {where} (Prometheus; ray_orchestrator_*, labelled run=\"{job.name}\")")
    attempt = Attempt(job, run_dir, choice, monitor, say, started, run_lease, finished_grace_s=grace)
    result, error = attempt.fit(trainer)
    if run_lease.lost is not None:  # the run is the newer driver's now, summary.json too
        raise TrainingFailed(taken_over_message(job.name, str(run_lease.lost)))
    # Before shutting Ray down: a stopped driver may have only seconds left (ray job stop: 3 s).
    _save_summary(run_dir, result, say)
    attempt.save_history(result)
    return result, error, attempt


def _save_summary(run_dir, result: RunResult, say: Console) -> None:
    """summary.json; a storage that cannot take it (full, gone) costs the file, not the result."""
    try:
        write_summary(run_dir, result)
    except OSError as exc:
        say(f"warning: {result.summary_path} could not be written ({exc}); the outcome printed here is "
            "the only record of it")


def _build_trainer(job: JobSpec, worker_config: WorkerConfig, worker_env: dict[str, str] | None):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from orchestrator.agent.worker import train_worker
    from orchestrator.monitor.group_failure import GroupFailureCallback

    scaling = job.scaling
    elastic = scaling.elastic
    resources = dict(scaling.resources_per_worker)
    if scaling.use_gpu:
        resources.setdefault("GPU", 1.0)
    ray_dir = RunDir.at(worker_config.run_uri).ray
    from orchestrator.ray_private import without_dataset_actors

    return without_dataset_actors(TorchTrainer)(
        train_loop_per_worker=train_worker,
        train_loop_config=worker_config.to_config(),
        torch_config=TorchConfig(timeout_s=job.failure.collective_timeout_s),
        scaling_config=ScalingConfig(
            # [min, max]: Ray Train's elastic policy sizes each start to what the cluster holds.
            num_workers=(scaling.min_workers, scaling.num_workers) if elastic else scaling.num_workers,
            elastic_resize_monitor_interval_s=scaling.resize_interval_s,
            use_gpu=scaling.use_gpu,
            resources_per_worker=resources,
            placement_strategy=PLACEMENT_STRATEGIES[scaling.placement],
        ),
        run_config=RunConfig(
            # Ray keeps its own run state here; checkpoints are ours, in <run_dir>/checkpoints.
            name=f"{job.name}-{int(time.time())}",
            storage_path=ray_dir.uri if not ray_dir.is_local else ray_dir.path,
            # A fixed-size worker group that cannot be placed within capacity_timeout_s (Ray
            # Train's start timeout, see failure_timeouts.py) is given up on, not retried: the run says
            # what it lacked. An elastic one retries a short start timeout at the size the
            # cluster holds then.
            failure_config=FailureConfig(max_failures=job.failure.max_failures,
                                         max_preemption_failures=job.failure.max_preemptions,
                                         controller_failure_limit=-1 if elastic else 0),
            callbacks=[GroupFailureCallback(worker_config.monitor, job.failure.hang_timeout_s)],
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            # Only when the job itself could not be given the workers' variables (cluster.connect).
            worker_runtime_env={"env_vars": worker_env} if worker_env else None,
        ),
    )


def _check_script_fits(job: JobSpec, address: str | None) -> None:
    """A local cluster never grows: N nodes x K ranks it cannot hold is bad input, said before anything starts."""
    import ray

    from orchestrator.cluster.capacity import fmt, worker_resources, workers_that_fit

    per_worker = worker_resources(job)
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    room = workers_that_fit(per_worker, nodes, job.scaling.num_workers)
    if room >= job.scaling.min_workers:
        return
    k = job.script.nproc_per_node
    has = "; ".join(fmt({key: n.get(key, 0.0) for key in per_worker}) for n in nodes) or "no node"
    where = f" at {address}" if address else ""
    raise UserError(
        f"{job.scaling.min_workers} node(s) x {k} rank(s) cannot run on the local cluster{where}: "
        f"each node's ranks need {fmt(per_worker)} on one machine, and its nodes have {has}, room for {room}. "
        "A local cluster does not grow. Fix: lower --nproc_per_node or --nnodes, set the resources with "
        "--set scaling.resources_per_worker='{CPU: 1}', or run on a cluster that has them (--address).")


# Variables of the user's shell that reach a script's ranks, as they would under torchrun.
SHELL_PREFIXES = ("NCCL_", "TORCH_", "GLOO_")
SHELL_VARIABLES = ("OMP_NUM_THREADS",)


def _script_context() -> ScriptContext:
    env = {k: v for k, v in os.environ.items() if k.startswith(SHELL_PREFIXES) or k in SHELL_VARIABLES}
    return ScriptContext(cwd=os.getcwd(), env=env)  # (its niceness: WorkerConfig.niceness, every kind's)


def _flatten_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        flat[key.replace("__", ".")] = value
    return flat


def _already_finished(job: JobSpec, run_dir, choice: resume.ResumeChoice) -> RunResult:
    previous = RunResult.load(run_dir)
    if previous is not None:
        previous.status = RunStatus.ALREADY_FINISHED
        previous.resumed_from = choice.to_dict()
        return previous
    manifest = choice.manifest
    return RunResult(name=job.name, status=RunStatus.ALREADY_FINISHED, run_dir=run_dir.uri,
                     world_size=manifest.world_size, global_step=manifest.step, epochs=manifest.epoch,
                     metrics=dict(manifest.metrics), final_checkpoint=choice.uri, resumed_from=choice.to_dict())


def _stopped_message(job: JobSpec, signal_name: str, result: RunResult) -> str:
    if job.script is not None:
        return (f"run '{job.name}' stopped by {signal_name}: every rank was sent SIGTERM, as torchrun does, and has "
                "ended. Run the same command again: a script that resumes from its latest checkpoint goes on from "
                "there.")
    kept = (f"the newest committed checkpoint is {result.final_checkpoint}" if result.final_checkpoint
            else "no checkpoint was committed yet")
    return (f"run '{job.name}' stopped by {signal_name} after step {result.global_step}; {kept}. "
            "Run the same command again to resume from the newest committed checkpoint.")
