"""The layout of a run's directory, `<storage>/<name>/`, named in one place.

    checkpoints/step-<N>/   committed checkpoints (checkpoint/store.py)
    summary.json            the run's outcome (result.py)
    history/                each driver's part of the run, for `orchestrator report` (history.py)
    lease.json              which driver may write the run now (checkpoint/lease.py)
    leases/                 one claim file per lease generation, for exclusive takeovers
    storage-marker.json     written by the driver at start; every worker must read it back
    logs/                   the workers' log files (local and shared filesystems only), and at a hang each
                            rank's flight record, rank-N.flight-recorder.json (agent/flight_records.py)
    logs/lightning/<kind>/  Lightning loggers from the spec (csv, tensorboard, ...), continued by resumes
    _ray/                   Ray Train's own run state
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from orchestrator import storage
from orchestrator.storage import Location


@dataclass(frozen=True)
class RunDir:
    location: Location

    @classmethod
    def of(cls, storage_uri: str, name: str) -> RunDir:
        """The run `name` under the spec's storage (on the driver: see `storage.resolve_root`)."""
        return cls(storage.resolve_root(storage_uri).join(name))

    @classmethod
    def at(cls, run_uri: str) -> RunDir:
        return cls(storage.resolve(run_uri))

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def checkpoints(self) -> Location:
        return self.location.join("checkpoints")

    @property
    def summary(self) -> Location:
        return self.location.join("summary.json")

    @property
    def lease(self) -> Location:
        return self.location.join("lease.json")

    @property
    def lease_claims(self) -> Location:
        return self.location.join("leases")

    @property
    def storage_marker(self) -> Location:
        return self.location.join("storage-marker.json")

    @property
    def ray(self) -> Location:
        return self.location.join("_ray")

    @property
    def logs(self) -> str | None:
        """Worker logs live here when the run directory is on a local or shared filesystem."""
        return self.location.join("logs").path if self.location.is_local else None

    @property
    def lightning_logs(self) -> str | None:
        """Where Lightning loggers from the spec write, one folder per kind (local and shared filesystems)."""
        return self.location.join("logs").join("lightning").path if self.location.is_local else None


# --- the storage marker: is the run directory the same for every node? --------------------------

def write_storage_marker(run_dir: RunDir, host: str) -> str:
    """The driver's marker, with a fresh nonce that the workers must read back; returns the nonce."""
    nonce = uuid.uuid4().hex
    body = {"nonce": nonce, "written_by": host, "written_at": time.time()}
    storage.write_atomic(run_dir.storage_marker, json.dumps(body).encode())
    return nonce


def storage_marker_problem(run_dir: RunDir, nonce: str) -> str | None:
    """None when this process reads the driver's marker; else what it found instead."""
    try:
        body = json.loads(storage.read_bytes(run_dir.storage_marker))
    except FileNotFoundError:
        return f"{run_dir.storage_marker.uri} does not exist here"
    except (OSError, ValueError) as exc:
        return f"{run_dir.storage_marker.uri} could not be read ({type(exc).__name__}: {exc})"
    if body.get("nonce") != nonce:
        return f"{run_dir.storage_marker.uri} holds another run start's marker (written by {body.get('written_by')})"
    return None
