"""One writer per run: the driver that holds `<run_dir>/lease.json` is the only one that may write it.

A driver takes the lease at start and refreshes its `heartbeat_at` from a daemon thread. A lease
is free when it was released, when its holder's process is gone (same host: the pid is dead or
now belongs to another process), or when its heartbeat is older than LEASE_TTL_S. Each takeover
raises the lease's `generation` by one, and claims that generation first with a file in
`<run_dir>/leases/`, so that of two drivers taking over at once exactly one wins. Writers in
other processes (the workers) call `fence(run_dir, generation)` right before they commit or
delete, and stop with LeaseLost once a newer driver has taken the run over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace

from orchestrator import storage
from orchestrator.cluster import is_alive
from orchestrator.errors import OrchestratorError, UserError
from orchestrator.run_dir import RunDir
from orchestrator.storage import Location

log = logging.getLogger(__name__)

# Seconds: a heartbeat older than this means the holder is gone and the run may be taken over.
LEASE_TTL_S = 60.0
# Seconds between two heartbeats; several fit in one TTL, so a slow write or two do no harm.
HEARTBEAT_INTERVAL_S = 10.0
# Seconds an object-store claim is left before it is read back: S3 has no exclusive create, so
# of two claims written within this window the last one written wins and both drivers see it.
OBJECT_STORE_CLAIM_SETTLE_S = 0.5
# Takeover rounds before giving up: a round is repeated only when its generation had been claimed
# by a driver that died before writing lease.json.
_MAX_ROUNDS = 5


class RunBusy(UserError):
    """A live driver holds the run directory; the message names it and how to proceed."""


class LeaseLost(OrchestratorError):
    """A newer driver took the run over; the writer that gets this must stop writing."""


@dataclass
class Holder:
    host: str
    pid: int
    pid_started: str | None  # /proc/<pid>/stat start time: tells a reused pid apart; None off Linux
    started_at: float  # wall time (s) this driver took the lease
    generation: int
    nonce: str
    heartbeat_at: float  # wall time (s) of the newest heartbeat
    released_at: float | None = None  # wall time (s) the holder gave the run up

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> Holder:
        """Parse a lease or a claim; ValueError when it is garbled or lacks a field."""
        try:
            data = json.loads(text)
            return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        except TypeError as exc:  # not an object, or a field missing
            raise ValueError(f"not a lease: {exc}") from None


class RunLease:
    def __init__(self, run_dir: RunDir, holder: Holder, ttl_s: float, now: Callable[[], float]):
        self.run_dir = run_dir
        self.holder = holder
        self.lost: LeaseLost | None = None
        self._ttl_s = ttl_s
        self._now = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._released = False

    @property
    def generation(self) -> int:
        return self.holder.generation

    @classmethod
    def acquire(cls, run_dir: RunDir, *, ttl_s: float = LEASE_TTL_S,
                now: Callable[[], float] = time.time) -> RunLease:
        """Take the run's lease, or raise RunBusy naming the live driver that holds it."""
        spent = 0  # a generation claimed by a driver that died before writing lease.json
        for _ in range(_MAX_ROUNDS):
            # Without a readable lease, the newest claim stands in for it: either a driver is taking
            # the run over right now (busy), or it is the last generation of a lost lease.json.
            current = _read_for_takeover(run_dir, ttl_s, now) or _newest_claim(run_dir)
            if current is not None and not _is_free(current, ttl_s, now):
                raise RunBusy(_busy_message(run_dir, current, ttl_s, now))
            generation = max(current.generation if current else 0, spent) + 1
            holder = Holder(socket.gethostname(), os.getpid(), _pid_started(os.getpid()), now(), generation,
                            uuid.uuid4().hex, now())
            rival = _claim(run_dir.lease_claims.join(f"{generation:09d}"), holder)
            if rival is None:
                storage.write_atomic(run_dir.lease, holder.to_json().encode())
                _fsync(run_dir.lease)
                _prune_claims(run_dir, generation)
                log.info("took the lease of %s (generation %d)", run_dir.uri, generation)
                return cls(run_dir, holder, ttl_s, now)
            if not _is_free(rival, ttl_s, now):
                raise RunBusy(_busy_message(run_dir, rival, ttl_s, now))
            spent = generation
        raise RunBusy(f"run directory '{run_dir.uri}': {_MAX_ROUNDS} lease generations in a row were claimed in "
                      f"'{run_dir.lease_claims.uri}' by drivers that died before writing lease.json. Fix: if no "
                      "driver runs on this run, delete that folder and start again.")

    def start_heartbeat(self, interval_s: float = HEARTBEAT_INTERVAL_S) -> RunLease:
        self._thread = threading.Thread(target=self._beat_until_stopped, args=(interval_s,),
                                        name="run-lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat_until_stopped(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self._check_newest()
                self.holder = replace(self.holder, heartbeat_at=self._now())
                storage.write_atomic(self.run_dir.lease, self.holder.to_json().encode())
            except LeaseLost as exc:
                self.lost = exc
                log.error("%s", exc)
                return
            except Exception as exc:  # noqa: BLE001 - a storage hiccup must not end the heartbeat, or the lease goes stale under a live run
                log.warning("lease heartbeat for %s failed (%s); retrying in %.0f s", self.run_dir.uri, exc, interval_s)

    def _check_newest(self) -> None:
        """Raise LeaseLost if a newer generation has been claimed or lease.json names another holder."""
        ours = self.holder
        newer = self.run_dir.lease_claims.join(f"{ours.generation + 1:09d}")
        if storage.exists(newer):
            raise _lost(self.run_dir, ours.generation, _read_claim(newer))
        current = _read_holder(self.run_dir.lease)
        # A lease.json of an older generation is an old driver's last heartbeat racing our takeover:
        # that driver sees our claim on its next beat and stops, and our next write restores ours.
        if current is None or current.generation > ours.generation or (
                current.generation == ours.generation and current.nonce != ours.nonce):
            raise _lost(self.run_dir, ours.generation, current)

    def check(self) -> None:
        """Raise LeaseLost if another driver has taken the run over."""
        if self.lost is not None:
            raise self.lost
        self._check_newest()

    def release(self) -> None:
        """Stop the heartbeat and mark lease.json released (kept, so generations keep increasing)."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.lost is not None:
            return
        try:
            self._check_newest()
            storage.write_atomic(self.run_dir.lease, replace(self.holder, released_at=self._now()).to_json().encode())
            _fsync(self.run_dir.lease)
        except LeaseLost:
            pass  # someone else holds it now: theirs to keep
        except Exception as exc:  # noqa: BLE001 - releasing is best effort; a stale lease is taken over anyway
            log.warning("could not release the lease of %s (%s); the next driver takes it over once its heartbeat "
                        "is older than %.0f s, or at once on this host", self.run_dir.uri, exc, self._ttl_s)

    def __enter__(self) -> RunLease:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def current_holder(run_dir: RunDir, *, ttl_s: float = LEASE_TTL_S,
                   now: Callable[[], float] = time.time) -> tuple[Holder | None, bool]:
    """The driver named in lease.json (None: no readable lease) and whether it still holds the run:
    not released, its heartbeat fresher than the TTL, and (on this host) its process alive."""
    holder = _read_holder(run_dir.lease)
    return holder, holder is not None and not _is_free(holder, ttl_s, now)


def fence(run_dir: RunDir, generation: int) -> None:
    """Raise LeaseLost unless lease.json still names `generation`: call right before a commit or a deletion."""
    current = _read_holder(run_dir.lease)
    if current is None or current.generation != generation:
        raise _lost(run_dir, generation, current)


def _read_holder(loc: Location) -> Holder | None:
    """The lease or claim at `loc`; None when it is missing or garbled."""
    try:
        return Holder.from_json(storage.read_bytes(loc))
    except (FileNotFoundError, ValueError):
        return None


def _read_for_takeover(run_dir: RunDir, ttl_s: float, now) -> Holder | None:
    """lease.json's holder; a garbled one counts as missing, but only once it is older than the TTL."""
    holder = _read_holder(run_dir.lease)
    if holder is not None or not storage.exists(run_dir.lease):
        return holder
    mtime = run_dir.lease.fs.get_file_info(run_dir.lease.path).mtime
    if mtime is not None and now() - mtime.timestamp() > ttl_s:
        return None
    raise RunBusy(f"the lease file '{run_dir.lease.uri}' is unreadable (not a lease's JSON) and was written less "
                  f"than {ttl_s:.0f} s ago, so a driver may be running on '{run_dir.uri}'. Fix: if no driver "
                  "runs on this run, delete that file and start again.")


def _is_free(holder: Holder, ttl_s: float, now) -> bool:
    if holder.released_at is not None or now() - holder.heartbeat_at > ttl_s:
        return True
    if holder.host != socket.gethostname():
        return False
    started = _pid_started(holder.pid)
    return not is_alive(holder.pid) or (None not in (started, holder.pid_started) and started != holder.pid_started)


def _pid_started(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _claim(loc: Location, holder: Holder) -> Holder | None:
    """Create the claim file of `holder.generation`; None if we got it, else the rival's claim."""
    data = holder.to_json().encode()
    if loc.is_local:
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
        try:
            # O_EXCL is exclusive on local disks and on NFSv3+ / other shared POSIX mounts.
            fd = os.open(loc.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return _read_claim(loc)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return None
    # An object store has no exclusive create: write, let racing writes land, and read back who won.
    if storage.exists(loc):
        return _read_claim(loc)
    storage.write_bytes(loc, data)
    time.sleep(OBJECT_STORE_CLAIM_SETTLE_S)
    rival = _read_claim(loc)
    return None if rival.nonce == holder.nonce else rival


def _read_claim(loc: Location) -> Holder:
    """A claim's holder; a claim still empty (its creator is writing it) is read again shortly."""
    for _ in range(50):
        claim = _read_holder(loc)
        if claim is not None:
            return claim
        time.sleep(0.02)
    # Still unreadable: its writer died mid-write, or is very slow. Its age decides, as a heartbeat's would.
    mtime = loc.fs.get_file_info(loc.path).mtime
    generation = int(os.path.basename(loc.path))
    return Holder("(unknown: unreadable claim)", -1, None, 0.0, generation, "", mtime.timestamp() if mtime else 0.0)


def _newest_claim(run_dir: RunDir) -> Holder | None:
    names = [os.path.basename(info.path) for info in storage.list_dir(run_dir.lease_claims)]
    generations = [int(name) for name in names if name.isdigit()]
    return _read_claim(run_dir.lease_claims.join(f"{max(generations):09d}")) if generations else None


def _prune_claims(run_dir: RunDir, generation: int) -> None:
    for info in storage.list_dir(run_dir.lease_claims):
        name = os.path.basename(info.path)
        if name.isdigit() and int(name) < generation - 2:
            try:
                run_dir.lease_claims.fs.delete_file(info.path)
            except OSError as exc:  # another driver pruned it first, or a storage hiccup: harmless
                log.debug("could not delete lease claim %s: %s", info.path, exc)


def _fsync(loc: Location) -> None:
    """Make a renamed local file durable: the file itself and the directory entry naming it."""
    if not loc.is_local:
        return
    for path, flags in ((loc.path, os.O_RDONLY), (os.path.dirname(loc.path), os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _busy_message(run_dir: RunDir, holder: Holder, ttl_s: float, now) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.started_at))
    return (f"run directory '{run_dir.uri}' is held by a live driver: host {holder.host}, pid {holder.pid}, "
            f"started {started}, last heartbeat {now() - holder.heartbeat_at:.0f} s ago (generation "
            f"{holder.generation}). Fix: wait for it to finish, stop it (Ctrl-C in its terminal, or `ray job stop "
            "JOB_ID`), or give this run another name with --set name=NEW_NAME. A driver that died is taken over "
            f"automatically once its heartbeat is older than {ttl_s:.0f} s (LEASE_TTL_S), or at once from "
            "the same host when its pid is gone.")


def _lost(run_dir: RunDir, generation: int, current: Holder | None) -> LeaseLost:
    if current is None:
        newer = "its lease.json is missing or unreadable"
    else:
        newer = f"generation {current.generation} now holds it (host {current.host}, pid {current.pid})"
    return LeaseLost(f"run directory '{run_dir.uri}' was taken over while this writer held lease generation "
                     f"{generation}: {newer}. This writer stops writing to it; the newer driver continues the run. "
                     "Fix: run one driver per run name; if this one was meant to keep the run, stop the other.")
