"""Which checkpoint a run starts from, and why: the driver's half of `resume_from`.

latest: the newest committed checkpoint, by its manifest and file sizes (partial or corrupt ones
are skipped with a warning naming them; the worker group checks the hashes before loading it);
none: a fresh run, refused if the run directory already holds checkpoints unless the user asks
to overwrite; <uri>: exactly that checkpoint or a clear error. A <uri> older than the run's newest
checkpoint starts a branch: the later checkpoints are another trajectory's, and `branch` sets
them aside before any worker starts (checkpoint/store.py, "Branches").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from orchestrator.checkpoint import CheckpointStore, Manifest
from orchestrator.checkpoint.manifest import redact_env, written_strategy
from orchestrator.checkpoint.store_source import StoreSource
from orchestrator.errors import CheckpointError, UserError
from orchestrator.spec import JobSpec
from orchestrator.spec.deepspeed import deepspeed_precision, zero_stage

log = logging.getLogger(__name__)


@dataclass
class ResumeChoice:
    uri: str | None
    step: int | None
    reason: str
    manifest: Manifest | None = None
    warnings: list[str] = field(default_factory=list)
    # Set when resuming starts a branch: the checkpoints of this run after `branch_step` (and at
    # it, with `branch_inclusive`: a checkpoint of another run was named) are superseded.
    branch_step: int | None = None
    branch_inclusive: bool = False

    def to_dict(self) -> dict:
        return {"uri": self.uri, "step": self.step, "reason": self.reason, "skipped": self.warnings}


def choose(spec: JobSpec, store: CheckpointStore, *, overwrite: bool = False) -> ResumeChoice:
    """The driver reads the store as a checkpoint source (checkpoint/source.py): what it holds and
    one checkpoint opened; a source nearer the ranks (a node's memory) is theirs to ask at the start."""
    mode = spec.resume_from
    source = StoreSource(store)
    if mode == "none":
        existing = store.scan()
        if existing and not overwrite:
            raise UserError(
                f"resume_from: none asks for a fresh run, but run '{spec.name}' already has "
                f"{len(existing)} checkpoint(s) in {store.root.uri}; mixing two runs' checkpoints would make "
                "'latest' meaningless. Fix: choose a new name (--set name=...), resume with "
                "--resume-from latest, or pass --overwrite to delete the old checkpoints."
            )
        for info in existing:
            store.delete(info)
        return ResumeChoice(None, None, "fresh run (resume_from: none)")
    if mode == "latest":
        # Chosen from manifests and file sizes alone: the driver reads no payload. Rank 0 of the
        # worker group checks every hash before training from it (rank/session.py).
        held = source.holding()
        if held.newest is None:
            why = "no committed checkpoint" + (f" ({len(held.skipped)} skipped)" if held.skipped else "")
            return ResumeChoice(None, None, f"fresh run: {why} in {store.root.uri}", warnings=held.skipped)
        info = held.newest
        reason = f"newest committed checkpoint (step {info.step})"
        if held.skipped:
            reason += f", after skipping {len(held.skipped)} partial or corrupt"
        return ResumeChoice(info.uri, info.step, reason, info.manifest, held.skipped)
    info = source.open(mode, keep=lambda _name: False).info  # checked, streamed, not held
    if info.manifest is None:
        raise CheckpointError(f"resume_from '{mode}': the checkpoint has no manifest. Fix: use resume_from: latest.")
    choice = ResumeChoice(info.uri, info.step, "resume_from names this checkpoint", info.manifest)
    # Named by its own folder: one of this run's checkpoints, or one of another run's (whose
    # state at its step is not this run's either).
    own = info.location.uri.rstrip("/") == store.root.join(info.name).uri.rstrip("/")
    later = [i for i in store.scan() if i.step > info.step or (not own and i.step == info.step)]
    if any(i.status in ("committed", "corrupt") for i in later):
        choice.branch_step, choice.branch_inclusive = info.step, not own
    return choice


def branch(store: CheckpointStore, choice: ResumeChoice) -> str | None:
    """Start the branch `choice` asks for (after its checks passed); what to tell the user."""
    if choice.branch_step is None:
        return None
    superseded = store.supersede_after(choice.branch_step, inclusive=choice.branch_inclusive)
    if not superseded:
        return None
    names = superseded[0].name if len(superseded) == 1 else f"{superseded[0].name} ... {superseded[-1].name}"
    return (f"resuming from step {choice.branch_step} branches the run: {len(superseded)} later checkpoint(s) "
            f"of the earlier trajectory ({names}) are superseded. Their files stay in {store.root.uri}, with "
            "the manifest renamed to manifest.superseded.json; no run resumes from them, and this run's own "
            "saves take their step names.")


# Spec fields that may differ on every resume without saying so.
_EXPECTED_CHANGES = ("resume_from",)
# Config keys that an optimizer's restored state overrides (param_groups hold them).
_OPTIMIZER_KEYS = ("lr", "learning_rate", "momentum", "weight_decay", "betas", "eps")


def spec_changes(spec: JobSpec, manifest: Manifest | None) -> str | None:
    """One line naming each spec field that differs from the run that wrote the checkpoint."""
    if manifest is None or not manifest.spec:
        return None
    # `env` values may be secrets: both sides are compared as digests (an older manifest holds
    # clear values) and only the names are said.
    old_spec, new_spec = redact_env(manifest.spec), redact_env(spec.to_record())
    old_env, new_env = _env_of(old_spec), _env_of(new_spec)
    old, new = _flatten(_without_env(old_spec)), _flatten(_without_env(new_spec))
    changed = [key for key in sorted(old.keys() | new.keys())
               if old.get(key, _ABSENT) != new.get(key, _ABSENT) and key.split(".")[0] not in _EXPECTED_CHANGES]
    env_changed = [name for name in sorted(old_env.keys() | new_env.keys()) if old_env.get(name) != new_env.get(name)]
    if not changed and not env_changed:
        return None
    parts = [f"{key}: {_show(old.get(key, _ABSENT))} -> {_show(new.get(key, _ABSENT))}" for key in changed]
    parts += [f"env.{name} {_env_change(name, old_env, new_env)}" for name in env_changed]
    line = f"this spec differs from the one that wrote the checkpoint: {'; '.join(parts)}."
    optimizer = [k for k in changed if k.rsplit(".", 1)[-1] in _OPTIMIZER_KEYS
                 and k.startswith(("torch.config.", "lightning.model.init_args."))]
    if optimizer:
        line += (f" Note: {', '.join(optimizer)} reach(es) the optimizer only when it is built; the optimizer state "
                 "restored from the checkpoint then brings back the old value of its param_groups. To train "
                 "with the new value, set it on optimizer.param_groups after the state is restored (after "
                 "ctx.track(), or in on_train_start), or start a fresh run.")
    return line


_ABSENT = object()


def _env_of(record: dict[str, Any]) -> dict[str, Any]:
    env = record.get("env")
    return env if isinstance(env, dict) else {}


def _without_env(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key != "env"}


def _env_change(name: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """added, removed or changed: never the values (secrets, and digests of them)."""
    return "added" if name not in old else "removed" if name not in new else "changed"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(unset)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_compatible(spec: JobSpec, choice: ResumeChoice) -> None:
    manifest = choice.manifest
    if manifest is None:
        return
    if manifest.kind != spec.kind:
        raise CheckpointError(
            f"checkpoint {choice.uri} was written by a '{manifest.kind}' job but this spec is a '{spec.kind}' "
            "job, so its state cannot be loaded. Fix: use another run name, or resume_from: none with --overwrite."
        )
    written, wanted = written_strategy(manifest), spec.strategy
    if written != wanted and (manifest.sharded or spec.sharded):
        field = spec.strategy_field
        raise CheckpointError(
            f"checkpoint {choice.uri} was written with {field}: {written} but this spec uses {wanted}; "
            "converting a checkpoint between these strategies' layouts is not supported. Fix: set "
            f"{field}: {written} to resume it, or start a new run (another name, or resume_from: none)."
        )
    per_node = spec.ranks_per_worker
    low, high = spec.scaling.min_workers * per_node, spec.scaling.num_workers * per_node
    if wanted == "deepspeed":
        _check_deepspeed(spec, choice)
    if not low <= manifest.world_size <= high:
        sizes = f"{high}" if low == high else f"from {low} to {high}"
        log.info("checkpoint %s was written by %d ranks and this run has %s: the data continues at its "
                 "global position%s; each rank's RNG stream starts afresh", choice.uri, manifest.world_size,
                 sizes, " and the sharded state is resharded" if manifest.sharded else "")


def _check_deepspeed(spec: JobSpec, choice: ResumeChoice) -> None:
    """DeepSpeed loads only its own file layout, at the world size that wrote it."""
    written_by, per_node = choice.manifest.world_size, spec.ranks_per_worker
    ranks = spec.scaling.num_workers * per_node
    if written_by != ranks:  # (a DeepSpeed run has one size: elastic is refused)
        fix = (f"scaling.num_workers: {written_by}" if per_node == 1 else
               f"scaling.num_workers x scaling.nproc_per_node = {written_by}")
        raise CheckpointError(
            f"checkpoint {choice.uri} was written by {written_by} DeepSpeed ranks and this run has "
            f"{ranks}: DeepSpeed cannot repartition ZeRO optimizer states for another number of "
            f"ranks. Fix: set {fix} to resume it, or start a new run (another name, or resume_from: none).")
    problem = layout_problem(list(choice.manifest.files), spec.lightning.deepspeed,
                             spec.lightning.trainer.get("precision"))
    if problem:
        raise CheckpointError(
            f"checkpoint {choice.uri} cannot be loaded by DeepSpeed with this spec's settings ({problem}): DeepSpeed "
            "lays its files out by ZeRO stage and precision, and loads only its own layout. Fix: resume with the "
            "lightning.trainer.strategy and precision it was written with, or start a new run (another name, or "
            "resume_from: none).")


def is_finished(spec: JobSpec, manifest: Manifest | None) -> bool:
    """Whether the checkpoint already reached the spec's limits (so there is nothing left to train)."""
    if manifest is None:
        return False
    if spec.lightning:
        limits = spec.lightning.trainer
    else:
        limits = {"max_epochs": spec.torch.max_epochs, "max_steps": spec.torch.max_steps}
    max_epochs, max_steps = limits.get("max_epochs"), limits.get("max_steps")
    if max_steps is not None and max_steps >= 0 and manifest.step >= max_steps:
        return True
    return max_epochs is not None and manifest.epoch >= max_epochs and manifest.batch_in_epoch == 0


def layout_problem(files: list[str], args: dict[str, Any], precision: Any) -> str | None:
    """Why a DeepSpeed checkpoint with these files cannot be loaded with these settings: DeepSpeed's
    file layout follows the ZeRO stage and bf16, and it finds no file of another layout."""
    names = [name for name in files if name.startswith("deepspeed-")]
    written = {"ZeRO-3": any("zero_pp_rank_0_mp_rank_00_model_states" in n for n in names),
               "bf16": any(n.startswith("deepspeed-bf16_") for n in names)}
    wanted = {"ZeRO-3": zero_stage(args) == 3, "bf16": deepspeed_precision(precision).startswith("bf16")}
    differ = [what for what in written if written[what] != wanted[what]]
    if not differ:
        return None
    return "; ".join(f"{what}: {'yes' if written[what] else 'no'} in the checkpoint, "
                     f"{'yes' if wanted[what] else 'no'} in this spec" for what in differ)
