"""Several checkpoint sources asked nearest first, and the newest step every rank can get from them.

A rank's sources are ordered nearest first (its node's memory, a buddy node's copy, then storage;
today storage alone). A step is one every rank can get when a source that is the same on every
rank holds it (storage), or when each rank's own sources hold it; the group resumes from the
newest such step. Opening a step asks each source in turn: one that does not hold it (NotHeld) is
passed silently, one whose copy fails verification is passed with a warning naming it, and the
last source's answer stands, whatever it is, so with storage alone every error is the store's own.
Any other error of a nearer source (CheckpointUnreadable among them) is raised as it is: it says
nothing of the step, and the start that met it is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

from orchestrator.checkpoint.info import CheckpointInfo
from orchestrator.checkpoint.source import CheckpointSource, Holding, Keep, NotHeld, Restored
from orchestrator.errors import CheckpointError

log = logging.getLogger(__name__)

T = TypeVar("T")


def newest_every_rank_can_get(shared: Collection[int], local: Sequence[Collection[int]] | None) -> int | None:
    """The newest step in `shared` (held for every rank alike) or in every rank's `local` steps
    (one collection per rank, in rank order; None: no rank has a source of its own)."""
    steps = set(shared)
    if local:
        steps |= set.intersection(*(set(held) for held in local))
    return max(steps, default=None)


class NearestFirst(CheckpointSource):
    """The sources of one rank, nearest first, as one source."""

    def __init__(self, sources: Sequence[CheckpointSource]):
        assert sources, "a rank reads its checkpoints from at least one source"
        self.sources = list(sources)
        self.same_on_every_rank = all(source.same_on_every_rank for source in self.sources)
        self.name = " then ".join(source.name for source in self.sources)

    def holding(self) -> Holding:
        """Every step some source holds for this rank, with the nearest source's info of it."""
        return self._ask_all()[0]

    def local_steps(self) -> list[int]:
        """The steps this rank's own sources hold (those not the same on every rank): what the
        ranks gather before the choice. Empty without such a source, and then nothing is gathered."""
        steps: set[int] = set()
        for source in self.sources:
            if not source.same_on_every_rank:
                steps.update(source.holding().by_step)
        return sorted(steps)

    def newest_every_rank_can_get(self, local: Sequence[Collection[int]] | None = None) -> CheckpointInfo | None:
        """This rank's info of the newest step every rank can get; `local`: every rank's
        `local_steps()`, gathered (None when every source is the same on every rank)."""
        held, shared = self._ask_all()
        step = newest_every_rank_can_get(shared, local)
        return held.by_step.get(step) if step is not None else None

    def _ask_all(self) -> tuple[Holding, set[int]]:
        """Every source's holding, once: merged (the nearer source's info wins), and the steps of
        the sources that are the same on every rank."""
        held, shared = Holding(), set()
        for source in reversed(self.sources):
            part = source.holding()
            held.by_step.update(part.by_step)
            held.skipped += part.skipped
            if source.same_on_every_rank:
                shared.update(part.by_step)
        return held, shared

    def open(self, uri: str, keep: Keep | None = None, *, verify_all: bool = True) -> Restored:
        return self._first(uri, lambda source: source.open(uri, keep, verify_all=verify_all))

    def read(self, info: CheckpointInfo, fname: str) -> bytes:
        return self._first(f"{info.uri}/{fname}", lambda source: source.read(info, fname))

    def _first(self, what: str, ask: Callable[[CheckpointSource], T]) -> T:
        """The first source's answer that is not a miss or a verified fault; the last one's always."""
        for source in self.sources[:-1]:
            try:
                return ask(source)
            except NotHeld:
                continue
            except CheckpointError as exc:
                log.warning("%s from %s failed its check (%s); reading it from the next source instead",
                            what, source.name, exc)
        return ask(self.sources[-1])
