"""One writer per run: of the drivers started on a run directory, one at a time holds its lease.

The files, all in `<run_dir>/leases/` but the last:
- `<generation>` (nine digits), the claim: which driver took the run over for that generation
  (host, pid, and what tells whether a pid seen here is that process: its start time, the kernel's
  boot id, the pid namespace) and a random nonce. Created exclusively and never rewritten, claims
  are the truth: a driver holds the run while the claim of its generation carries its nonce and no
  claim of the next generation exists. `fence(run_dir, generation, nonce)` checks exactly that.
- `<generation>.beat`: the heartbeat of that generation, written by its holder only: a counter raised
  at every beat, and the time it released the run. An old holder's late write lands in its own file,
  which no newer holder relies on, so it can never roll a takeover back.
- `<run_dir>/lease.json`: a copy of the newest claim for people and tools, written at a takeover and
  a release. No decision rests on it; it is watched like a heartbeat (a driver of an older version
  beats there), and read for who holds the run only where `leases/` is gone.

A holder is judged by its pid wherever the pid means the same process: same hostname, kernel boot
id and pid namespace (two containers with host networking share a hostname, not their pids), and
the same start time of that pid (a pid reused by another process is not the holder). There the
answer comes at once: its process alive, RunBusy; gone, the run is taken over. A holder that
released the run is taken over at once too. Any other holder (another host, another container, a
lease of an older version that does not say) is watched: its heartbeat, timed on the watcher's own
monotonic clock, never by comparing two hosts' wall clocks, for up to LEASE_TTL_S: RunBusy as soon
as the heartbeat moves, the run taken over if it stood still. Each takeover raises the generation
by one.

Writers in other processes (the workers) call `fence` right before they commit or delete. The
driver's own heartbeat checks the same at every beat and, once the run was taken over, calls the
`on_lost` callback given to `start_heartbeat`, so that the driver stops its run at once.
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
from orchestrator.errors import LeaseLost, UserError
from orchestrator.processes import is_alive, kernel_and_pid_namespace, pid_means_here, pid_started
from orchestrator.run_dir import RunDir
from orchestrator.storage import Location

log = logging.getLogger(__name__)

# Seconds a heartbeat must stand still, watched on the watcher's own clock, before its holder
# counts as gone and the run may be taken over.
LEASE_TTL_S = 60.0
# Seconds between two heartbeats; several fit in one TTL, so a slow write or two do no harm.
HEARTBEAT_INTERVAL_S = 10.0
# Seconds an object-store claim is left before it is read back: S3 has no exclusive create, so
# of two claims written within this window the last one written wins and both drivers see it.
OBJECT_STORE_CLAIM_SETTLE_S = 0.5
# Takeover rounds before giving up: a round is repeated only when its generation had been claimed
# by a driver that was found gone.
_MAX_ROUNDS = 5
# Seconds between two looks at a heartbeat that is being watched (at most; a tenth of the TTL when shorter).
_WATCH_POLL_S = 0.5
# Seconds release() waits for a heartbeat write in flight.
_RELEASE_WAIT_S = 30.0


class RunBusy(UserError):
    """A live driver holds the run directory; the message names it and how to proceed."""


@dataclass
class Holder:
    host: str
    pid: int
    pid_started: str | None  # /proc/<pid>/stat start time: tells a reused pid apart; None off Linux
    started_at: float  # wall time (s, the holder's clock) this driver took the lease: shown, never compared
    generation: int
    nonce: str
    heartbeat_at: float  # wall time (s, the holder's clock) of its newest heartbeat: shown, never compared
    released_at: float | None = None  # wall time (s) the holder gave the run up
    # The kernel (/proc/sys/kernel/random/boot_id) and the pid namespace (inode of /proc/self/ns/pid)
    # the pid belongs to; None off Linux and in leases of older versions: then the pid is not checked.
    boot_id: str | None = None
    pid_ns: str | None = None

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


@dataclass
class _Seen:
    """A holder as another driver finds it, and the files whose change shows that it is alive."""

    holder: Holder
    signs: tuple[Location, ...]
    readable: bool = True


class RunLease:
    def __init__(self, run_dir: RunDir, holder: Holder, ttl_s: float, now: Callable[[], float]):
        self.run_dir = run_dir
        self.holder = holder
        self.lost: LeaseLost | None = None
        self._ttl_s = ttl_s
        self._now = now
        self._beats = 0
        self._on_lost: Callable[[LeaseLost], None] | None = None
        self._stop = threading.Event()
        # One heartbeat write at a time; release() takes it so that no beat lands after the release.
        self._writing = threading.Lock()
        self._losing = threading.Lock()
        self._thread: threading.Thread | None = None
        self._released = False

    @property
    def generation(self) -> int:
        return self.holder.generation

    @property
    def nonce(self) -> str:
        """What `fence` needs beside the generation: two drivers that both won one generation (a claim
        race on an object store) are told apart by it."""
        return self.holder.nonce

    @classmethod
    def acquire(cls, run_dir: RunDir, *, ttl_s: float = LEASE_TTL_S, now: Callable[[], float] = time.time,
                on_wait: Callable[[str], None] | None = None) -> RunLease:
        """Take the run's lease, or raise RunBusy naming the live driver that holds it.

        A holder whose pid can be checked from here (same host, kernel and pid namespace) is judged at
        once: RunBusy while its process runs, taken over once it is gone. So is one that released the
        run. Any other is watched for up to `ttl_s` seconds first (`on_wait` gets a line saying so).
        `now` gives the wall times written into the lease, which only people read.
        """
        current = _newest(run_dir)
        if current is not None:
            _wait_until_free(run_dir, current, ttl_s, on_wait)
        generation = (current.holder.generation if current else 0) + 1
        for _ in range(_MAX_ROUNDS):
            boot_id, pid_ns = kernel_and_pid_namespace()
            holder = Holder(socket.gethostname(), os.getpid(), pid_started(os.getpid()), now(), generation,
                            uuid.uuid4().hex, now(), None, boot_id, pid_ns)
            rival = _claim(_claim_loc(run_dir, generation), holder)
            if rival is None:
                lease = cls(run_dir, holder, ttl_s, now)
                lease._write_beat()  # from here on, a watcher that sees it move knows this driver is alive
                _write_record(run_dir, holder)
                _fsync(run_dir.lease)
                _prune_claims(run_dir, generation)
                log.info("took the lease of %s (generation %d)", run_dir.uri, generation)
                return lease
            # Another driver claimed this generation first: it holds the run unless it turns out gone.
            _wait_until_free(run_dir, _seen_claim(run_dir, rival), ttl_s, on_wait)
            generation += 1
        raise RunBusy(f"run directory '{run_dir.uri}': {_MAX_ROUNDS} lease generations in a row were claimed in "
                      f"'{run_dir.lease_claims.uri}' by drivers that were gone by the time they were looked at. Fix: "
                      "if no driver runs on this run, delete that folder and start again.")

    def start_heartbeat(self, interval_s: float = HEARTBEAT_INTERVAL_S, *,
                        on_lost: Callable[[LeaseLost], None] | None = None) -> RunLease:
        """Beat every `interval_s` seconds from a daemon thread. The first check that finds the run taken
        over (the next beat, or a `check()` before it) stops the heartbeat and calls `on_lost(LeaseLost)`
        once, on the thread that noticed: the driver stops its run there (the LeaseLost message says who
        holds the run now). Keep it short and let it not raise; what it raises is logged."""
        self._on_lost = on_lost
        self._thread = threading.Thread(target=self._beat_until_stopped, args=(interval_s,),
                                        name="run-lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat_until_stopped(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                with self._writing:
                    if self._stop.is_set():
                        return
                    _check_held(self.run_dir, self.generation, self.nonce)
                    self._write_beat()
            except LeaseLost as exc:
                self._lose(exc)  # outside the lock: the callback may release() the lease
                return
            except Exception as exc:  # noqa: BLE001 - a storage hiccup must not end the heartbeat, or the lease goes stale under a live run
                log.warning("lease heartbeat for %s failed (%s); retrying in %.0f s", self.run_dir.uri, exc, interval_s)

    def _write_beat(self, released_at: float | None = None) -> None:
        self._beats += 1
        beat = {"generation": self.generation, "nonce": self.nonce, "beat": self._beats, "at": self._now(),
                "released_at": released_at}
        storage.write_atomic(_beat_loc(self.run_dir, self.generation), json.dumps(beat).encode())

    def _lose(self, exc: LeaseLost) -> None:
        """Record the loss, stop the heartbeat and tell the driver, once, whichever check noticed it first."""
        with self._losing:
            if self.lost is not None:
                return
            self.lost = exc
        self._stop.set()
        log.error("%s", exc)
        if self._on_lost is not None:
            try:
                self._on_lost(exc)
            except Exception:  # the loss is recorded (self.lost, check()) whatever the callback does
                log.exception("the on_lost callback of the lease of %s failed", self.run_dir.uri)

    def check(self) -> None:
        """Raise LeaseLost if another driver has taken the run over."""
        if self.lost is not None:
            raise self.lost
        try:
            _check_held(self.run_dir, self.generation, self.nonce)
        except LeaseLost as exc:
            self._lose(exc)
            raise

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (its files are kept, so generations keep increasing)."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():  # not from on_lost
            self._thread.join(timeout=_RELEASE_WAIT_S)
        if self.lost is not None:
            return
        if not self._writing.acquire(timeout=_RELEASE_WAIT_S):
            log.warning("could not release the lease of %s: a heartbeat write hangs; the next driver takes the run "
                        "over once the heartbeat stood still for %.0f s", self.run_dir.uri, self._ttl_s)
            return
        try:
            _check_held(self.run_dir, self.generation, self.nonce)
            released_at = self._now()
            self._write_beat(released_at)
            _write_record(self.run_dir, replace(self.holder, heartbeat_at=released_at, released_at=released_at))
            _fsync(self.run_dir.lease)
        except LeaseLost:
            pass  # someone else holds it now: theirs to keep
        except Exception as exc:  # noqa: BLE001 - releasing is best effort; a stale lease is taken over anyway
            log.warning("could not release the lease of %s (%s); the next driver takes it over once its heartbeat "
                        "stood still for %.0f s, or at once on this host", self.run_dir.uri, exc, self._ttl_s)
        finally:
            self._writing.release()

    def __enter__(self) -> RunLease:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def current_holder(run_dir: RunDir, *, ttl_s: float = LEASE_TTL_S,
                   now: Callable[[], float] = time.time) -> tuple[Holder | None, bool]:
    """The driver that holds or last held the run (None: none, or its claim is unreadable), with its
    newest heartbeat, and whether it seems to hold the run still: not released, its process alive
    where that can be checked, and its heartbeat time within the TTL of `now`.

    For display only (`orchestrator status`): a holder on another host is judged by its own clock
    here, which a takeover never does (it watches the heartbeat instead).
    """
    seen = _newest(run_dir)
    if seen is None or not seen.readable:
        return None, False
    holder = seen.holder
    for record in map(_read_json, seen.signs):  # its heartbeat file; lease.json where an older version beats
        if _names(record, holder):
            beat_at = record.get("at", record.get("heartbeat_at", 0.0))
            holder = replace(holder, heartbeat_at=max(holder.heartbeat_at, beat_at),
                             released_at=record.get("released_at") or holder.released_at)
    live = (holder.released_at is None and _process_alive(holder) is not False
            and now() - holder.heartbeat_at <= ttl_s)
    return holder, live


def refuse_if_held_here(run_dir: RunDir, *, ttl_s: float = LEASE_TTL_S) -> None:
    """RunBusy at once if a live driver on this host holds the run, writing nothing: what a second
    driver checks before its slow start (imports, the spec's classes), so that it is refused in a
    moment. Any other holder is judged by `RunLease.acquire`."""
    seen = _newest(run_dir)
    if seen is None or not seen.readable or _released(_look(seen), seen.holder):
        return
    if _process_alive(seen.holder):
        raise RunBusy(_busy_message(run_dir, seen.holder, ttl_s, "its process is alive on this host"))


def fence(run_dir: RunDir, generation: int, nonce: str) -> None:
    """Raise LeaseLost unless the driver that took `generation` with `nonce` still holds the run: its claim
    still carries that nonce, and no newer generation has been claimed. Call right before a commit or a
    deletion, with the driver's `RunLease.generation` and `RunLease.nonce`."""
    _check_held(run_dir, generation, nonce)


def _check_held(run_dir: RunDir, generation: int, nonce: str) -> None:
    claim = _read_holder(_claim_loc(run_dir, generation))
    if claim is not None and claim.nonce == nonce and not storage.exists(_claim_loc(run_dir, generation + 1)):
        return
    newest = _newest(run_dir)
    raise _lost(run_dir, generation, newest.holder if newest is not None and newest.holder.generation >= generation
                else None)


def _claim_loc(run_dir: RunDir, generation: int) -> Location:
    return run_dir.lease_claims.join(f"{generation:09d}")


def _beat_loc(run_dir: RunDir, generation: int) -> Location:
    return run_dir.lease_claims.join(f"{generation:09d}.beat")


def _read_holder(loc: Location) -> Holder | None:
    """The lease or claim at `loc`; None when it is missing or garbled."""
    try:
        return Holder.from_json(storage.read_bytes(loc))
    except (FileNotFoundError, ValueError):
        return None


def _read_bytes(loc: Location) -> bytes | None:
    try:
        return storage.read_bytes(loc)
    except FileNotFoundError:
        return None


def _read_json(loc: Location) -> dict:
    try:
        data = json.loads(_read_bytes(loc) or b"null")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _names(record: dict, holder: Holder) -> bool:
    """Whether a heartbeat or lease.json is the one of `holder` (and not of an older generation)."""
    return record.get("generation") == holder.generation and record.get("nonce") == holder.nonce


def _write_record(run_dir: RunDir, holder: Holder) -> None:
    storage.write_atomic(run_dir.lease, holder.to_json().encode())


def _newest(run_dir: RunDir) -> _Seen | None:
    """The holder of the newest claim; where `leases/` is gone, the one lease.json names."""
    names = [os.path.basename(info.path) for info in storage.list_dir(run_dir.lease_claims)]
    generations = [int(name) for name in names if name.isdigit()]
    if generations:
        generation = max(generations)
        return _seen_claim(run_dir, _read_claim(_claim_loc(run_dir, generation)))
    if not storage.exists(run_dir.lease):
        return None
    holder = _read_holder(run_dir.lease)
    if holder is None:  # garbled: whoever writes it is alive while it changes
        return _Seen(_unknown_holder("unreadable lease.json", 0), (run_dir.lease,), readable=False)
    return _Seen(holder, (run_dir.lease,))


def _seen_claim(run_dir: RunDir, holder: Holder) -> _Seen:
    # lease.json too: a driver of an older version beats there, not in the .beat file.
    return _Seen(holder, (_claim_loc(run_dir, holder.generation), _beat_loc(run_dir, holder.generation),
                          run_dir.lease), readable=not _is_unknown(holder))


def _unknown_holder(what: str, generation: int) -> Holder:
    """Stands in for a holder whose file cannot be read: no pid to check, no nonce to match."""
    return Holder(f"(unknown: {what})", -1, None, 0.0, generation, "", 0.0)


def _is_unknown(holder: Holder) -> bool:
    return holder.pid == -1 and holder.nonce == ""


def _wait_until_free(run_dir: RunDir, seen: _Seen, ttl_s: float, on_wait: Callable[[str], None] | None) -> None:
    """Return once `seen`'s holder is gone; raise RunBusy while it is alive.

    Where its pid can be checked, the pid answers at once. Elsewhere its heartbeat is watched for up
    to `ttl_s`: RunBusy as soon as it moves, a return once it stood still that long."""
    holder = seen.holder
    first = _look(seen)
    if _released(first, holder):
        return
    alive = _process_alive(holder)
    if alive is False:
        return
    if alive:
        raise RunBusy(_busy_message(run_dir, holder, ttl_s, "its process is alive on this host"))
    message = (f"run directory '{run_dir.uri}' is held by host {holder.host}, pid {holder.pid} (generation "
               f"{holder.generation}), which cannot be checked by its pid from here (another host or container): "
               f"watching its heartbeat for up to {ttl_s:g} s before taking the run over (refused as soon as "
               "it moves)")
    log.info("%s", message)
    if on_wait is not None:
        on_wait(message)
    newer = _claim_loc(run_dir, holder.generation + 1)
    deadline = time.monotonic() + ttl_s  # this process's clock only: other hosts' clocks may be off
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(_WATCH_POLL_S, ttl_s / 10, left))
        if storage.exists(newer):
            return  # another driver claimed the next generation first: that claim is the one to judge now
        latest = _look(seen)
        if _released(latest, holder):
            return
        if latest != first:
            raise RunBusy(_busy_message(run_dir, holder, ttl_s, "its heartbeat moved while this driver watched it"))
    log.info("the heartbeat of generation %d of %s stood still for %.0f s: taking the run over", holder.generation,
             run_dir.uri, ttl_s)


def _look(seen: _Seen) -> list[bytes | None]:
    """The contents of `seen`'s sign files, each as None unless it is about `seen`'s holder: a late write
    of an older generation's driver to lease.json is no sign that the holder watched is alive."""
    looks: list[bytes | None] = []
    for loc in seen.signs:
        data = _read_bytes(loc)
        try:
            record = json.loads(data) if data else None
        except ValueError:
            record = None  # garbled, or half written: any change in it counts
        if isinstance(record, dict) and not _names(record, seen.holder):
            data = None
        looks.append(data)
    return looks


def _released(signs: list[bytes | None], holder: Holder) -> bool:
    for data in signs:
        try:
            record = json.loads(data) if data else None
        except ValueError:
            continue
        if isinstance(record, dict) and _names(record, holder) and record.get("released_at") is not None:
            return True
    return False


def _process_alive(holder: Holder) -> bool | None:
    """Whether the holder's process runs (True) or is gone (False); None where its pid cannot be checked
    from here: another host, another kernel, another pid namespace, or a lease that does not say."""
    if not pid_means_here(holder.host, holder.boot_id, holder.pid_ns):
        return None
    if not is_alive(holder.pid):
        return False
    started = pid_started(holder.pid)
    return None in (started, holder.pid_started) or started == holder.pid_started


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
    # A write that lands later still makes two winners of one generation; the nonce in the fence
    # lets only the one the claim names write.
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
    # Still unreadable: its writer died mid-write, or is very slow; watching its files tells which.
    return _unknown_holder("unreadable claim", int(os.path.basename(loc.path)))


def _prune_claims(run_dir: RunDir, generation: int) -> None:
    """Delete the claims and heartbeats (and leftovers of their writes) of generations before the last three."""
    for info in storage.list_dir(run_dir.lease_claims):
        name = os.path.basename(info.path)
        prefix = name.split(".", 1)[0]
        if prefix.isdigit() and int(prefix) < generation - 2:
            try:
                run_dir.lease_claims.fs.delete_file(info.path)
            except OSError as exc:  # another driver pruned it first, or a storage hiccup: harmless
                log.debug("could not delete lease file %s: %s", info.path, exc)


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


def _busy_message(run_dir: RunDir, holder: Holder, ttl_s: float, why: str) -> str:
    started = (f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.started_at))} (its clock)"
               if holder.started_at > 0 else "")
    return (f"run directory '{run_dir.uri}' is held by a live driver: host {holder.host}, pid {holder.pid}{started}, "
            f"generation {holder.generation}; {why}. Fix: wait for it to finish, stop it (Ctrl-C in its terminal, "
            "or `ray job stop JOB_ID`), or give this run another name with --set name=NEW_NAME. A driver that died "
            "is taken over automatically: at once from the same host and container, elsewhere once its heartbeat "
            f"stood still for {ttl_s:g} s (LEASE_TTL_S).")


def _lost(run_dir: RunDir, generation: int, current: Holder | None) -> LeaseLost:
    if current is None:
        newer = "its lease claim is missing or unreadable"
    else:
        newer = f"generation {current.generation} now holds it (host {current.host}, pid {current.pid})"
    return LeaseLost(f"run directory '{run_dir.uri}' was taken over while this writer held lease generation "
                     f"{generation}: {newer}. This writer stops writing to it; the newer driver continues the run. "
                     "Fix: run one driver per run name; if this one was meant to keep the run, stop the other.")
