"""What validation must import to check, done after every key, type and value of the spec was
read (validate.py), so that a typo anywhere is refused at once: importing torch and Lightning
takes seconds of CPU, and a user's module may do anything when it is imported.

    check_with_libraries  what only Lightning or torch can tell: the Trainer's and
                          DeepSpeedStrategy's arguments, Lightning's defaults that a LightningCLI
                          file's values are compared with, the data section's dtypes
    check_user_code       last, the user's own code: each class_path, the train loop, the script
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from orchestrator.errors import SpecError, nearest
from orchestrator.spec.data import check_dtypes
from orchestrator.spec.deepspeed import deepspeed_args
from orchestrator.spec.fields import describe, import_object
from orchestrator.spec.lightning import check_lightning_class, check_logger_package, is_model_checkpoint
from orchestrator.spec.lightning_cli import drop_lightning_defaults
from orchestrator.spec.model import ClassRef, JobSpec
from orchestrator.spec.script import check_script_target


def check_with_libraries(spec: JobSpec, deepspeed_strategy: Any, from_file: dict[str, Any]) -> JobSpec:
    """`spec` with what Lightning says added: the file's trainer values at Lightning's defaults
    dropped (`from_file`, merge_lightning_config) and DeepSpeed's arguments resolved from the
    strategy as written (`deepspeed_strategy`, None unless it names DeepSpeed)."""
    check_dtypes(spec.data)
    lightning = spec.lightning
    if lightning is None:
        return spec
    trainer = drop_lightning_defaults(lightning.trainer, from_file) if from_file else lightning.trainer
    check_trainer_names(trainer, "lightning.trainer")
    deepspeed = deepspeed_args(deepspeed_strategy) if deepspeed_strategy is not None else None
    return dataclasses.replace(spec, lightning=dataclasses.replace(lightning, trainer=trainer, deepspeed=deepspeed))


def check_trainer_names(trainer: dict[str, Any], path: str) -> None:
    from lightning.pytorch import Trainer

    valid = [p for p in inspect.signature(Trainer.__init__).parameters if p != "self"]
    for key in trainer:
        if key not in valid:
            raise SpecError(
                f"field '{path}.{key}': {key!r} is not an argument of lightning.Trainer"
                f"{nearest(key, valid)}. Fix: use one of Trainer's arguments "
                "(max_epochs, max_steps, precision, accumulate_grad_batches, gradient_clip_val, ...)."
            )


def check_user_code(spec: JobSpec) -> None:
    """Import what the spec names of the user's code and check it is what its field needs."""
    if spec.script is not None:
        check_script_target(spec.script)
    if spec.torch is not None:
        loop = spec.torch.train_loop
        func = import_object(loop, "torch.train_loop")
        if not callable(func):
            raise SpecError(f"field 'torch.train_loop': {loop!r} is {describe(func)}, not a function. "
                            "Fix: name a function train_loop(ctx).")
    if spec.lightning is not None:
        _check_lightning_classes(spec.lightning)


def _check_lightning_classes(lightning) -> None:
    roles = [(lightning.model, "lightning.model", "model"), (lightning.data, "lightning.data", "data")]
    classes = [(_import_class(ref, where), ref, where, role) for ref, where, role in roles if ref is not None]
    for cls, ref, where, role in classes:
        check_lightning_class(cls, ref.class_path, f"{where}.class_path", role)
    for i, ref in enumerate(lightning.callbacks):
        where = f"lightning.callbacks[{i}]"
        cls = _import_class(ref, where)
        check_lightning_class(cls, ref.class_path, f"{where}.class_path", "callbacks")
        is_model_checkpoint(ref.class_path, cls)  # refuses a subclass of ModelCheckpoint
    for i, ref in enumerate(lightning.logger):
        where = "lightning.logger" if len(lightning.logger) == 1 else f"lightning.logger[{i}]"
        cls = _import_class(ref, where)
        check_lightning_class(cls, ref.class_path, f"{where}.class_path", "logger")
        check_logger_package(cls, ref.class_path, f"{where}.class_path")


def _import_class(ref: ClassRef, where: str) -> type:
    obj = import_object(ref.class_path, f"{where}.class_path")
    if not isinstance(obj, type):
        raise SpecError(f"field '{where}.class_path': {ref.class_path!r} is {describe(obj)}, not a class. "
                        "Fix: name the class itself.")
    return obj
