"""An elastic training orchestrator on Ray: one job spec, exact resume, trustworthy checkpoints.

    import orchestrator
    result = orchestrator.run("jobs/quickstart.yaml", scaling__num_workers=2)
    print(result.status, result.metrics, result.weights_sha256)
"""

from orchestrator.errors import CheckpointError, OrchestratorError, RunStopped, SpecError, TrainingFailed, UserError
from orchestrator.result import RunResult
from orchestrator.spec import JobSpec, resolve_spec

__version__ = "0.1.0"


def run(spec, **kwargs) -> RunResult:
    """Train a job spec (path, mapping or JobSpec); see orchestrator.launch.run for the options."""
    from orchestrator.loopback import keep_ray_on_loopback

    keep_ray_on_loopback(kwargs.get("address"))  # before Ray is imported
    from orchestrator.launch import run as _run

    return _run(spec, **kwargs)


__all__ = ["CheckpointError", "JobSpec", "OrchestratorError", "RunResult", "RunStopped", "SpecError",
           "TrainingFailed", "UserError", "resolve_spec", "run"]
