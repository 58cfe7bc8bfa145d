"""An elastic training orchestrator on Ray: one job spec, exact resume, trustworthy checkpoints.

    import orchestrator
    result = orchestrator.run("jobs/quickstart.yaml", scaling__num_workers=2)
    print(result.status, result.metrics, result.weights_sha256)

Which process runs each folder (each imports only from the rows above it; tests/project/test_layout.py checks both):
    errors, storage, run_dir, failures,   every process: errors, files, the run's folder, what failed,
    protocol, processes, procfs, ray_private,  the typed messages, processes by id and /proc, Ray's private API,
    handles                               the run monitor called as an actor or in this process
    data/           the driver (its input check) and the ranks (loading): the global sample order, Parquet
    spec/           the driver parses and validates the job spec (nothing more); every process reads its JobSpec
    cluster/        the driver: its connection to Ray, embedded and warm clusters, their records
    checkpoint/     the driver (choosing, listing) and the ranks (saving): the store, its manifests, the lease
    observe/        the monitor and agents (metrics) and the driver (goodput, summary.json, history)
    worker_config   every process of a run: what the driver hands each agent, and each agent its ranks
    rank/           each rank child of a node's agent: the torch and Lightning harnesses, a script's bootstrap
    agent/          a node's agent, in each Ray Train worker (local mode: the command): it (re)starts the ranks
    monitor/        Ray actors: the run monitor (attempts, hang watchdog) and Ray Train's controller callback
    driver/         the driver process alone: resume decision, launch (on Ray or in local mode), console, signals
    cli/            the command's process, one module per command (doctor's probes run on each node)
"""

from orchestrator.errors import CheckpointError, OrchestratorError, RunStopped, SpecError, TrainingFailed, UserError
from orchestrator.observe.result import RunResult
from orchestrator.spec import JobSpec, resolve_spec

__version__ = "0.1.0"


def run(spec, **kwargs) -> RunResult:
    """Train a job spec (path, mapping or JobSpec); see orchestrator.driver.launch.run for the options."""
    from orchestrator.cluster.environment import keep_ray_on_loopback

    keep_ray_on_loopback(kwargs.get("address"))  # before Ray is imported
    from orchestrator.driver.launch import run as _run

    return _run(spec, **kwargs)


__all__ = ["CheckpointError", "JobSpec", "OrchestratorError", "RunResult", "RunStopped", "SpecError",
           "TrainingFailed", "UserError", "resolve_spec", "run"]
