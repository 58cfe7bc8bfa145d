"""Fault injection for tests: jobs whose worker SIGKILLs itself once, at a chosen step.

The kill is real (the worker process dies without cleanup, as on an OOM kill or a node loss);
a marker file makes it happen only on the first attempt, so the restarted group runs through.
Nothing here changes what is trained: killed and clean runs must end with the same weights.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import signal
import time
from pathlib import Path

import pytorch_lightning
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from jobs.digits import DigitsClassifier
from jobs.digits_torch import train_loop as digits_train_loop

if os.environ.get("FAULTY_IMPORTS"):
    # Which process imported the job's code, and when it was done (a test of a local run's start
    # sets it: the command's own import, by its validation, is told from its ranks' by the pid).
    with open(os.environ["FAULTY_IMPORTS"], "a") as _imports:
        _imports.write(json.dumps({"pid": os.getpid(), "at": time.time()}) + "\n")


def _kill_once(marker: str, step: int, at: int, rank: int, on_rank: int, signum: int = signal.SIGKILL) -> None:
    if step == at and rank == on_rank and not Path(marker).exists():
        Path(marker).write_text(str(step))
        os.kill(os.getpid(), signum)


def _fault_step(ctx, act) -> None:
    """Run jobs.digits_torch's loop, calling act(step) after every ctx.step()."""
    original_step = ctx.step

    def step(**metrics):
        original_step(**metrics)
        act(ctx.global_step)

    ctx.step = step
    digits_train_loop(ctx)


def _deadlock_once(marker: str, step: int, at: int, rank: int, on_rank: int) -> None:
    """Rank `on_rank` stops making progress after step `at`: it waits on an event nobody sets,
    while its process (and its heartbeat) keep running."""
    import threading

    if step == at and rank == on_rank and not Path(marker).exists():
        Path(marker).write_text(str(step))
        threading.Event().wait()


def torch_loop_frozen_then_deadlocked(ctx) -> None:
    """jobs.digits_torch's loop; first rank `fault.kill_rank` is SIGSTOPped after step
    `fault.kill_at`, then (in the restarted group) rank `stuck.kill_rank` deadlocks after
    `stuck.kill_at`. With `slow_epoch_end_s`, the end of the first epoch takes that much longer
    (a slow evaluation: legitimately long, not a hang)."""
    import time

    fault, stuck = ctx.config.pop("fault"), ctx.config.pop("stuck")
    slow_s = ctx.config.pop("slow_epoch_end_s", 0)
    original_report = ctx.report

    def report(**metrics):
        if "val_acc" in metrics and ctx.epoch == 0:
            time.sleep(slow_s)
        original_report(**metrics)

    ctx.report = report

    def act(step):
        _kill_once(fault["marker"], step, fault["kill_at"], ctx.rank, fault["kill_rank"], signal.SIGSTOP)
        _deadlock_once(stuck["marker"], step, stuck["kill_at"], ctx.rank, stuck["kill_rank"])

    _fault_step(ctx, act)


def torch_loop_raises(ctx) -> None:
    """jobs.digits_torch's loop with a bug: rank 1 raises at step `raise_at`, on every attempt."""
    raise_at = ctx.config.pop("raise_at")

    def act(step):
        if step == raise_at and ctx.rank == 1:
            raise ValueError(f"bad batch at step {step}")

    _fault_step(ctx, act)


def torch_loop_killed_once(ctx) -> None:
    """jobs.digits_torch's loop; the worker of rank `kill_rank` dies after step `kill_at`."""
    fault = ctx.config.pop("fault")
    _fault_step(ctx, lambda step: _kill_once(fault["marker"], step, fault["kill_at"], ctx.rank,
                                             fault.get("kill_rank", 1)))


class Split(enum.Enum):
    TRAIN = "train"


class KilledOnceClassifier(DigitsClassifier):
    """The quickstart model; the worker of rank `kill_rank` dies after optimizer step `kill_at`.

    Its hyperparameters hold a path and an enum, as users' modules do (`save_hyperparameters()`
    records them); the checkpoint it resumes from must still load without unpickling them."""

    def __init__(self, kill_at: int, marker: str, kill_rank: int = 1, cache_dir: Path = Path("cache"),
                 split: Split = Split.TRAIN, **kwargs):
        super().__init__(**kwargs)
        self._fault = (marker, kill_at, kill_rank)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        marker, kill_at, kill_rank = self._fault
        _kill_once(marker, self.trainer.global_step, kill_at, self.global_rank, kill_rank, self.signum)

    signum = signal.SIGKILL


class FrozenOnceClassifier(KilledOnceClassifier):
    """The quickstart model; the worker of rank `kill_rank` is SIGSTOPped after step `kill_at`.
    With `slow_validation_s`, the first epoch's validation takes that much longer: legitimately
    long, not a hang."""

    signum = signal.SIGSTOP

    def __init__(self, slow_validation_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.slow_validation_s = slow_validation_s

    def on_validation_epoch_end(self):
        import time

        if not self.trainer.sanity_checking and self.current_epoch == 0:
            time.sleep(self.slow_validation_s)


class KilledThenFrozenClassifier(FrozenOnceClassifier):
    """FrozenOnceClassifier (rank `kill_rank` SIGSTOPped after step `kill_at`), whose worker of
    rank `first_kill_rank` was SIGKILLed once before, after step `first_kill_at`."""

    def __init__(self, first_kill_at: int, first_marker: str, first_kill_rank: int = 1, **kwargs):
        super().__init__(**kwargs)
        self._first_fault = (first_marker, first_kill_at, first_kill_rank)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        marker, kill_at, kill_rank = self._first_fault
        _kill_once(marker, self.trainer.global_step, kill_at, self.global_rank, kill_rank, signal.SIGKILL)
        super().on_train_batch_end(outputs, batch, batch_idx)


class BuggyClassifier(DigitsClassifier):
    """The quickstart model with a bug: training_step raises on rank 1 at step `raise_at`, after
    `pause_s` in that step (its heartbeats meanwhile say it trains, at that step)."""

    def __init__(self, raise_at: int, pause_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.raise_at, self.pause_s = raise_at, pause_s

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and self.trainer.global_step == self.raise_at:
            time.sleep(self.pause_s)
            raise KeyError(f"no such feature at step {self.raise_at}")
        return super().training_step(batch, batch_idx)


def _mark(marker: str | None, step: int, at: int | None, rank: int) -> None:
    """Rank 0 writes `marker` once step `at` is done, so a test can interrupt the run right there."""
    if marker and step == at and rank == 0 and not Path(marker).exists():
        Path(marker).write_text(str(step))


def _record_env(ctx, record: dict | None) -> None:
    """With `env_record: {dir, variable}`, each worker writes the variable as its process sees it."""
    if record:
        Path(record["dir"], f"rank-{ctx.rank}-attempt-{ctx.attempt}").write_text(
            os.environ.get(record["variable"], "<unset>"))


def slow_loop(ctx) -> None:
    """jobs.digits_torch's loop, slowed down so it can be interrupted from outside (driver kill,
    ray job stop); with `mark_at` and `marker` in its config it announces that step, and with
    `hold_s` rank 0 then waits that long once, so the run is still there however long the test
    takes to act on the marker; with `release` too, only until that file exists. A stop the
    driver asks for ends the wait at once (the rank's heartbeat heard it), so that the stop
    checkpoint comes within the stop's grace however long the wait."""
    import time

    sleep_s = ctx.config.pop("sleep_s", 0.2)
    marker, mark_at = ctx.config.pop("marker", None), ctx.config.pop("mark_at", None)
    hold_s, release = ctx.config.pop("hold_s", 0.0), ctx.config.pop("release", None)
    _record_env(ctx, ctx.config.pop("env_record", None))
    original_step = ctx.step

    def step(**metrics):
        time.sleep(sleep_s)
        original_step(**metrics)
        if marker and not os.path.exists(marker):
            _mark(marker, ctx.global_step, mark_at, ctx.rank)
            if os.path.exists(marker):
                heartbeat, until = getattr(ctx._session, "heartbeat", None), time.monotonic() + hold_s
                while (time.monotonic() < until and not getattr(heartbeat, "stop_requested", False)
                       and not (release and os.path.exists(release))):
                    time.sleep(0.1)

    ctx.step = step
    digits_train_loop(ctx)


def slow_loop_killed_once(ctx) -> None:
    """slow_loop, and the worker of rank `fault.kill_rank` dies once after step `fault.kill_at`."""
    fault = ctx.config.pop("fault")
    original_step = ctx.step

    def step(**metrics):
        original_step(**metrics)
        _kill_once(fault["marker"], ctx.global_step, fault["kill_at"], ctx.rank, fault.get("kill_rank", 1))

    ctx.step = step
    slow_loop(ctx)


class SlowClassifier(DigitsClassifier):
    """The quickstart model, slowed down; rank 0 writes `marker` after optimizer step `mark_at`,
    and with `hold_s` then waits that long, once (the run that wrote the marker), so the run is
    still there however long the test takes to act on it."""

    def __init__(self, sleep_s: float = 0.2, marker: str | None = None, mark_at: int | None = None,
                 hold_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self._slow = (sleep_s, marker, mark_at, hold_s)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        import time

        sleep_s, marker, mark_at, hold_s = self._slow
        time.sleep(sleep_s)
        if marker and not os.path.exists(marker):
            _mark(marker, self.trainer.global_step, mark_at, self.global_rank)
            if os.path.exists(marker):
                time.sleep(hold_s)


class CustomCheckpoint(ModelCheckpoint):
    """A user's own ModelCheckpoint subclass: refused by the spec (a second checkpoint mechanism)."""


class OldPackageModel(pytorch_lightning.LightningModule):
    """A module written against the older package name: refused with the import to change."""


def _record_start(starts: str, rank: int, attempt: int) -> None:
    """A JSON line for this start of a rank: who it is, its parent (the node's agent), the restarts,
    and when its process was created (time.time(), from /proc)."""
    import json

    with open(starts, "a") as f:
        f.write(json.dumps({"rank": rank, "pid": os.getpid(), "ppid": os.getppid(), "attempt": attempt,
                            "restart_count": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                            "created": _process_created()}) + "\n")


def _process_created() -> float:
    """This process's creation, in time.time() seconds: its age from /proc/self/stat's starttime
    (clock ticks after boot), against the clock since boot now."""
    import time

    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def _fault_once(faults: list[dict], step: int, rank: int) -> None:
    """The fault of `faults` ({at, rank, how, marker}) due at this step on this rank, once each."""
    for fault in faults:
        if step != fault["at"] or rank != fault["rank"] or Path(fault["marker"]).exists():
            continue
        Path(fault["marker"]).write_text(str(step))
        if fault["how"] == "raise":
            raise ConnectionResetError(f"injected: the peer went away at step {step}")
        os.kill(os.getpid(), signal.SIGKILL if fault["how"] == "kill" else signal.SIGSTOP)


def torch_loop_three_faults(ctx) -> None:
    """jobs.digits_torch's loop with one fault per attempt, each once (a marker file per fault):
    `faults` is a list of {at, rank, how, marker}, how one of kill (SIGKILL), stop (SIGSTOP: frozen)
    or raise (a lost peer's ConnectionResetError, an infrastructure error). Every start of a rank
    appends who it is to `starts` (_record_start). With `pace_s`, each step takes that much longer."""
    import time

    faults, starts, pace_s = ctx.config.pop("faults"), ctx.config.pop("starts"), ctx.config.pop("pace_s", 0)
    _record_start(starts, ctx.rank, ctx.attempt)

    def act(step):
        time.sleep(pace_s)
        _fault_once(faults, step, ctx.rank)

    _fault_step(ctx, act)


class ThreeFaultsClassifier(DigitsClassifier):
    """The quickstart model meeting torch_loop_three_faults' faults, after the optimizer step of
    each step named, and recording each start of its rank the same way (with `pace_s`, each step
    takes that much longer)."""

    def __init__(self, faults: list, starts: str, pace_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self._faults, self._starts, self._pace_s = faults, starts, pace_s

    def on_fit_start(self):
        _record_start(self._starts, self.global_rank, int(os.environ["ORCHESTRATOR_ATTEMPT"]))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        import time

        time.sleep(self._pace_s)
        _fault_once(self._faults, self.trainer.global_step, self.global_rank)


class SlowToFail(Callback):
    """A callback whose `on_exception` takes `seconds` in a C call that keeps the interpreter's
    lock (as a logger's extension flushing its run as it is marked failed may): Lightning calls it
    as an exception leaves the training step, before the exception leaves `Trainer.fit`, and no
    other thread of the rank (its heartbeat's) runs meanwhile."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def on_exception(self, trainer, pl_module, exception):
        ctypes.PyDLL(None).sleep(self.seconds)  # libc's sleep, called without releasing the GIL
