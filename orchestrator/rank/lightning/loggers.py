"""Lightning loggers from the spec (`lightning.logger`): one logger run for the whole training run.

Each logger writes once, from rank 0 (Lightning's loggers are rank-zero only), into the run
directory: `<run>/logs/lightning/<kind>/` (csv, tensorboard, ...) unless its init_args say
otherwise. The folder is the same for every worker-group start and every resumed run, so a
resume continues the same logger run: one TensorBoard run with a continuous step axis, and one
`metrics.csv` that keeps the rows of the steps before the checkpoint it resumed from, and one
MLflow run (its id is recorded beside the logs by rank 0, and handed back as `run_id`).

MLflow writes into a file store under the run directory unless `tracking_uri` says otherwise.
MLflow 3 keeps that backend in maintenance mode and refuses it unless MLFLOW_ALLOW_FILE_STORE is
set; it is set for this logger only when the file store is the one chosen here.
"""

from __future__ import annotations

import csv
import inspect
import json
import os
import warnings
import weakref

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger

from orchestrator.spec import ClassRef, import_object

# Lightning's CSV writer says it will delete the folder's old metrics; `continue_csv` keeps them.
warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")

MLFLOW_EXPERIMENT = inspect.signature(MLFlowLogger.__init__).parameters["experiment_name"].default

# Each MLflow logger built here, with the (tracking URI, experiment name) its run is recorded under.
_MLFLOW_KEYS: weakref.WeakKeyDictionary[MLFlowLogger, tuple[str, str]] = weakref.WeakKeyDictionary()


def build_loggers(refs: list[ClassRef], root: str | None) -> list[Logger]:
    """The spec's loggers, each pointed at its own folder under `root` unless told otherwise."""
    loggers = []
    for ref in refs:
        cls = import_object(ref.class_path, "lightning.logger.class_path")
        args = dict(ref.init_args)
        params = inspect.signature(cls.__init__).parameters
        kind = cls.__name__.removesuffix("Logger").lower() or cls.__name__.lower()
        if issubclass(cls, MLFlowLogger):
            args = _mlflow_args(args, root)
        elif "save_dir" in params and root is not None:
            args.setdefault("save_dir", root)
        if "name" in params:
            args.setdefault("name", "")  # no extra level: <save_dir>/<version>
        if "version" in params:
            args.setdefault("version", kind)  # fixed, so that a resume writes the same run
        logger = cls(**args)
        if isinstance(logger, MLFlowLogger) and "tracking_uri" in args:
            _MLFLOW_KEYS[logger] = (args["tracking_uri"], args.get("experiment_name", MLFLOW_EXPERIMENT))
        loggers.append(logger)
    return loggers


def _mlflow_args(args: dict, root: str | None) -> dict:
    """A file store in `<root>/mlflow` unless the spec names a tracking URI; the recorded run's id
    when this run was logged before under the same tracking URI and experiment."""
    if root is None:
        return args
    if "tracking_uri" not in args:
        args.setdefault("save_dir", os.path.join(root, "mlflow"))
        args["tracking_uri"] = f"file:{args['save_dir']}"
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    record = _mlflow_record(root)
    if "run_id" not in args and os.path.isfile(record):
        with open(record) as f:
            previous = json.load(f)
        if (previous.get("tracking_uri"), previous.get("experiment_name")) == (
                args["tracking_uri"], args.get("experiment_name", MLFLOW_EXPERIMENT)):
            args["run_id"] = previous["run_id"]
    return args


def _mlflow_record(root: str) -> str:
    return os.path.join(root, "mlflow-run.json")


def continue_logger_runs(loggers: list[Logger], resumed_step: int | None, root: str | None) -> None:
    """Rank 0, before training: each logger's run continued (see the module's docstring)."""
    continue_csv(loggers, resumed_step)
    for logger in loggers:
        if logger in _MLFLOW_KEYS and root is not None:
            tracking_uri, experiment_name = _MLFLOW_KEYS[logger]
            # run_id creates the MLflow run (or finds the one handed back) on first use.
            record = {"tracking_uri": tracking_uri, "experiment_name": experiment_name, "run_id": logger.run_id}
            os.makedirs(root, exist_ok=True)
            with open(_mlflow_record(root) + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(_mlflow_record(root) + ".tmp", _mlflow_record(root))


def continue_csv(loggers: list[Logger], resumed_step: int | None) -> None:
    """Rank 0: keep a CSV logger's rows up to the step the run resumed from.

    Lightning's CSV writer starts its metrics file anew; the rows of the steps before the
    checkpoint are read first and handed back to it, and the steps after it (trained again now)
    are dropped, so the file holds each step once.
    """
    for logger in loggers:
        if not isinstance(logger, CSVLogger):
            continue
        path = os.path.join(logger.log_dir, "metrics.csv")
        rows = []
        if resumed_step is not None and os.path.isfile(path):
            with open(path, newline="") as f:
                rows = [row for row in csv.DictReader(f) if _step(row) <= resumed_step]
        writer = logger.experiment  # creating it removes the old file
        if rows:
            writer.metrics_keys = sorted(set().union(*rows))
            writer.metrics = rows
            writer.save()


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or 0)
    except ValueError:
        return 0.0
