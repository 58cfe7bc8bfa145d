"""TrainState: everything that makes a resume exact, saved together and restored together.

A checkpoint of the plain-torch path is one TrainState:
- `progress`: epoch, global step, the position inside the epoch, and the last metrics. The data
  position is one number, `consumed`: the samples of the epoch already trained on. The epoch's
  order is a function of (seed, epoch) alone (orchestrator/data/order.py), so (epoch, consumed)
  says exactly which sample is next, at any world size;
- `objects`: the state_dict() of every tracked object (model, optimizer, LR scheduler, grad
  scaler, ...);
- `ranks`: each rank's RNG states (python, numpy, torch, cuda), in rank order.

The Lightning path keeps the same parts inside Lightning's own checkpoint dict: its loops hold the
progress, the stateful data loader its position, and our RANKS_KEY the per-rank RNG states.

Only tensors, numbers, strings and containers: the file loads with torch.load(weights_only=True).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """Where training stands: the part of TrainState that is not tensors."""

    epoch: int = 0
    # Optimizer steps taken since the run began.
    step: int = 0
    # Micro-batches of `epoch` this rank has trained on, at the world size that wrote it (0 at an
    # epoch boundary); for display. The position that resume uses is `consumed`.
    batch_in_epoch: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    # Plain-torch path: which of the loop's ctx.data_loader()s (in creation order) is the
    # training loader, whose position batch_in_epoch is.
    train_loader: int = 0
    # Samples of `epoch` trained on by all ranks together: the epoch's global position.
    consumed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "batch_in_epoch": self.batch_in_epoch,
                "metrics": dict(self.metrics), "train_loader": self.train_loader,
                "consumed": self.consumed}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Progress:
        return cls(epoch=raw["epoch"], step=raw["step"], batch_in_epoch=raw["batch_in_epoch"],
                   metrics=dict(raw.get("metrics", {})), train_loader=int(raw.get("train_loader", 0)),
                   consumed=int(raw.get("consumed", 0)))


@dataclass
class TrainState:
    progress: Progress
    # state_dict() of each tracked object, by the name it was tracked under.
    objects: dict[str, Any]
    # One entry per rank, in rank order: {"rng": capture_rng()}.
    ranks: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"progress": self.progress.to_dict(), "objects": self.objects, "ranks": self.ranks}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainState:
        return cls(progress=Progress.from_dict(raw["progress"]), objects=dict(raw["objects"]),
                   ranks=list(raw.get("ranks") or []))

    def rng_of(self, rank: int, world_size: int) -> dict[str, Any] | None:
        """This rank's RNG state, if the state was saved by the same number of ranks."""
        return self.ranks[rank]["rng"] if len(self.ranks) == world_size else None
