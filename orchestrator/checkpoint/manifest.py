"""The manifest: what a checkpoint holds and how to check it. Written last; its presence commits."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.errors import CheckpointError

MANIFEST_NAME = "manifest.json"
# A checkpoint a later branch of the run superseded keeps its manifest under this name: its files
# stay on storage, but no reader takes it for committed (store.py, `supersede_after`).
SUPERSEDED_NAME = "manifest.superseded.json"
# 2: the manifest holds the spec of the run that wrote it (`spec`). Its `env` values are digests
# since (env_digest); older manifests hold them in clear and read the same. Still 2: a digest is a
# string to an older reader too, which then shows a digest in its spec diff, never a value.
FORMAT_VERSION = 2
# What a manifest keeps of each `env` value: "sha256:" and the first 12 hex digits of its sha256.
# `env` carries secrets (WANDB_API_KEY, HF_TOKEN, ...); a digest still tells a resume that a
# variable changed, and no file or message ever holds the value itself.
ENV_DIGEST_PREFIX = "sha256:"
_ENV_DIGEST = re.compile(r"sha256:[0-9a-f]{12}")


class NewerFormat(CheckpointError):
    """A manifest of a format this version does not know: never mistaken for a corrupt one."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def env_digest(value: Any) -> str:
    """What a manifest keeps of one `env` value. A digest maps to itself, so an older manifest's
    clear value and a newer one's digest of the same value compare equal once both are digested."""
    text = str(value)
    if _ENV_DIGEST.fullmatch(text):
        return text
    return ENV_DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]


def redact_env(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec record (JobSpec.to_record()) with every `env` value a digest; `spec` itself is left as it is."""
    env = spec.get("env") if isinstance(spec, dict) else None
    if not isinstance(env, dict) or not env:
        return spec
    return {**spec, "env": {name: env_digest(value) for name, value in env.items()}}


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
    # True: every rank wrote its own files (FSDP: any number of ranks can load it, resharded;
    # DeepSpeed: the same number of ranks).
    sharded: bool = False
    # How the ranks shared the model: "ddp", "fsdp" or "deepspeed" ("" in older manifests: fsdp
    # when sharded, else ddp).
    strategy: str = ""
    # Samples of the current epoch trained on by all ranks together: the data's global position.
    consumed: int = 0
    # The job spec of the run that wrote it (JobSpec.to_record()), each `env` value a digest
    # (redact_env): a resume with another spec says what changed.
    spec: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    format: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        # Here, not only in to_json: a manifest in memory (the one being written, or an older one
        # read back with clear values) reaches callbacks, events and messages too.
        self.spec = redact_env(self.spec)

    def to_json(self) -> bytes:
        record = asdict(self)
        record["spec"] = redact_env(record["spec"])  # (again: `spec` may have been reassigned since)
        return json.dumps(record, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, source: str = "manifest") -> Manifest:
        raw: dict[str, Any] = json.loads(data)
        written = raw.get("format", FORMAT_VERSION)
        if isinstance(written, int) and written > FORMAT_VERSION:
            raise NewerFormat(
                f"checkpoint {source} was written by a newer orchestrator (manifest format {written}; this "
                f"version reads format {FORMAT_VERSION} and older), so it cannot be read or safely skipped. "
                "Fix: upgrade orchestrator (on the driver and every node) to the version that wrote it, or "
                "start a new run under another name."
            )
        raw["files"] = {name: FileEntry(**entry) for name, entry in raw["files"].items()}
        return cls(**raw)


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    import importlib.metadata as md

    versions = {}
    for dist in ("torch", "ray", "lightning", "pyarrow", "orchestrator"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return tuple(versions.items())


def library_versions() -> dict[str, str]:
    """The versions that wrote a checkpoint; looked up once per process
    (importlib.metadata searches every path entry for each library)."""
    return dict(_installed_versions())


def written_strategy(manifest: Manifest) -> str:
    """The strategy a checkpoint was written with (older manifests do not name it)."""
    return manifest.strategy or ("fsdp" if manifest.sharded else "ddp")
