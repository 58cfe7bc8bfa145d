"""Where a rank gets a checkpoint from: the interface every checkpoint source implements.

A source answers two questions, and nothing else is asked of it at a start:
- `holding()`: which committed steps it can give this rank, read from manifests alone (no payload);
- `open(uri, keep)` and `read(info, fname)`: one step's parts for this rank, each checked against
  the manifest's sha256 before it is returned.

The store (store_source.py) is the first implementation; nearest.py asks several, nearest first,
and says which step every rank can get. A source keeps the store's error contract, so the resume
choice (rank/session.py, driver/resume.py) treats every source alike:
- CheckpointError (CorruptCheckpoint among them): a verified fault, or nothing at that name;
- NotHeld: this source has no such step or part (the next source is asked, without a warning);
- CheckpointUnreadable: the source failed every retry, and nothing is known to be wrong.

A checkpoint is named by its storage URI on every source (`<run>/checkpoints/step-<N>`), held there
yet or not: one name per step, whichever source serves it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.checkpoint.info import CheckpointInfo
from orchestrator.checkpoint.manifest import Manifest
from orchestrator.errors import CheckpointError

# Which of a checkpoint's files a rank holds in memory once opened (by file name); None: all.
Keep = Callable[[str], bool]


class NotHeld(CheckpointError):
    """A source has no such checkpoint or part: not a fault, the next source may have it."""


@dataclass
class Restored:
    """A checkpoint opened for this rank: what its source knows of it and its verified file contents
    (the files `keep` accepted; the others are read on demand, `CheckpointSource.read`)."""

    info: CheckpointInfo
    files: dict[str, bytes]
    # Which source served it ("storage"; a memory tier names its own).
    source: str = "storage"

    @property
    def manifest(self) -> Manifest:
        assert self.info.manifest is not None
        return self.info.manifest


@dataclass
class Holding:
    """What a source can give this rank now: its committed checkpoints by step, and a warning for
    each newer one it passed over (partial or corrupt), for the user."""

    by_step: dict[int, CheckpointInfo] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def newest(self) -> CheckpointInfo | None:
        return self.by_step[max(self.by_step)] if self.by_step else None

    @property
    def steps(self) -> list[int]:
        return sorted(self.by_step)


class CheckpointSource(ABC):
    """One place a rank can restore a checkpoint from (storage, a node's memory, a buddy's copy)."""

    # Said with each restore (`Restored.source`).
    name: str = "storage"
    # Whether every rank holds what this rank holds (shared storage: yes; a node's memory: no).
    # Only sources that are not are gathered over the ranks before the resume choice.
    same_on_every_rank: bool = True

    @abstractmethod
    def holding(self) -> Holding:
        """The committed steps this source can give this rank, from manifests and sizes alone."""

    @abstractmethod
    def open(self, uri: str, keep: Keep | None = None, *, verify_all: bool = True) -> Restored:
        """The checkpoint named `uri`, its files `keep` accepts held in memory, each checked.

        `verify_all`: check every file this source has of it, streamed and not held (whoever
        decides for the group); without, only the kept ones (a rank loading what was decided).
        """

    @abstractmethod
    def read(self, info: CheckpointInfo, fname: str) -> bytes:
        """One file of an opened checkpoint that was not kept, checked against its checksum."""
