"""One real run of the torch job killed at several phases of its own saves, and what storage held at each kill.

The run is `orchestrator run` of tests/helpers/specs.py's torch spec in local mode, with the store's
test-only kill switch (orchestrator/checkpoint/phases.py) in the spec's `env:`, so it reaches the
ranks alone: rank 0's background writer SIGKILLs its rank at each listed phase once (a marker
each), the agent restarts the ranks in place, and they resume. A watcher in the test lists the
run's checkpoints as soon as a kill's marker appears, long before the restarted ranks (a new
Python, torch, a rendezvous, the restore, steps) can commit anything: what was committed at that
kill is read there from the storage itself (a `step-N` folder with a `manifest.json`; on S3 the
objects), not from the product's own store code or records. A listing taken late could only show
the restarted ranks' own saves and deletions too, which fails the test's checks, never passes them.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from cli_runs import run_command

from orchestrator import storage
from orchestrator.checkpoint import phases
from orchestrator.observe.result import RunResult

NAME = "killed"
# The switch's variables (phases.py): named here, so that a product without them fails the run, not the import.
KILL_ENV, MARKERS_ENV = "ORCHESTRATOR_TEST_KILL_AT", "ORCHESTRATOR_TEST_KILL_MARKERS"
STEP = re.compile(r"^step-(\d+)$")
# The marker's name for one kill point: phases.py names it so.
MARKER = "{phase}@{step}"


@dataclass
class Listing:
    """The run's checkpoints folder as storage shows it: steps with a manifest, and everything else."""

    committed: set[int] = field(default_factory=set)
    # Names that are not a committed checkpoint: staging folders, half-deleted or manifest-less ones.
    leftovers: set[str] = field(default_factory=set)


def list_local(folder: str) -> Listing:
    listing = Listing()
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = STEP.match(name)
        if match and os.path.exists(os.path.join(folder, name, "manifest.json")):
            listing.committed.add(int(match.group(1)))
        else:
            listing.leftovers.add(name)
    return listing


def s3_lister(storage_uri: str, run: str, credentials: dict[str, str]):
    """A function listing run `run`'s checkpoints under `storage_uri` on the loopback S3 server,
    with boto3 (not pyarrow, which the product's store uses)."""
    import boto3

    parts = urlsplit(storage_uri)
    endpoint = parse_qs(parts.query)["endpoint_override"][0]
    client = boto3.client("s3", endpoint_url=f"http://{endpoint}", region_name=credentials["AWS_DEFAULT_REGION"],
                          aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"])
    prefix = f"{parts.path.strip('/')}/{run}/checkpoints/"

    def listing() -> Listing:
        names: dict[str, set[str]] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=parts.netloc, Prefix=prefix):
            for item in page.get("Contents", []):
                folder, _, rest = item["Key"][len(prefix):].partition("/")
                if folder:  # not the folder's own marker object ("checkpoints/")
                    names.setdefault(folder, set()).add(rest)
        result = Listing()
        for folder, objects in names.items():
            match = STEP.match(folder)
            if match and "manifest.json" in objects:
                result.committed.add(int(match.group(1)))
            else:
                result.leftovers.add(folder)
        return result

    return listing


@dataclass
class Kill:
    phase: str
    step: int
    # What storage held right after it, and what the killed process wrote in its marker.
    seen: Listing
    marker: dict


@dataclass
class KilledRun:
    result: RunResult
    output: str
    kills: list[Kill]  # in the order they happened
    planned: list[str]
    final: Listing


class _Watcher(threading.Thread):
    """Lists the checkpoints the moment each marker appears, in the order they appear."""

    def __init__(self, markers: str, listing):
        super().__init__(daemon=True)
        self.markers, self.listing = markers, listing
        self.seen: list[tuple[str, Listing]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        known: set[str] = set()
        while not self.stop.is_set():
            for name in sorted(set(os.listdir(self.markers)) - known):
                known.add(name)
                self.seen.append((name, self.listing()))
            time.sleep(0.05)


def kill_plan(where: str) -> list[str]:
    """A kill point for every unsharded phase, one save each (every_n_steps 10): retention's is
    numbered by the step it deletes. An object store has no rename, so no `published`."""
    names = [p for p in phases.UNSHARDED if p != "retention" and not (where == "s3" and p == "published")]
    return [MARKER.format(phase=p, step=10 * (i + 1)) for i, p in enumerate(names)] + ["retention@40"]


def run_killed_at_every_phase(spec: dict, folder: str, plan: list[str], listing, *, timeout: float = 1100) -> KilledRun:
    markers = os.path.join(folder, "kill-markers")
    os.makedirs(markers)
    spec = {**spec, "env": {**spec.get("env", {}), KILL_ENV: ",".join(plan), MARKERS_ENV: markers}}
    watcher = _Watcher(markers, listing)
    watcher.start()
    try:
        done = run_command(spec, folder, timeout=timeout)
    finally:
        watcher.stop.set()
        watcher.join()
    output = done.stdout + done.stderr
    result = RunResult.load(storage.resolve(str(spec["storage"])).join(spec["name"]))
    if done.returncode != 0 or result is None:
        raise AssertionError(f"`orchestrator run` exited {done.returncode}:\n{output[-5000:]}")
    kills = []
    for name, seen in watcher.seen:
        phase, _, step = name.partition("@")
        with open(os.path.join(markers, name)) as f:
            kills.append(Kill(phase, int(step), seen, json.load(f)))
    return KilledRun(result, output, kills, plan, listing())
