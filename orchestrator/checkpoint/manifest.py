"""The manifest: what a checkpoint holds and how to check it. Written last; its presence commits."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FileEntry:
    size: int
    sha256: str


@dataclass
class Manifest:
    step: int
    epoch: int
    # Micro-batches of the current epoch one rank trained on (0 at an epoch boundary).
    batch_in_epoch: int
    world_size: int
    # "lightning" or "torch": which harness can load it.
    kind: str
    files: dict[str, FileEntry]
    metrics: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    # Why it was written: "steps", "seconds", "epoch_end", "end", "preemption".
    reason: str = "steps"
    # True: every rank wrote its own file (FSDP); any number of ranks can load it (resharded).
    sharded: bool = False
    # Samples of the current epoch trained on by all ranks together: the data's global position.
    consumed: int = 0
    created_at: float = field(default_factory=time.time)
    format: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        raw: dict[str, Any] = json.loads(data)
        raw["files"] = {name: FileEntry(**entry) for name, entry in raw["files"].items()}
        return cls(**raw)


def library_versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {}
    for dist in ("torch", "ray", "lightning", "pyarrow", "orchestrator"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return versions
