"""The driver: spec -> checkpoint choice -> Ray -> TorchTrainer -> progress -> summary.json.

`run()` is the Python API and what the CLI calls. It only wires things together: the choice of
checkpoint is `resume.py`'s, the Ray connection `cluster.py`'s, the workers' code `runtime/`'s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from orchestrator import cluster, resume, storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.errors import RunStopped, TrainingFailed
from orchestrator.monitor import start_monitor
from orchestrator.result import RunResult, write_summary
from orchestrator.runtime.session import local_log_dir
from orchestrator.runtime.worker import train_worker
from orchestrator.signals import StopSignals
from orchestrator.spec import JobSpec, resolve_spec

PLACEMENT_STRATEGIES = {"spread": "SPREAD", "pack": "PACK"}
# Seconds between the driver's polls of the run monitor.
POLL_INTERVAL_S = 1.0

Console = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


def run(spec: JobSpec | Mapping[str, Any] | str | os.PathLike, *, address: str | None = None,
        overwrite: bool = False, console: Console | None = _print, **overrides: Any) -> RunResult:
    """Train the job described by `spec` and return a typed result.

    `spec` is a path to a YAML file, a mapping, or a JobSpec. `overrides` set fields by name; use
    `__` for nested fields (scaling__num_workers=4) or pass a dict for a section.
    """
    say = console or (lambda line: None)
    job = resolve_spec(spec, _flatten_overrides(overrides))
    cluster.check_address(address)
    run_dir = storage.resolve(job.storage).join(job.name)
    storage.ensure_dir(run_dir)
    store = CheckpointStore(run_dir)
    choice = resume.choose(job, store, overwrite=overwrite)
    for warning in choice.warnings:
        say(f"warning: {warning}")
    resume.check_compatible(job, choice)
    say(f"run '{job.name}' in {run_dir.uri}: {choice.reason}" + (f" -> {choice.uri}" if choice.uri else ""))

    if resume.is_finished(job, choice.manifest):
        say(f"run '{job.name}' already finished at step {choice.step}; nothing to do "
            "(raise max_epochs or max_steps to train further)")
        return _already_finished(job, run_dir, choice)

    started = time.time()
    worker_env = {**job.env, **cluster.QUIET_RAY_ENV, "PYTHONPATH": _worker_pythonpath()}
    connection = cluster.connect(address)
    try:
        monitor = start_monitor()
        trainer = _build_trainer(job, run_dir.uri, choice.uri, monitor, worker_env)
        watcher = _ProgressPrinter(monitor, job, say)
        watcher.start()
        error: BaseException | None = None
        signals = StopSignals()
        try:
            with signals.installed():
                trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - reported below, with the worker's own message
            error = exc
        finally:
            watcher.stop()
        stopped_by = signals.stopped_by(error)
        result = RunResult.from_events(job, run_dir, ray.get(monitor.events_since.remote(0)), choice,
                                       wall_seconds=time.time() - started, error=error, stopped_by=stopped_by)
        # Before shutting Ray down: a stopped driver may have only seconds left (ray job stop: 3 s).
        write_summary(run_dir, result)
    finally:
        cluster.disconnect(connection)

    if stopped_by:
        raise RunStopped(_stopped_message(job, stopped_by, result), signal_name=stopped_by)
    if error is not None:
        raise TrainingFailed(_failure_message(job, error, run_dir))
    say(result.describe())
    return result


def _build_trainer(job: JobSpec, run_uri: str, resume_uri: str | None, monitor,
                   worker_env: dict[str, str]) -> TorchTrainer:
    scaling = job.scaling
    resources = dict(scaling.resources_per_worker)
    if scaling.use_gpu:
        resources.setdefault("GPU", 1.0)
    config = {
        "spec": job,
        "run_uri": run_uri,
        "resume_uri": resume_uri,
        "monitor": monitor,
        "log_dir": local_log_dir(run_uri),
    }
    ray_dir = storage.resolve(run_uri).join("_ray")
    return TorchTrainer(
        train_loop_per_worker=train_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=resources,
            placement_strategy=PLACEMENT_STRATEGIES[scaling.placement],
        ),
        run_config=RunConfig(
            # Ray keeps its own run state here; checkpoints are ours, in <run_dir>/checkpoints.
            name=f"{job.name}-{int(time.time())}",
            storage_path=ray_dir.uri if not ray_dir.is_local else ray_dir.path,
            failure_config=FailureConfig(max_failures=job.failure.max_failures,
                                         max_preemption_failures=job.failure.max_preemptions),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            worker_runtime_env={"env_vars": worker_env},
        ),
    )


def _worker_pythonpath() -> str:
    """Let workers import the user's modules the way the driver does (from the current directory)."""
    # Absolute: Ray may start workers in another directory (a job's unpacked working_dir).
    own = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p) and "site-packages" not in p]
    parts = [os.getcwd(), *own]
    existing = os.environ.get("PYTHONPATH")
    if existing:
        parts.append(existing)
    return os.pathsep.join(dict.fromkeys(parts))


def _flatten_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        flat[key.replace("__", ".")] = value
    return flat


def _already_finished(job: JobSpec, run_dir, choice: resume.ResumeChoice) -> RunResult:
    previous = RunResult.load(run_dir)
    if previous is not None:
        previous.status = "already_finished"
        previous.resumed_from = choice.to_dict()
        return previous
    manifest = choice.manifest
    return RunResult(name=job.name, status="already_finished", run_dir=run_dir.uri, world_size=manifest.world_size,
                     global_step=manifest.step, epochs=manifest.epoch, metrics=dict(manifest.metrics),
                     final_checkpoint=choice.uri, resumed_from=choice.to_dict())


def _failure_message(job: JobSpec, error: BaseException, run_dir) -> str:
    """One paragraph: the worker's own exception (not Ray's wrapping) and where the logs are."""
    root = error
    worker_failures = getattr(error, "worker_failures", None)
    if worker_failures:
        _, root = sorted(worker_failures.items())[0]
    text = str(root).strip()
    # Keep the user's exception line, not the whole remote traceback.
    lines = [line for line in text.splitlines() if line.strip()]
    tail = lines[-1] if lines else type(root).__name__
    logs = local_log_dir(run_dir.uri) or "Ray's worker logs (ray logs)"
    return (f"run '{job.name}' failed: {tail}. Worker logs: {logs}. The newest committed checkpoint is kept; "
            "fix the cause and run the same command again to resume from it.")


def _stopped_message(job: JobSpec, signal_name: str, result: RunResult) -> str:
    kept = (f"the newest committed checkpoint is {result.final_checkpoint}" if result.final_checkpoint
            else "no checkpoint was committed yet")
    return (f"run '{job.name}' stopped by {signal_name} after step {result.global_step}; {kept}. "
            "Run the same command again to resume from the newest committed checkpoint.")


class _ProgressPrinter:
    """Polls the run monitor and prints one line per progress event, plus restarts and checkpoints."""

    def __init__(self, monitor, job: JobSpec, say: Console):
        self.monitor, self.job, self.say = monitor, job, say
        self._stop = threading.Event()
        self._seen = 0
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._starts = 0
        max_epochs = job.lightning.trainer.get("max_epochs") if job.lightning else job.torch.max_epochs
        self._epochs = f"/{max_epochs}" if max_epochs else ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            self._drain()

    def _drain(self) -> None:
        try:
            events = ray.get(self.monitor.events_since.remote(self._seen), timeout=10)
        except Exception:  # noqa: BLE001 - progress is best effort; the run's outcome comes from fit()
            return
        self._seen += len(events)
        for event in events:
            line = self._format(event)
            if line:
                self.say(line)

    def _format(self, event: dict[str, Any]) -> str | None:
        kind = event["kind"]
        if kind == "worker_started" and event["rank"] == 0:
            self._starts += 1
            where = f"resuming from step {event['restored_step']}" if event["restored_from"] else "starting fresh"
            prefix = "restarted: " if self._starts > 1 else ""
            return f"{prefix}{event['world_size']} workers up, {where}"
        if kind == "progress":
            metrics = "  ".join(f"{k} {v:.4g}" for k, v in sorted(event["metrics"].items()))
            # Mid-epoch events carry the epoch in progress (0-based); boundary events the epochs done.
            at_boundary = event["batch_in_epoch"] == 0
            epoch = f"epoch {event['epoch'] if at_boundary else event['epoch'] + 1}{self._epochs}"
            epoch += " done" if at_boundary else ""
            rate = f"  {event['samples_per_s']:,.0f} samples/s" if event.get("samples_per_s") else ""
            return f"{epoch:<14} step {event['step']:>6}  {metrics}{rate}"
        if kind == "checkpoint":
            return f"checkpoint committed: step {event['step']} ({event['reason']}) -> {event['uri']}"
        if kind == "preemption":
            return (f"preemption notice: node(s) {', '.join(n[:12] for n in event['nodes'])} go away in "
                    f"{event['seconds_left']}; checkpointing at step {event['step']}")
        return None
