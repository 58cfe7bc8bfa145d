"""An elastic training orchestrator on Ray: one job spec, exact resume, trustworthy checkpoints.

    import orchestrator
    result = orchestrator.run("jobs/quickstart.yaml", scaling__num_workers=2)
    print(result.status, result.metrics, result.weights_sha256)

Which folder runs where (each imports only from the folders listed above it; tests/test_layout.py):
    errors, storage, run_dir, failures   shared by every process: errors, files, the run's folder
    data/        the global sample order and Parquet reading (driver checks, worker loading)
    spec/        the job spec, loaded and validated in the driver; knows nothing of Ray
    cluster/     the driver's connection to Ray: embedded and warm clusters, their processes
    checkpoint/  the store: commits, manifests, the writer lease (driver and workers)
    observe/     metrics, goodput, summary.json, status: what a run reports
    runtime/     runs in a Ray Train worker (a node's agent, script/) and in the rank children it
                 starts (rank_main.py, the session, the torch/ and lightning/ paths)
    driver/      runs in the driver: resume decision, launch, monitor, watchdog, console, doctor
    cli/         one module per command; the driver and runtime meet only in runtime/handoff.py
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
