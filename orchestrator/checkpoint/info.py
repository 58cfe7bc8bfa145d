"""What the store knows of one checkpoint folder: its name, step, status and manifest."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.checkpoint.manifest import Manifest
from orchestrator.storage import Location


@dataclass
class CheckpointInfo:
    name: str
    location: Location
    step: int
    # committed | partial (no manifest: an interrupted write) | corrupt (manifest or files wrong)
    # | superseded (a later branch of the run set it aside: files kept, never resumed from)
    status: str
    manifest: Manifest | None = None
    problem: str = ""

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def size_bytes(self) -> int:
        return sum(e.size for e in self.manifest.files.values()) if self.manifest else 0
