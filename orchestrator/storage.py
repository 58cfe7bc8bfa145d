"""Every storage access goes through pyarrow.fs: a local path, a shared mount, s3://, gs://, ...

`resolve(uri)` returns the filesystem and the path inside it. Local paths are expanded (~) and
made absolute so that every worker on the machine agrees on them. `resolve_root(uri)` is the
driver's for the spec's `storage:`, which must name the same place on every submission: under
`ray job submit` a relative path is refused (it would land in the job's unpacked working_dir).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from orchestrator.errors import UserError


@dataclass(frozen=True)
class Location:
    """A filesystem and a path inside it; `uri` is the form to hand to another process."""

    fs: pafs.FileSystem
    path: str
    uri: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def join(self, *parts: str) -> Location:
        path = posixpath.join(self.path, *parts)
        uri = _join_uri(self.uri, *parts)
        return Location(self.fs, path, uri)


def _join_uri(uri: str, *parts: str) -> str:
    base, sep, query = uri.partition("?")
    joined = base.rstrip("/") + "/" + "/".join(p.strip("/") for p in parts)
    return joined + (sep + query if sep else "")


# Set by Ray's job supervisor, and only for the driver of a `ray job submit` job: the job's config.
RAY_JOB_CONFIG_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def in_ray_job() -> bool:
    """Whether this process is the driver of a job submitted with `ray job submit` (or the Jobs SDK)."""
    return RAY_JOB_CONFIG_ENV_VAR in os.environ


def _local_path(uri: str) -> str | None:
    """The path of a local storage string (a path, ~/..., file:...), None for another scheme."""
    parsed = urlparse(uri)
    if not parsed.scheme or len(parsed.scheme) == 1:  # a path (or C:\ on Windows)
        return uri
    return parsed.path if parsed.scheme == "file" else None


def resolve_root(uri: str) -> Location:
    """`resolve` for the place a run's directories live (the spec's `storage:`), on the driver.

    A run is found again by this path: a re-submission resumes only if it resolves the same.
    Under `ray job submit` the driver's working directory is a copy of the job's working_dir
    that Ray unpacks under a name derived from its contents, so a relative path would name a new
    place after every edit, and the run would silently start fresh: refused, naming the fix.
    """
    path = _local_path(uri)
    if path is not None and in_ray_job() and not os.path.isabs(os.path.expanduser(path)):
        here = os.getcwd()
        raise UserError(
            f"storage '{uri}' is a relative path, and this driver runs as a Ray job (`ray job submit`): it would "
            f"resolve to {os.path.abspath(path)}, inside the driver's working directory {here}, which Ray "
            "picks for each submission (with --working-dir, a copy of your files unpacked under a name that "
            "changes with every edit), so a submission after an edit would not find this run's checkpoints and "
            "would silently start fresh. Fix: set storage (the spec's `storage:` or --storage) to an absolute "
            "path (/mnt/shared/runs), a path under your home (~/orchestrator-runs), or a URI "
            "(s3://bucket/prefix); on several nodes it must be shared storage."
        )
    return resolve(uri)


def resolve(uri: str) -> Location:
    """Turn a storage string from the spec into a Location, with a clear error if it cannot be opened."""
    path = _local_path(uri)
    if path is not None:
        local = os.path.abspath(os.path.expanduser(path))
        return Location(pafs.LocalFileSystem(), local, local)
    try:
        fs, inner = pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid / OSError with its own text
        raise UserError(
            f"storage '{uri}' could not be opened: {exc}. Fix: use a local directory or a URI pyarrow.fs "
            "understands (s3://bucket/prefix, gs://bucket/prefix, hdfs://host/path); for S3 set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and, for a non-AWS server, ?endpoint_override=HOST:PORT."
        ) from None
    return Location(fs, inner.rstrip("/"), uri)


def read_bytes(loc: Location) -> bytes:
    with loc.fs.open_input_stream(loc.path) as f:
        return f.read()


def write_bytes(loc: Location, data: bytes) -> None:
    with loc.fs.open_output_stream(loc.path) as f:
        f.write(data)


def write_atomic(loc: Location, data: bytes) -> None:
    """Write a whole file so that readers see the old content or the new, never a torn one.

    Local filesystems get a temporary name and a rename. Object stores (S3, GCS) publish an object
    only when its upload completes, so a direct write is already atomic there. A write that fails
    (a full disk: OSError ENOSPC, naming `loc.path`) leaves the old content and no temporary file.
    """
    if loc.is_local:
        parent = posixpath.dirname(loc.path)
        loc.fs.create_dir(parent, recursive=True)
        tmp = f"{loc.path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # durable before it gets the name: a crash never leaves it empty
            os.replace(tmp, loc.path)
        except BaseException as exc:
            # Its name (pid, thread) is one no later write reuses: left, it would hold the space of
            # a full disk for good.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and exc.errno is not None:
                # A failed write() says only "No space left on device": name the file it was for.
                raise OSError(exc.errno, f"{exc.strerror} (writing {len(data)} bytes to it)", loc.path) from None
            raise
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    else:
        write_bytes(loc, data)


def exists(loc: Location) -> bool:
    return loc.fs.get_file_info(loc.path).type != pafs.FileType.NotFound


def list_dir(loc: Location) -> list[pafs.FileInfo]:
    info = loc.fs.get_file_info(loc.path)
    if info.type == pafs.FileType.NotFound:
        return []
    return loc.fs.get_file_info(pafs.FileSelector(loc.path, recursive=False))


def ensure_dir(loc: Location) -> None:
    loc.fs.create_dir(loc.path, recursive=True)
