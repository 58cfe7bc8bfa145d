"""A LightningCLI config file as a spec's Lightning section, so that a user who trains with
`python main.py fit --config config.yaml` keeps that file as it is.

Named by `lightning.config: PATH` in a spec, or by `orchestrator run --lightning-config PATH`
with no spec at all (the run is then named after the file). Its sections become:

    model, data          lightning.model, lightning.data ({class_path, init_args}); a section of
                         plain init_args (LightningCLI(MyModel) fixes the class in main.py) takes
                         its class_path from the spec
    trainer              lightning.trainer, except:
      callbacks, logger  lightning.callbacks, lightning.logger
      devices, num_nodes scaling.num_workers = devices x num_nodes (whole numbers; "auto" dropped)
      accelerator        gpu / cuda: scaling.use_gpu: true; cpu / auto dropped
      strategy           auto: dropped (ddp); anything else is checked as lightning.trainer.strategy
      values at Lightning's own defaults (what --print_config writes out) are dropped
    seed_everything      seed (a whole number; true or false keep the spec's seed)
    ckpt_path            resume_from

What the spec sets itself wins over the file. LightningCLI's automatic `optimizer` and
`lr_scheduler` sections have no counterpart (the module's configure_optimizers is used) and are
refused, as is anything else the file holds that this mapping does not know.
"""

from __future__ import annotations

import os
from typing import Any

from orchestrator.errors import SpecError

# Trainer arguments the orchestrator owns, and the values at which they say nothing (Lightning's
# defaults, as `--print_config` writes them out).
OWNED_DEFAULTS = {
    "accelerator": ("auto", "cpu"),
    "devices": ("auto", -1, 1, "1"),
    "num_nodes": (1,),
    "plugins": (None,),
    "enable_checkpointing": (None, True, False),  # the store checkpoints either way
}
GPU_ACCELERATORS = ("gpu", "cuda")
TOP_LEVEL = ("model", "data", "trainer", "seed_everything", "ckpt_path")


def merge_lightning_config(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`raw` (a spec mapping) with its `lightning.config` file merged in (unchanged without one),
    and the file's trainer values the spec kept: drop_lightning_defaults takes out those at
    Lightning's own defaults once every key of the spec was read, since it imports Lightning."""
    lightning = raw.get("lightning")
    if not isinstance(lightning, dict) or lightning.get("config") is None:
        return raw, {}
    path = lightning["config"]
    if not isinstance(path, (str, os.PathLike)):
        raise SpecError(f"field 'lightning.config': got {path!r}; it must be the path of a LightningCLI config "
                        "file. Fix: e.g. lightning.config: configs/fit.yaml.")
    cli = _load(str(path))
    merged = {key: value for key, value in raw.items() if key != "lightning"}
    section = {key: value for key, value in lightning.items() if key != "config"}
    where = f"lightning.config ({path})"

    for part in ("model", "data"):
        if part in cli:
            section[part] = _class_section(cli[part], section.get(part), part, where)
    trainer = dict(cli.get("trainer") or {})
    for key in ("callbacks", "logger"):
        value = trainer.pop(key, None)
        if value not in (None, True, False) and key not in section:
            items = [value] if isinstance(value, dict) else list(value)
            section[key] = [_in_run_dir(item) for item in items] if key == "logger" else items
    scaling = dict(merged.get("scaling") or {})
    _owned_to_scaling(trainer, scaling, where)
    if scaling:
        merged["scaling"] = scaling
    trainer = {key: value for key, value in trainer.items() if value is not None}
    own = section.get("trainer") or {}
    from_file = {}
    if isinstance(own, dict):  # else refused as it is when the section is read
        section["trainer"] = {**trainer, **own}
        from_file = {key: value for key, value in trainer.items() if key not in own}
    merged["lightning"] = section

    seed = cli.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):
        merged.setdefault("seed", seed)
    if cli.get("ckpt_path") is not None:
        merged.setdefault("resume_from", cli["ckpt_path"])
    return merged, from_file


def drop_lightning_defaults(trainer: dict[str, Any], from_file: dict[str, Any]) -> dict[str, Any]:
    """`trainer` without the file's values at Lightning's own defaults (what `--print_config`
    writes out says nothing, and would count as set: accumulate_grad_batches: 1 beside a global batch)."""
    defaults = _trainer_defaults()
    return {key: value for key, value in trainer.items()
            if not (key in from_file and key in defaults and defaults[key] == from_file[key] == value)}


def _trainer_defaults() -> dict[str, Any]:
    import inspect

    from lightning.pytorch import Trainer

    return {name: p.default for name, p in inspect.signature(Trainer.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _in_run_dir(logger: Any) -> Any:
    """A logger of the file, writing into the run directory: a relative save_dir (LightningCLI's
    default, relative to wherever a worker runs) is dropped, an absolute one kept."""
    if not isinstance(logger, dict):
        return logger
    init_args = dict(logger.get("init_args") or {})
    save_dir = init_args.get("save_dir")
    if save_dir is None or (isinstance(save_dir, str) and not os.path.isabs(save_dir) and "://" not in save_dir):
        init_args.pop("save_dir", None)
    init_args = {key: value for key, value in init_args.items() if value is not None}
    return {**logger, "init_args": init_args}


def _load(path: str) -> dict[str, Any]:
    from orchestrator.spec.files import load_spec_file

    if not os.path.isfile(path):
        raise SpecError(f"field 'lightning.config': the LightningCLI config '{path}' does not exist (looked in "
                        f"{os.path.dirname(os.path.abspath(path))}). Fix: pass the path of the file you give "
                        "`python main.py fit --config`, relative to where you run the orchestrator.")
    try:
        cli = load_spec_file(path)
    except SpecError as exc:
        raise SpecError(f"field 'lightning.config': {exc}") from None
    if isinstance(cli.get("fit"), dict):  # a config written for `main.py --config FILE fit`
        cli = cli["fit"]
    for key in ("optimizer", "lr_scheduler"):
        if cli.get(key) is not None:
            raise SpecError(
                f"field 'lightning.config' ({path}): its '{key}' section is LightningCLI's automatic "
                f"optimizer configuration, which the orchestrator does not build. Fix: return the "
                "optimizer (and scheduler) from the LightningModule's configure_optimizers, and remove "
                f"'{key}' from the file."
            )
    unknown = [key for key in cli if key not in TOP_LEVEL and key not in ("optimizer", "lr_scheduler")]
    if unknown:
        raise SpecError(
            f"field 'lightning.config' ({path}): '{unknown[0]}' is not a section of a LightningCLI fit config. "
            f"Fix: keep {', '.join(TOP_LEVEL)}; put orchestrator settings in the spec."
        )
    return cli


def _class_section(value: Any, from_spec: Any, part: str, where: str) -> dict[str, Any]:
    """A model/data section: {class_path, init_args} as it is, or plain init_args whose class the spec names."""
    if not isinstance(value, dict):
        raise SpecError(f"field '{where}': its '{part}' section is {value!r}, not a mapping. Fix: write "
                        f"{part}: {{class_path: package.module.Class, init_args: {{...}}}}.")
    spec_part = from_spec if isinstance(from_spec, dict) else {}
    if "class_path" in value:
        init_args = {**(value.get("init_args") or {}), **(spec_part.get("init_args") or {})}
        return {"class_path": spec_part.get("class_path", value["class_path"]), "init_args": init_args}
    if "class_path" not in spec_part:
        raise SpecError(
            f"field '{where}': its '{part}' section holds init_args without a class_path (a LightningCLI "
            f"main.py that fixes the class). Fix: add class_path: package.module.Class to the file's '{part}' "
            f"section, or set lightning.{part}.class_path in the spec."
        )
    return {"class_path": spec_part["class_path"], "init_args": {**value, **(spec_part.get("init_args") or {})}}


def _owned_to_scaling(trainer: dict[str, Any], scaling: dict[str, Any], where: str) -> None:
    """Take the Trainer arguments the orchestrator owns out of `trainer`, into `scaling` where they mean something."""
    devices, nodes = trainer.pop("devices", None), trainer.pop("num_nodes", None)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        workers = devices * (nodes if isinstance(nodes, int) and nodes > 0 else 1)
        if workers > 1:
            scaling.setdefault("num_workers", workers)
    accelerator = trainer.pop("accelerator", None)
    if accelerator in GPU_ACCELERATORS:
        scaling.setdefault("use_gpu", True)
    elif accelerator not in (None, *OWNED_DEFAULTS["accelerator"]):
        raise SpecError(f"field '{where}': trainer.accelerator {accelerator!r} is not available here. Fix: "
                        "use gpu or cpu (scaling.use_gpu says which).")
    if trainer.get("strategy") in ("auto", None):
        trainer.pop("strategy", None)
    trainer.pop("default_root_dir", None)  # logs and checkpoints live in the run directory
    for key in ("plugins", "enable_checkpointing"):
        value = trainer.pop(key, None)
        if value not in OWNED_DEFAULTS[key]:
            raise SpecError(
                f"field '{where}': trainer.{key} {value!r} is set by the orchestrator itself. Fix: remove it "
                "from the file."
            )
