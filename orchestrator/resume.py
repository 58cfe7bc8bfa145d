"""Which checkpoint a run starts from, and why: the driver's half of `resume_from`.

latest: the newest committed checkpoint, by its manifest and file sizes (partial or corrupt ones
are skipped with a warning naming them; the worker group checks the hashes before loading it);
none: a fresh run, refused if the run directory already holds checkpoints unless the user asks
to overwrite; <uri>: exactly that checkpoint or a clear error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from orchestrator.checkpoint import CheckpointStore, Manifest
from orchestrator.checkpoint.manifest import written_strategy
from orchestrator.errors import CheckpointError, UserError
from orchestrator.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass
class ResumeChoice:
    uri: str | None
    step: int | None
    reason: str
    manifest: Manifest | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"uri": self.uri, "step": self.step, "reason": self.reason, "skipped": self.warnings}


def choose(spec: JobSpec, store: CheckpointStore, *, overwrite: bool = False) -> ResumeChoice:
    mode = spec.resume_from
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
        # worker group checks every hash before training from it (runtime/session.py).
        selection = store.latest_committed()
        if selection.info is None:
            why = "no committed checkpoint" + (f" ({len(selection.skipped)} skipped)" if selection.skipped else "")
            return ResumeChoice(None, None, f"fresh run: {why} in {store.root.uri}", warnings=selection.skipped)
        info = selection.info
        reason = f"newest committed checkpoint (step {info.step})"
        if selection.skipped:
            reason += f", after skipping {len(selection.skipped)} partial or corrupt"
        return ResumeChoice(info.uri, info.step, reason, info.manifest, selection.skipped)
    info, _ = store.open_uri(mode, keep=lambda _name: False)  # checked, streamed, not held
    if info.manifest is None:
        raise CheckpointError(f"resume_from '{mode}': the checkpoint has no manifest. Fix: use resume_from: latest.")
    return ResumeChoice(info.uri, info.step, "resume_from names this checkpoint", info.manifest)


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
    low, high = spec.scaling.min_workers, spec.scaling.num_workers
    if wanted == "deepspeed":
        _check_deepspeed(spec, choice)
    if not low <= manifest.world_size <= high:
        sizes = f"{high}" if low == high else f"from {low} to {high}"
        log.info("checkpoint %s was written by %d workers and this run has %s: the data continues at its "
                 "global position%s; each rank's RNG stream starts afresh", choice.uri, manifest.world_size,
                 sizes, " and the sharded state is resharded" if manifest.sharded else "")


def _check_deepspeed(spec: JobSpec, choice: ResumeChoice) -> None:
    """DeepSpeed loads only its own file layout, at the world size that wrote it."""
    from orchestrator.spec_deepspeed import layout_problem

    written_by = choice.manifest.world_size
    if written_by != spec.scaling.num_workers:  # (a DeepSpeed run has one size: elastic is refused)
        raise CheckpointError(
            f"checkpoint {choice.uri} was written by {written_by} DeepSpeed ranks and this run has "
            f"{spec.scaling.num_workers}: DeepSpeed cannot repartition ZeRO optimizer states for another number of "
            f"ranks. Fix: set scaling.num_workers: {written_by} to resume it, or start a new run (another name, or "
            "resume_from: none).")
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
