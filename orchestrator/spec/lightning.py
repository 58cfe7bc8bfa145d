"""Lightning classes named in the spec: the model, the data module and `lightning.callbacks`
(users' own callbacks and Lightning's, built in every worker).

The workers train with `lightning.pytorch` (Ray's Lightning strategies are built on it). The
older package name `pytorch_lightning` is a separate copy of the same code whose classes the
`lightning.pytorch` Trainer rejects, so a class built on it is refused here, naming the import
to change.

Lightning's `ModelCheckpoint` is the one exception. The orchestrator's store is the only
checkpoint mechanism of a run (atomic, checksummed, found by `resume_from: latest`), so a
ModelCheckpoint in the spec is not built: its retention settings are translated into the
`checkpoint:` section (save_top_k/monitor/mode -> keep_best, every_n_train_steps ->
every_n_steps), and a setting without a counterpart is refused, naming the field to use.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SpecError

MODEL_CHECKPOINT_PATHS = (
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
    "pytorch_lightning.callbacks.ModelCheckpoint",
    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
)
# ModelCheckpoint arguments that only name or report files; the store names its own folders.
IGNORED = {"save_last", "verbose", "filename", "auto_insert_metric_name", "enable_version_counter"}
TRANSLATED = {"monitor", "mode", "save_top_k", "every_n_train_steps", "every_n_epochs"}


def is_model_checkpoint(class_path: str, cls: type | None) -> bool:
    """Whether a callback is Lightning's ModelCheckpoint (a subclass of it is refused: it would be
    a second checkpoint mechanism whose own logic the store cannot carry out)."""
    if class_path.replace(":", ".") in MODEL_CHECKPOINT_PATHS:
        return True
    if cls is None:
        return False
    from lightning.pytorch.callbacks import ModelCheckpoint

    if issubclass(cls, ModelCheckpoint):
        raise SpecError(
            f"field 'lightning.callbacks': {class_path!r} is a subclass of ModelCheckpoint, a second "
            "checkpoint mechanism beside the orchestrator's store (which resume_from: latest reads). Fix: "
            "use lightning.pytorch.callbacks.ModelCheckpoint itself (its save_top_k, monitor, mode and "
            "every_n_train_steps become the checkpoint: section) or set checkpoint.keep_best directly."
        )
    return False


def checkpoint_settings(init_args: dict[str, Any], path: str) -> dict[str, Any]:
    """The `checkpoint:` fields that a ModelCheckpoint's init_args stand for."""
    for key in init_args:
        if key not in TRANSLATED | IGNORED:
            raise SpecError(
                f"field '{path}.init_args.{key}': ModelCheckpoint's {key!r} has no counterpart, because "
                "checkpoints go through the orchestrator's store into <storage>/<name>/checkpoints. Fix: "
                "remove it; the checkpoint: section sets when to save (every_n_steps, every_n_seconds, "
                "at_epoch_end) and what to keep (keep_last, keep_best)."
            )
    top_k = init_args.get("save_top_k", 1)
    monitor = init_args.get("monitor")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise SpecError(f"field '{path}.init_args.save_top_k': got {top_k!r}; it must be -1 (keep all) or a "
                        "whole number >= 1. Fix: e.g. save_top_k: 3.")
    if top_k == 0:
        raise SpecError(
            f"field '{path}.init_args.save_top_k': 0 would keep no checkpoint, and a run always keeps its "
            "newest one so that it can resume. Fix: remove the ModelCheckpoint callback (the store keeps "
            "checkpoint.keep_last newest checkpoints) or set save_top_k >= 1."
        )
    settings: dict[str, Any] = {}
    if top_k == -1:
        settings["keep_last"] = None
    elif monitor is None:
        settings["keep_last"] = top_k
    else:
        # The best k by the metric, plus the newest (needed to resume), as ModelCheckpoint with
        # save_last keeps them.
        settings["keep_best"] = {"k": top_k, "monitor": monitor, "mode": init_args.get("mode", "min")}
        settings["keep_last"] = 1
    if init_args.get("every_n_train_steps"):
        settings["every_n_steps"] = init_args["every_n_train_steps"]
    every_epochs = init_args.get("every_n_epochs")
    if every_epochs == 0:
        settings["at_epoch_end"] = False
    elif every_epochs not in (None, 1):
        raise SpecError(
            f"field '{path}.init_args.every_n_epochs': {every_epochs!r} is not supported; checkpoints are "
            "saved at every epoch's end (checkpoint.at_epoch_end) or every N steps. Fix: remove it, or set "
            "every_n_train_steps to the steps of N epochs."
        )
    return settings


def merge_checkpoint(raw_checkpoint: dict[str, Any], settings: dict[str, Any], path: str) -> dict[str, Any]:
    """The checkpoint: section with a ModelCheckpoint's settings added; the same field set both
    ways to different values is an error rather than a silent choice."""
    merged = dict(raw_checkpoint)
    for key, value in settings.items():
        if key in raw_checkpoint and raw_checkpoint[key] != value:
            raise SpecError(
                f"field 'checkpoint.{key}': {raw_checkpoint[key]!r} conflicts with {value!r} from the "
                f"ModelCheckpoint in {path}. Fix: set it in one place only (the checkpoint: section, or "
                "the ModelCheckpoint's init_args)."
            )
        merged[key] = value
    return merged


LIGHTNING_BASES = {"model": "LightningModule", "data": "LightningDataModule", "callbacks": "Callback",
                   "logger": "loggers.Logger"}


def check_lightning_class(cls: type, class_path: str, path: str, role: str) -> None:
    """A model, data module or callback must be built on lightning.pytorch's base class."""
    import lightning.pytorch as pl

    base_name = LIGHTNING_BASES[role]
    if issubclass(cls, _attribute(pl, base_name)):
        return
    old_base = _old_package_base(base_name)
    if old_base is not None and issubclass(cls, old_base):
        raise SpecError(
            f"field '{path}': {class_path!r} is built on pytorch_lightning.{base_name}, and the workers train "
            f"with lightning.pytorch, whose Trainer does not accept classes of the older package name (the two "
            f"are separate copies of the same code). Fix: in its module, import lightning.pytorch as pl (or "
            f"from lightning.pytorch import {base_name}) instead of pytorch_lightning; nothing else changes."
        )
    if role != "data":  # a data module may be any object with the dataloader methods
        raise SpecError(
            f"field '{path}': {class_path!r} is not a lightning.pytorch.{base_name}. Fix: name a subclass of "
            f"lightning.pytorch.{base_name}."
        )


# Lightning's loggers that need a package of their own, which Lightning imports only when the
# logger is built: checked on the driver, so that a missing one is not found by every worker.
LOGGER_PACKAGES = {"MLFlowLogger": ("mlflow", "mlflow-skinny"), "WandbLogger": ("wandb", "wandb"),
                   "CometLogger": ("comet_ml", "comet-ml"), "NeptuneLogger": ("neptune", "neptune")}


def check_logger_package(cls: type, class_path: str, path: str) -> None:
    """A logger whose package is not installed is refused at validation, naming what to install."""
    import importlib.util

    for base in cls.__mro__:
        module, package = LOGGER_PACKAGES.get(base.__name__, (None, None))
        if module is not None and base.__module__.startswith("lightning.pytorch.loggers"):
            if importlib.util.find_spec(module) is None:
                raise SpecError(
                    f"field '{path}': {class_path!r} needs the {module!r} package, which is not installed "
                    f"here. Fix: pip install {package} (on every node of the cluster), or remove the logger.")
            return


def _old_package_base(name: str) -> type | None:
    try:
        import pytorch_lightning
    except ImportError:
        return None
    return _attribute(pytorch_lightning, name)


def _attribute(package, dotted: str):
    import importlib

    module, _, name = dotted.rpartition(".")
    owner = importlib.import_module(f"{package.__name__}.{module}") if module else package
    return getattr(owner, name, None)
