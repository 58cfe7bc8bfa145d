"""One store for every checkpoint of a run: `<run_dir>/checkpoints/step-<N>/`.

Commit protocol (`phases.py` names each point of it). The files of a checkpoint are written
first, each fsynced on a local or shared filesystem; its manifest (sizes and sha256 of every
file) last. A checkpoint is committed exactly when `step-<N>/manifest.json` exists. Locally the
whole folder is built under a temporary name, fsynced, renamed into place (atomic, and refused
by the kernel if a committed folder already holds the name) and the parent directory fsynced. On
an object store each object appears whole when its upload completes, so writing the manifest last
gives the same guarantee. Then the new checkpoint is read back (sizes and hashes locally, sizes
on object stores); only a checkpoint confirmed that way lets retention delete older ones.

Readers only ever take committed checkpoints, and loading re-checks every checksum, falling back
to the previous checkpoint with a warning when one turns out partial or corrupt. Only a verified
fault counts as corrupt (a checksum, a file the manifest names that is missing, a manifest that
does not decode); any other storage error is retried and then raised as CheckpointUnreadable
(files.py, `read_retrying`), so a storage hiccup never sets a healthy checkpoint aside.

Branches. A run that resumes from a checkpoint older than its newest (a rollback with an explicit
resume_from, or rank 0 falling back past a corrupt newest one) trains another trajectory from
there, so the later checkpoints are not its own. `supersede_after` sets them aside first: each
keeps its files, and its manifest under another name (`manifest.superseded.json`), so no reader
resumes from it and the branch's own saves take its step names. Only then is a second save at a
committed step always a replay of the same state (exact resume), which the store keeps as it is. A `fence`
(the run's writer lease) is checked before every commit and deletion, so a writer that lost the
run to a newer driver changes nothing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from orchestrator import storage
from orchestrator.checkpoint import phases, retention
from orchestrator.checkpoint.files import (
    MISSING_ERRORS,
    CheckpointUnreadable,
    Payload,
    discard,
    file_entry,
    fsync_dir,
    is_disk_full,
    payload_bytes,
    read_retrying,
    remove_tree,
    storage_full_error,
    write_file,
)
from orchestrator.checkpoint.info import CheckpointInfo
from orchestrator.checkpoint.manifest import (
    MANIFEST_NAME,
    SUPERSEDED_NAME,
    FileEntry,
    Manifest,
    NewerFormat,
    library_versions,
)
from orchestrator.errors import CheckpointError
from orchestrator.storage import Location

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"


def _hold_nothing(_name: str) -> bool:
    return False


class CorruptCheckpoint(CheckpointError):
    """A checkpoint failed verification; `reason` says what was wrong. Only for a verified fault:
    a storage error that says nothing of the checkpoint is CheckpointUnreadable instead."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason

    def __reduce__(self):
        return (self.__class__, (self.name, self.reason))


@dataclass
class Selection:
    """The checkpoint chosen to resume from (None: start fresh) and why others were passed over."""

    info: CheckpointInfo | None
    files: dict[str, bytes]
    skipped: list[str]


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


@dataclass
class RetentionReport:
    """What a retention pass deleted, and what it could not do (warnings; the next pass retries)."""

    deleted: list[CheckpointInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class CheckpointStore:
    def __init__(self, run_dir: Location, *, fence: Callable[[], None] | None = None):
        self.run_dir = run_dir
        self.root = run_dir.join(CHECKPOINTS_DIR)
        # Raises when this process may no longer write the run (checkpoint/lease.py).
        self.fence = fence
        # Checkpoints this store wrote and read back intact: only these let retention delete.
        self.verified: set[str] = set()

    @classmethod
    def for_run(cls, run_uri: str, *, fence: Callable[[], None] | None = None) -> CheckpointStore:
        return cls(storage.resolve(run_uri), fence=fence)

    # --- reading -----------------------------------------------------------------------------

    def scan(self) -> list[CheckpointInfo]:
        """Every checkpoint folder, oldest first, with a status from its manifest and file sizes.

        A checkpoint written by a newer orchestrator raises NewerFormat: skipping it would let
        this run write older steps after it and its retention delete it.
        """
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

        Only the files `keep` accepts are read into memory and returned. With `verify_all`, every
        other file is checked too, streamed through its hash and never held (whoever decides
        which checkpoint a group resumes from); without, only the kept ones (a rank loading the
        checkpoint already chosen for it reads only its own shard).

        Raises CorruptCheckpoint for a missing file or a failed checksum, CheckpointUnreadable
        when storage fails every retry of a read (the checkpoint may well be whole).
        """
        if info.status != "committed" or info.manifest is None:
            raise CorruptCheckpoint(info.name, info.problem or info.status)
        files = {}
        for fname, entry in info.manifest.files.items():
            hold = keep is None or keep(fname)
            if not hold and not verify_all:
                continue
            loc = info.location.join(fname)
            try:
                if hold:
                    data = read_retrying(info.uri, f"reading file '{fname}'", storage.read_bytes, loc)
                    found = FileEntry(size=len(data), sha256=_sha256(data))
                else:
                    found = read_retrying(info.uri, f"reading file '{fname}'", file_entry, loc)
            except MISSING_ERRORS as exc:
                raise CorruptCheckpoint(info.name, f"file '{fname}' is missing ({exc})") from None
            if found != entry:
                raise CorruptCheckpoint(info.name, f"file '{fname}' fails its sha256 check")
            if hold:
                files[fname] = data
        return files

    def verify(self, info: CheckpointInfo) -> CheckpointInfo:
        """Full check of every checksum, streamed; returns the info with its status updated:
        "corrupt" for a verified fault, "unreadable" when storage would not return a file."""
        if info.status == "committed":
            try:
                self.read_files(info, _hold_nothing)
            except CorruptCheckpoint as exc:
                info.status, info.problem = "corrupt", exc.reason
            except CheckpointUnreadable as exc:
                info.status, info.problem = "unreadable", str(exc)
        return info

    def latest_loadable(self, keep: Callable[[str], bool] | None = None) -> Selection:
        """The newest checkpoint that verifies, its kept files, and a warning for each one skipped.

        Only a verified fault skips a checkpoint: CheckpointUnreadable (storage failing every
        retry) is raised, since what comes after a skip may be set aside for good.
        """
        skipped: list[str] = []
        for info in reversed(self.scan()):
            if info.name.startswith(TMP_PREFIX) or info.status == "superseded":
                continue  # never committed, or set aside on purpose: not worth a warning on every start
            try:
                files = self.read_files(info, keep)
            except CorruptCheckpoint as exc:
                skipped.append(f"skipped checkpoint {info.uri}: {exc.reason}")
                log.warning(skipped[-1])
                continue
            return Selection(info, files, skipped)
        return Selection(None, {}, skipped)

    def latest_verified(self) -> Selection:
        """latest_loadable() holding no file in memory: a choice made from manifests and hashes."""
        return self.latest_loadable(_hold_nothing)

    def latest_committed(self) -> Selection:
        """The newest checkpoint whose manifest and file sizes are right, reading no payload.

        The driver's choice: cheap whatever the checkpoint's size. The worker group's rank 0
        then checks every hash before training from it, and falls back (announced) if one fails.
        """
        committed, skipped = self.committed_and_skipped()
        return Selection(committed[-1] if committed else None, {}, skipped)

    def committed_and_skipped(self) -> tuple[list[CheckpointInfo], list[str]]:
        """Every committed checkpoint, oldest first, from one scan; and a warning (logged) for each
        checkpoint newer than the newest of them that is partial or corrupt, as a resume passes it over."""
        infos = self.scan()
        skipped: list[str] = []
        for info in reversed(infos):
            if info.name.startswith(TMP_PREFIX) or info.status == "superseded":
                continue
            if info.status == "committed":
                break
            skipped.append(f"skipped checkpoint {info.uri}: {info.problem or info.status}")
            log.warning(skipped[-1])
        return [info for info in infos if info.status == "committed"], skipped

    def open_uri(self, uri: str, keep: Callable[[str], bool] | None = None, *,
                 verify_all: bool = True) -> tuple[CheckpointInfo, dict[str, bytes]]:
        """Exactly the checkpoint at `uri` (resume_from: <uri>), or a CheckpointError saying why not
        (verified: the folder is not there, the checkpoint is partial or corrupt).
        CheckpointUnreadable: storage failed every retry, and nothing is known to be wrong with it."""
        loc = self._location_of(uri)
        name = os.path.basename(loc.path.rstrip("/"))
        match = STEP_DIR.match(name)
        kind = read_retrying(uri, "looking up the checkpoint folder", _file_type, loc)
        if kind != pafs.FileType.Directory:
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

    def _location_of(self, uri: str) -> Location:
        """A checkpoint by its URI: one of this store's is read through the store's own
        filesystem (its client and options), any other resolved from the URI."""
        name = uri.partition("?")[0].rstrip("/").rsplit("/", 1)[-1]
        own = self.root.join(name)
        return own if own.uri == uri else storage.resolve(uri)

    # --- writing -----------------------------------------------------------------------------

    def commit(self, manifest: Manifest, files: dict[str, Payload]) -> CheckpointInfo:
        """Write `files` and their manifest as checkpoint `step-<manifest.step>`, atomically.

        Returns the new checkpoint, read back: status "committed" (and in `verified`), or
        "corrupt" when what storage returns differs from what was written.
        """
        step = manifest.step
        name = step_dir_name(step)
        final = self.root.join(name)
        existing = self._already_committed(final, name, step)
        if existing is not None:
            return existing
        storage.ensure_dir(self.root)
        staging = self.root.join(f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}") if final.is_local else final
        try:
            storage.ensure_dir(staging)
            manifest.files = self._write_payloads(staging, files, step)
            phases.reached("files_written", step)
            self._write_manifest(staging, manifest)
        except Exception as exc:
            if staging.is_local:  # a private folder; on an object store a newer writer may share the step's
                discard(staging)  # folder, and retention removes an uncommitted one later
            if is_disk_full(exc):
                raise storage_full_error(step, self.root, sum(payload_bytes(p) for p in files.values())) from None
            raise
        phases.reached("manifest_written", step)
        if final.is_local:
            committed = self._publish_local(staging, final, step)
            if committed is not None:
                return committed
        return self.confirm(CheckpointInfo(name, final, step, "committed", manifest))

    def _write_payloads(self, loc: Location, files: dict[str, Payload], step: int) -> dict[str, FileEntry]:
        partial = lambda: phases.reached("file_partial", step)  # noqa: E731 - a one-line hook
        return {fname: write_file(loc.join(fname), payload, on_first_bytes=partial)
                for fname, payload in files.items()}

    def _write_manifest(self, loc: Location, manifest: Manifest) -> None:
        """The commit point on an object store, so the fence is checked right before it."""
        manifest.versions = manifest.versions or library_versions()
        self._fenced()
        write_file(loc.join(MANIFEST_NAME), manifest.to_json())
        if loc.is_local:
            fsync_dir(loc.path)

    def _already_committed(self, final: Location, name: str, step: int) -> CheckpointInfo | None:
        """A whole checkpoint already committed at this step, which a new write must not replace.

        Resume is exact and every branch supersedes the checkpoints after its start
        (`supersede_after`), so a committed checkpoint at step N is this run's own state at N: a
        second save of it (a replay after a crash) keeps it. Replacing it would open a window in
        which a crash leaves no checkpoint at step N at all.
        """
        info = inspect_location(final, name, step)
        if info.status != "committed":
            return None
        log.info("checkpoint %s is already committed; keeping it", final.uri)
        return info

    def _publish_local(self, staging: Location, final: Location, step: int) -> CheckpointInfo | None:
        """Rename a fully written local folder into place (the commit); made durable by an fsync.

        rename(2) refuses to replace a non-empty folder, so a checkpoint committed under the name
        in the meantime (another writer) is never replaced: it is kept and returned. Only a
        leftover that is not committed (an interrupted write at the same step) is moved aside.
        """
        self._fenced()
        try:
            os.rename(staging.path, final.path)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            existing = self._already_committed(final, final.path.rsplit("/", 1)[-1], step)
            if existing is not None:
                remove_tree(staging.path)
                return existing
            leftover = self._doomed_name(final)
            os.rename(final.path, leftover)
            remove_tree(leftover)
            os.rename(staging.path, final.path)
        phases.reached("published", step)
        fsync_dir(self.root.path)
        return None

    def confirm(self, info: CheckpointInfo) -> CheckpointInfo:
        """Read a just-committed checkpoint back: hashes on local and shared filesystems, sizes
        on object stores (whose uploads are checksummed on the way). Only a confirmed checkpoint
        counts for retention."""
        try:
            checked = inspect_location(info.location, info.name, info.step)
        except CheckpointUnreadable as exc:  # storage failing now: unconfirmed, nothing set aside
            checked = CheckpointInfo(info.name, info.location, info.step, "unreadable", problem=str(exc))
        if checked.status == "committed" and info.location.is_local:
            checked = self.verify(checked)
        if checked.status != "committed":
            info.status = "unreadable" if checked.status == "unreadable" else "corrupt"
            info.problem = checked.problem
            log.warning("checkpoint %s was committed but does not read back intact (%s); older checkpoints "
                        "are kept and resuming skips it", info.uri, checked.problem)
            return info
        self.verified.add(info.name)
        phases.reached("verified", info.step)
        return info

    # --- sharded state (FSDP): every rank writes its own shard ------------------------------------

    def _staging(self, step: int, token: str) -> Location:
        name = step_dir_name(step)
        if self.root.is_local:
            return self.root.join(f"{TMP_PREFIX}{name}-{token}")
        return self.root.join(name)  # object stores: the manifest written last is the commit

    @staticmethod
    def _receipt(loc: Location, rank: int, token: str) -> Location:
        """A rank's receipt for one save: named by the save's token, so that receipts an aborted
        attempt at the same step left on an object store never count for this one."""
        return loc.join(f"shard-{rank:05d}-{token}.json")

    def write_shard(self, step: int, token: str, rank: int, files: dict[str, Payload]) -> None:
        """One rank's part of checkpoint `step`. `token` must be the same on every rank for this save."""
        name = step_dir_name(step)
        if self._already_committed(self.root.join(name), name, step) is not None:
            return  # on an object store the shard would overwrite committed files in place
        loc = self._staging(step, token)
        try:
            storage.ensure_dir(loc)
            entries = self._write_payloads(loc, files, step)
            if loc.is_local:  # the shard's entries are durable before its receipt says it is whole
                fsync_dir(loc.path)
            phases.reached("shard_written", step)
            # The shard's own receipt, written after its files: its presence means the shard is whole.
            # Nothing of this folder is touched after it: rank 0 may rename the folder into place as
            # soon as it sees the last receipt (and fsyncs the folder itself before that).
            receipt = {f: {"size": e.size, "sha256": e.sha256} for f, e in entries.items()}
            write_file(self._receipt(loc, rank, token), json.dumps(receipt).encode())
        except Exception as exc:
            if is_disk_full(exc):
                raise storage_full_error(step, self.root, sum(payload_bytes(p) for p in files.values())) from None
            raise
        phases.reached("receipt_written", step)

    def commit_shards(self, manifest: Manifest, token: str, *, timeout_s: float = 600.0,
                      poll_s: float = 0.2) -> CheckpointInfo:
        """Rank 0: once every rank's shard receipt is present, write the manifest and publish."""
        step = manifest.step
        name = step_dir_name(step)
        final = self.root.join(name)
        existing = self._already_committed(final, name, step)
        if existing is not None:  # write_shard skipped it on every rank too
            return existing
        loc = self._staging(step, token)
        receipts = [self._receipt(loc, r, token) for r in range(manifest.world_size)]
        read: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(read) < len(receipts):
            for rank, receipt in enumerate(receipts):
                if rank not in read and (content := _whole_receipt(receipt)) is not None:
                    read[rank] = content
            if len(read) == len(receipts):
                break
            if time.monotonic() > deadline:
                missing = [r.path.rsplit("/", 1)[-1] for i, r in enumerate(receipts) if i not in read]
                raise TimeoutError(f"checkpoint step {step} not committed: shards {missing} "
                                   f"still missing in {loc.uri} after {timeout_s:.0f} s. Every worker writes "
                                   "its own shard there, so the storage must be shared by every node "
                                   "(a shared mount or an object store)")
            time.sleep(poll_s)
        files = {}
        for rank in range(len(receipts)):
            for fname, entry in read[rank].items():
                files[fname] = FileEntry(**entry)
        manifest.files = files
        phases.reached("files_written", step)
        try:
            self._write_manifest(loc, manifest)
        except OSError as exc:
            if is_disk_full(exc):
                raise storage_full_error(step, self.root, 4096) from None
            raise
        phases.reached("manifest_written", step)
        if loc.is_local:
            committed = self._publish_local(loc, final, step)
            if committed is not None:
                return committed
        return self.confirm(CheckpointInfo(name, final, step, "committed", manifest))

    # --- branches ------------------------------------------------------------------------------

    def supersede_after(self, step: int, *, inclusive: bool = False) -> list[CheckpointInfo]:
        """Set aside every checkpoint after `step` (and at it, with `inclusive`): a branch of the
        run starts there, and their states are another trajectory's.

        Each keeps its files; its manifest is renamed to `manifest.superseded.json` (atomically
        on a local filesystem; copied, then the original deleted, on an object store, so a crash
        in between leaves it committed and the next branch start sets it aside again). Corrupt
        ones whose manifest is present are set aside too: a replay must not keep them.
        """
        superseded = []
        for info in self.scan():
            beyond = info.step > step or (inclusive and info.step == step)
            if not beyond or info.name.startswith(TMP_PREFIX) or info.manifest is None:
                continue
            if info.status not in ("committed", "corrupt"):
                continue
            self._fenced()
            manifest, aside = info.location.join(MANIFEST_NAME), info.location.join(SUPERSEDED_NAME)
            if info.location.is_local:
                os.replace(manifest.path, aside.path)
                fsync_dir(info.location.path)
            else:
                info.location.fs.copy_file(manifest.path, aside.path)
                info.location.fs.delete_file(manifest.path)
            self.verified.discard(info.name)
            info.status, info.problem = "superseded", _SUPERSEDED
            superseded.append(info)
        return superseded

    # --- deleting ------------------------------------------------------------------------------

    def delete(self, info: CheckpointInfo) -> list[str]:
        """Remove a checkpoint so that no reader ever sees it half-deleted; returns what is left.

        Locally the folder is first renamed out of view (a later pass finishes removing it if
        this one cannot); on an object store the manifest goes first, so a concurrent reader
        sees an uncommitted checkpoint, never a committed one with missing files.
        """
        self._fenced()
        if info.location.is_local:
            doomed = info.location.path
            if not info.name.startswith(retention.DELETING_PREFIX):
                doomed = self._doomed_name(info.location)
                try:
                    os.rename(info.location.path, doomed)
                except FileNotFoundError:
                    return []
            phases.reached("retention", info.step)
            return remove_tree(doomed)
        manifest = info.location.join(MANIFEST_NAME)
        if storage.exists(manifest):
            info.location.fs.delete_file(manifest.path)
        phases.reached("retention", info.step)
        info.location.fs.delete_dir(info.location.path)
        return []

    def retain(self, keep_last: int | None, keep_best: tuple[int, str, str] | None = None) -> RetentionReport:
        """Delete what no rule keeps (`retention.doomed`). Never raises: a listing or deletion
        problem is a warning in the report, and the next pass tries again."""
        report = RetentionReport()
        try:
            infos = self.scan()
        except Exception as exc:  # noqa: BLE001 - retention must never fail a save
            report.problems.append(f"listing {self.root.uri} failed: {type(exc).__name__}: {exc}")
            return report
        for info in retention.doomed(infos, self.verified, keep_last, keep_best):
            try:
                left = self.delete(info)
            except Exception as exc:  # noqa: BLE001 - retried by the next pass
                left = [f"{type(exc).__name__}: {exc}"]
            if left:
                report.problems.append(f"could not delete {info.uri} entirely ({left[0]}); a later pass retries")
            else:
                report.deleted.append(info)
        for problem in report.problems:
            log.warning("checkpoint retention: %s", problem)
        return report

    def _fenced(self) -> None:
        if self.fence is not None:
            self.fence()

    @staticmethod
    def _doomed_name(loc: Location) -> str:
        """A local path out of readers' view to move a folder to before removing it."""
        parent, name = os.path.split(loc.path.rstrip("/"))
        return f"{parent}/{retention.DELETING_PREFIX}{name}-{uuid.uuid4().hex[:6]}"

    def __iter__(self) -> Iterator[CheckpointInfo]:
        return iter(self.scan())


_SUPERSEDED = "a later branch of the run started before it (files kept; not resumed from)"


def inspect_location(loc: Location, name: str, step: int) -> CheckpointInfo:
    """Status of the checkpoint folder at `loc`, from its manifest and file sizes (checksums: read_files).

    Storage errors are retried, the whole inspection again; CheckpointUnreadable if they last.
    """
    return read_retrying(loc.uri, "reading its manifest and file sizes", _inspect_once, loc, name, step)


def _inspect_once(loc: Location, name: str, step: int) -> CheckpointInfo:
    manifest_loc = loc.join(MANIFEST_NAME)
    if not storage.exists(manifest_loc):
        return _uncommitted(loc, name, step)
    try:
        raw = storage.read_bytes(manifest_loc)
    except MISSING_ERRORS:  # renamed aside or deleted since it was seen: look again
        return _uncommitted(loc, name, step)
    try:
        manifest = Manifest.from_json(raw, source=loc.uri)
    except NewerFormat:
        raise
    except Exception as exc:  # noqa: BLE001 - a manifest that does not decode makes the checkpoint corrupt
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


def _uncommitted(loc: Location, name: str, step: int) -> CheckpointInfo:
    """A folder without a manifest: superseded by a later branch, or a write that never committed."""
    aside = loc.join(SUPERSEDED_NAME)
    if storage.exists(aside):
        try:
            raw = storage.read_bytes(aside)
        except MISSING_ERRORS:
            raw = b""
        try:
            manifest = Manifest.from_json(raw, source=loc.uri)
        except Exception:  # noqa: BLE001 - still set aside; only its details are unknown
            manifest = None
        return CheckpointInfo(name, loc, step, "superseded", manifest, problem=_SUPERSEDED)
    return CheckpointInfo(name, loc, step, "partial", problem="no manifest: the write never committed")


def _file_type(loc: Location) -> pafs.FileType:
    return loc.fs.get_file_info(loc.path).type


def _tmp_step(name: str) -> int:
    match = re.search(r"step-(\d+)", name)
    return int(match.group(1)) if match else -1


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _whole_receipt(receipt: Location) -> dict | None:
    """A shard's receipt once it is whole; None while it is missing or still being written (on a
    local filesystem the file exists, empty or partial, from its creation until its last byte)."""
    if not storage.exists(receipt):
        return None
    try:
        return json.loads(storage.read_bytes(receipt))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
