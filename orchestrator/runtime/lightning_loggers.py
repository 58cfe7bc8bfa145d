"""Lightning loggers from the spec (`lightning.logger`): one logger run for the whole training run.

Each logger writes once, from rank 0 (Lightning's loggers are rank-zero only), into the run
directory: `<run>/logs/lightning/<kind>/` (csv, tensorboard, ...) unless its init_args say
otherwise. The folder is the same for every worker-group start and every resumed run, so a
resume continues the same logger run: one TensorBoard run with a continuous step axis, and one
`metrics.csv` that keeps the rows of the steps before the checkpoint it resumed from.
"""

from __future__ import annotations

import csv
import inspect
import os
import warnings

from lightning.pytorch.loggers import CSVLogger, Logger

from orchestrator.spec import ClassRef, import_object

# Lightning's CSV writer says it will delete the folder's old metrics; `continue_csv` keeps them.
warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")


def build_loggers(refs: list[ClassRef], root: str | None) -> list[Logger]:
    """The spec's loggers, each pointed at its own folder under `root` unless told otherwise."""
    loggers = []
    for ref in refs:
        cls = import_object(ref.class_path, "lightning.logger.class_path")
        args = dict(ref.init_args)
        params = inspect.signature(cls.__init__).parameters
        kind = cls.__name__.removesuffix("Logger").lower() or cls.__name__.lower()
        if "save_dir" in params and root is not None:
            args.setdefault("save_dir", root)
        if "name" in params:
            args.setdefault("name", "")  # no extra level: <save_dir>/<version>
        if "version" in params:
            args.setdefault("version", kind)  # fixed, so that a resume writes the same run
        loggers.append(cls(**args))
    return loggers


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
