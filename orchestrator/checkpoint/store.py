"""One store for every checkpoint of a run: `<run_dir>/checkpoints/step-<N>/`.

Commit protocol. The files of a checkpoint are written first, its manifest (sizes and sha256 of
every file) last; a checkpoint is committed exactly when `step-<N>/manifest.json` exists. On a
local filesystem the whole folder is built under a temporary name and renamed into place, which
is atomic; on an object store each object appears whole when its upload completes, so writing the
manifest last gives the same guarantee. Readers therefore only ever take committed checkpoints,
and loading re-checks every checksum, falling back to the previous checkpoint with a warning
when one turns out partial or corrupt.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from orchestrator import storage
from orchestrator.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, library_versions, sha256_hex
from orchestrator.errors import CheckpointError
from orchestrator.storage import Location

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"


class CorruptCheckpoint(Exception):
    """A checkpoint failed verification; `reason` says what was wrong."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass
class CheckpointInfo:
    name: str
    location: Location
    step: int
    # committed | partial (no manifest: an interrupted write) | corrupt (manifest or files wrong)
    status: str
    manifest: Manifest | None = None
    problem: str = ""

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def size_bytes(self) -> int:
        return sum(e.size for e in self.manifest.files.values()) if self.manifest else 0


@dataclass
class Selection:
    """The checkpoint chosen to resume from (None: start fresh) and why others were passed over."""

    info: CheckpointInfo | None
    files: dict[str, bytes]
    skipped: list[str]


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


class CheckpointStore:
    def __init__(self, run_dir: Location):
        self.run_dir = run_dir
        self.root = run_dir.join(CHECKPOINTS_DIR)

    @classmethod
    def for_run(cls, run_uri: str) -> CheckpointStore:
        return cls(storage.resolve(run_uri))

    # --- reading -----------------------------------------------------------------------------

    def scan(self) -> list[CheckpointInfo]:
        """Every checkpoint folder, oldest first, with a status from its manifest and file sizes."""
        infos = []
        for entry in storage.list_dir(self.root):
            if entry.type != pafs.FileType.Directory:
                continue
            if entry.base_name.startswith(TMP_PREFIX):
                step = _tmp_step(entry.base_name)
                loc = self.root.join(entry.base_name)
                infos.append(CheckpointInfo(entry.base_name, loc, step, "partial", problem="write never committed"))
                continue
            match = STEP_DIR.match(entry.base_name)
            if match:
                infos.append(self._inspect(entry.base_name, int(match.group(1))))
        return sorted(infos, key=lambda i: (i.step, i.status == "committed"))

    def committed(self) -> list[CheckpointInfo]:
        return [i for i in self.scan() if i.status == "committed"]

    def _inspect(self, name: str, step: int) -> CheckpointInfo:
        return inspect_location(self.root.join(name), name, step)

    def read_files(self, info: CheckpointInfo, keep: Callable[[str], bool] | None = None, *,
                   verify_all: bool = True) -> dict[str, bytes]:
        """The files of a committed checkpoint, each checked against its manifest checksum.

        Only the files `keep` accepts are returned. With `verify_all`, every file is read and
        checked (whoever decides which checkpoint a group resumes from); without, only the kept
        ones (a rank loading the checkpoint already chosen for it reads only its own shard).
        """
        if info.status != "committed" or info.manifest is None:
            raise CorruptCheckpoint(info.name, info.problem or info.status)
        files = {}
        for fname, entry in info.manifest.files.items():
            if not verify_all and keep is not None and not keep(fname):
                continue
            try:
                data = storage.read_bytes(info.location.join(fname))
            except (OSError, FileNotFoundError) as exc:
                raise CorruptCheckpoint(info.name, f"file '{fname}' unreadable ({exc})") from None
            if len(data) != entry.size or sha256_hex(data) != entry.sha256:
                raise CorruptCheckpoint(info.name, f"file '{fname}' fails its sha256 check")
            if keep is None or keep(fname):
                files[fname] = data
        return files

    def verify(self, info: CheckpointInfo) -> CheckpointInfo:
        """Full check of every checksum; returns the info with its status updated."""
        if info.status == "committed":
            try:
                self.read_files(info)
            except CorruptCheckpoint as exc:
                info.status, info.problem = "corrupt", exc.reason
        return info

    def latest_loadable(self, keep: Callable[[str], bool] | None = None) -> Selection:
        """The newest checkpoint that verifies, its files, and a warning for each one skipped."""
        skipped: list[str] = []
        for info in reversed(self.scan()):
            if info.name.startswith(TMP_PREFIX):
                continue  # never committed; not worth a warning on every start
            try:
                files = self.read_files(info, keep)
            except CorruptCheckpoint as exc:
                skipped.append(f"skipped checkpoint {info.uri}: {exc.reason}")
                log.warning(skipped[-1])
                continue
            return Selection(info, files, skipped)
        return Selection(None, {}, skipped)

    def open_uri(self, uri: str, keep: Callable[[str], bool] | None = None, *,
                 verify_all: bool = True) -> tuple[CheckpointInfo, dict[str, bytes]]:
        """Exactly the checkpoint at `uri` (resume_from: <uri>), or a CheckpointError saying why not."""
        loc = storage.resolve(uri)
        name = os.path.basename(loc.path.rstrip("/"))
        match = STEP_DIR.match(name)
        if loc.fs.get_file_info(loc.path).type != pafs.FileType.Directory:
            raise CheckpointError(
                f"resume_from '{uri}': no checkpoint folder exists there. Fix: pick one listed by "
                "`orchestrator checkpoints <run>` or use resume_from: latest."
            )
        info = inspect_location(loc, name, int(match.group(1)) if match else -1)
        try:
            return info, self.read_files(info, keep, verify_all=verify_all)
        except CorruptCheckpoint as exc:
            raise CheckpointError(
                f"resume_from '{uri}': the checkpoint is {info.status if info.status != 'committed' else 'corrupt'} "
                f"({exc.reason}) and cannot be loaded. Fix: pick a committed checkpoint from "
                "`orchestrator checkpoints <run> --verify`, or use resume_from: latest."
            ) from None

    # --- writing -----------------------------------------------------------------------------

    def commit(self, manifest: Manifest, files: dict[str, bytes]) -> CheckpointInfo:
        """Write `files` and their manifest as checkpoint `step-<manifest.step>`, atomically."""
        manifest.files = {n: FileEntry(size=len(d), sha256=sha256_hex(d)) for n, d in files.items()}
        manifest.versions = manifest.versions or library_versions()
        name = step_dir_name(manifest.step)
        final = self.root.join(name)
        existing = self._already_committed(final, name, manifest.step)
        if existing is not None:
            return existing
        storage.ensure_dir(self.root)
        if final.is_local:
            staging = self.root.join(f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
            self._write_all(staging, manifest, files)
            self._publish_local(staging, final)
        else:
            self._write_all(final, manifest, files)
        return CheckpointInfo(name, final, manifest.step, "committed", manifest)

    def _already_committed(self, final: Location, name: str, step: int) -> CheckpointInfo | None:
        """A whole checkpoint already committed at this step, which a new write must not replace.

        Resume is exact, so a second save of step N holds the same training state; replacing the
        first would open a window in which a crash leaves no checkpoint at step N at all.
        """
        info = inspect_location(final, name, step)
        if info.status != "committed":
            return None
        log.info("checkpoint %s is already committed; keeping it", final.uri)
        return info

    def _publish_local(self, staging: Location, final: Location) -> None:
        """Rename a fully written local folder into place (the commit).

        Only a leftover that is not a committed checkpoint (an interrupted write at the same
        step) can stand in the way; it is moved aside first, then removed.
        """
        if os.path.exists(final.path):
            leftover = self._doomed_name(final)
            os.rename(final.path, leftover)
            self._remove_local(leftover)
        os.rename(staging.path, final.path)

    # --- sharded state (FSDP/DeepSpeed): every rank writes its own shard -------------------------

    def _staging(self, step: int, token: str) -> Location:
        name = step_dir_name(step)
        if self.root.is_local:
            return self.root.join(f"{TMP_PREFIX}{name}-{token}")
        return self.root.join(name)  # object stores: the manifest written last is the commit

    def write_shard(self, step: int, token: str, rank: int, files: dict[str, bytes]) -> None:
        """One rank's part of checkpoint `step`. `token` must be the same on every rank for this save."""
        name = step_dir_name(step)
        if self._already_committed(self.root.join(name), name, step) is not None:
            return  # on an object store the shard would overwrite committed files in place
        loc = self._staging(step, token)
        storage.ensure_dir(loc)
        entries = {}
        for fname, data in files.items():
            storage.write_bytes(loc.join(fname), data)
            entries[fname] = {"size": len(data), "sha256": sha256_hex(data)}
        # The shard's own receipt, written after its files: its presence means the shard is whole.
        storage.write_atomic(loc.join(f"shard-{rank:05d}.json"), json.dumps(entries).encode())

    def commit_shards(self, manifest: Manifest, token: str, *, timeout_s: float = 600.0,
                      poll_s: float = 0.2) -> CheckpointInfo:
        """Rank 0: once every rank's shard receipt is present, write the manifest and publish."""
        name = step_dir_name(manifest.step)
        final = self.root.join(name)
        existing = self._already_committed(final, name, manifest.step)
        if existing is not None:  # write_shard skipped it on every rank too
            return existing
        loc = self._staging(manifest.step, token)
        receipts = [loc.join(f"shard-{r:05d}.json") for r in range(manifest.world_size)]
        deadline = time.monotonic() + timeout_s
        while not all(storage.exists(r) for r in receipts):
            if time.monotonic() > deadline:
                missing = [r.path.rsplit("/", 1)[-1] for r in receipts if not storage.exists(r)]
                raise TimeoutError(f"checkpoint step {manifest.step} not committed: shards {missing} "
                                   f"still missing in {loc.uri} after {timeout_s:.0f} s. Every worker writes "
                                   "its own shard there, so the storage must be shared by every node "
                                   "(a shared mount or an object store)")
            time.sleep(poll_s)
        files = {}
        for receipt in receipts:
            for fname, entry in json.loads(storage.read_bytes(receipt)).items():
                files[fname] = FileEntry(**entry)
        manifest.files = files
        manifest.versions = manifest.versions or library_versions()
        storage.write_bytes(loc.join(MANIFEST_NAME), manifest.to_json())
        if loc.is_local:
            self._publish_local(loc, final)
        return CheckpointInfo(name, final, manifest.step, "committed", manifest)

    def _write_all(self, loc: Location, manifest: Manifest, files: dict[str, bytes]) -> None:
        storage.ensure_dir(loc)
        for fname, data in files.items():
            storage.write_bytes(loc.join(fname), data)
            if loc.is_local:
                _fsync(loc.join(fname).path)
        storage.write_bytes(loc.join(MANIFEST_NAME), manifest.to_json())
        if loc.is_local:
            _fsync(loc.join(MANIFEST_NAME).path)

    def delete(self, info: CheckpointInfo) -> None:
        """Remove a checkpoint so that no reader ever sees it half-deleted.

        Locally the folder is first renamed out of view; on an object store the manifest goes
        first, so a concurrent reader sees an uncommitted checkpoint, never a committed one with
        missing files.
        """
        if info.location.is_local:
            doomed = self._doomed_name(info.location)
            try:
                os.rename(info.location.path, doomed)
            except FileNotFoundError:
                return
            self._remove_local(doomed)
        else:
            manifest = info.location.join(MANIFEST_NAME)
            if storage.exists(manifest):
                info.location.fs.delete_file(manifest.path)
            info.location.fs.delete_dir(info.location.path)

    def retain(self, keep_last: int | None, keep_best: tuple[int, str, str] | None = None) -> list[CheckpointInfo]:
        """Delete committed checkpoints that no rule keeps, and stale partial ones.

        Kept: the newest `keep_last`, the best `k` by `monitor` (`mode` min or max) among those
        whose manifest has that metric, and always the newest committed checkpoint. Partial
        folders older than the newest are leftovers of interrupted writes; newer ones may be a
        write still in flight and are kept.
        """
        infos = self.scan()
        committed = [i for i in infos if i.status == "committed"]
        if not committed:
            return []
        newest = committed[-1]
        keep = {newest.name}
        keep.update(i.name for i in (committed[-keep_last:] if keep_last is not None else committed))
        if keep_best is not None:
            k, monitor, mode = keep_best
            scored = [i for i in committed if monitor in i.manifest.metrics]
            scored.sort(key=lambda i: i.manifest.metrics[monitor], reverse=(mode == "max"))
            keep.update(i.name for i in scored[:k])
        doomed = [i for i in committed if i.name not in keep]
        doomed += [i for i in infos if i.status != "committed" and i.step < newest.step
                   and not i.name.startswith(f"{TMP_PREFIX}deleting")]
        for info in doomed:
            try:
                self.delete(info)
            except OSError as exc:  # a failed deletion must not stop training; the next pass retries
                log.warning("could not delete checkpoint %s: %s", info.uri, exc)
        return doomed

    @staticmethod
    def _doomed_name(loc: Location) -> str:
        """A local path out of readers' view to move a folder to before removing it."""
        parent, name = os.path.split(loc.path.rstrip("/"))
        return f"{parent}/{TMP_PREFIX}deleting-{name}-{uuid.uuid4().hex[:6]}"

    @staticmethod
    def _remove_local(path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def __iter__(self) -> Iterator[CheckpointInfo]:
        return iter(self.scan())


def inspect_location(loc: Location, name: str, step: int) -> CheckpointInfo:
    """Status of the checkpoint folder at `loc`, from its manifest and file sizes (checksums: read_files)."""
    manifest_loc = loc.join(MANIFEST_NAME)
    if not storage.exists(manifest_loc):
        return CheckpointInfo(name, loc, step, "partial", problem="no manifest: the write never committed")
    try:
        manifest = Manifest.from_json(storage.read_bytes(manifest_loc))
    except Exception as exc:  # noqa: BLE001 - any unreadable manifest makes the checkpoint corrupt
        return CheckpointInfo(name, loc, step, "corrupt", problem=f"unreadable manifest ({exc})")
    info = CheckpointInfo(name, loc, step, "committed", manifest)
    for fname, entry in manifest.files.items():
        finfo = loc.fs.get_file_info(loc.join(fname).path)
        if finfo.type == pafs.FileType.NotFound:
            info.status, info.problem = "corrupt", f"file '{fname}' is missing"
            break
        if finfo.size != entry.size:
            info.status, info.problem = "corrupt", f"file '{fname}' has {finfo.size} bytes, manifest says {entry.size}"
            break
    return info


def _tmp_step(name: str) -> int:
    match = re.search(r"step-(\d+)", name)
    return int(match.group(1)) if match else -1


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
