"""Checkpoint benchmark job: ~100 MB of model + optimizer state (12.6 M float32 parameters and as
many SGD momentum values), trained with a checkpoint every N steps.

mode "async": the orchestrator checkpoints (ctx.step -> snapshot -> background write).
mode "sync":  the loop itself calls torch.save every N steps, the usual synchronous baseline. It
              tracks nothing, so the orchestrator neither snapshots nor holds snapshot memory.
Both report the seconds the training loop was blocked by checkpointing, the loop's wall time, and
rank 0's peak memory above its training footprint (`PeakMemory`). Async also reports how long
each checkpoint took from its hand-off to the writer until it was committed and read back
(`CommitWatcher`).
"""

from __future__ import annotations

import ctypes
import os
import re
import statistics
import threading
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Seconds between two listings of the checkpoints folder.
POLL_S = 0.005
# Seconds between two readings of malloc's bytes in use.
HEAP_SAMPLE_S = 0.002
# Seconds to wait after training for the last checkpoint to be read back.
FINAL_WAIT_S = 120.0
STEP_DIR = re.compile(r"^step-(\d+)$")


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))


def train_loop(ctx) -> None:
    cfg = ctx.config
    asynchronous = cfg["mode"] == "async"
    torch.manual_seed(0)
    model = ctx.prepare_model(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if asynchronous:
        ctx.track(model=model, optimizer=optimizer)
    x, y = torch.randn(cfg["batch_size"], 2048), torch.randn(cfg["batch_size"], 2048)
    memory = PeakMemory()
    watcher = CommitWatcher(cfg["ckpt_dir"], cfg["keep_last"]) if asynchronous and ctx.rank == 0 else None
    sync_stall = 0.0
    start = time.perf_counter()
    for _ in ctx.epochs():
        for step in range(cfg["steps"]):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            if step == 0:  # the whole state exists now (momentum too), no snapshot memory yet
                memory.start()
            saving = (step + 1) % cfg["every"] == 0
            if not asynchronous and saving:
                t0 = time.perf_counter()
                path = os.path.join(cfg["sync_dir"], f"step-{step + 1}.pt")
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
                sync_stall += time.perf_counter() - t0
            ctx.step()
            if watcher is not None and saving:
                watcher.handed(ctx.global_step)
        break
    loop_wall = time.perf_counter() - start
    metrics = {"loop_wall_s": loop_wall, "sync_stall_s": sync_stall,
               "state_bytes": float(tensor_bytes([model.state_dict(), optimizer.state_dict()]))}
    if watcher is not None:
        watcher.wait_last(FINAL_WAIT_S)  # so that the peak covers every save, the last one too
        metrics.update(watcher.summary())
    metrics.update(memory.stop())
    ctx.report(**metrics)


class PeakMemory:
    """Rank 0's peak memory above its training footprint, counted two ways.

    `start()` is called right after the first optimizer step: parameters, gradients and momentum
    all exist, the snapshot memory does not yet (the first ctx.step() prepares it).
    - rss: the process's resident memory, what the machine must provide. Writing "5" to
      /proc/self/clear_refs resets the kernel's VmHWM to the VmRSS of that moment; VmHWM then
      holds the exact peak since. It also counts memory that glibc keeps after a free: the
      gradients (16.8 MB a tensor) are freed and allocated again every step, so the training
      alone moves it by tens of MB, with or without checkpoints.
    - heap: bytes that malloc has handed out and not taken back (glibc's mallinfo2(),
      uordblks + hblkhd), sampled every HEAP_SAMPLE_S by a daemon thread: what the process
      holds, without the allocator's leftovers. It misses peaks shorter than a sample and
      memory not from malloc (pyarrow's own pool).
    Either stays None where the kernel or the C library does not offer it.
    """

    def __init__(self) -> None:
        self.rss_baseline: int | None = None
        self.heap_baseline: int | None = None
        self._heap_peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rss_baseline = _status_bytes("VmRSS")
        except OSError:
            pass
        if _mallinfo2 is not None:
            self.heap_baseline = self._heap_peak = _heap_bytes()
            self._thread = threading.Thread(target=self._sample, name="bench-heap-sampler", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(HEAP_SAMPLE_S):
            self._heap_peak = max(self._heap_peak, _heap_bytes())

    def stop(self) -> dict[str, float]:
        """The peaks above the baselines, in bytes, as metrics."""
        out = {}
        if self.rss_baseline is not None:
            out["peak_rss_extra_bytes"] = float(_status_bytes("VmHWM") - self.rss_baseline)
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            out["peak_heap_extra_bytes"] = float(self._heap_peak - self.heap_baseline)
        return out


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise KeyError(field)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _load_mallinfo2():
    try:
        function = ctypes.CDLL(None).mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_mallinfo2 = _load_mallinfo2()


def _heap_bytes() -> int:
    info = _mallinfo2()
    return info.uordblks + info.hblkhd  # in use in malloc's arenas + in its own mmaps


class CommitWatcher:
    """Seconds from each checkpoint's hand-off to the writer until it is committed and read back.

    The store tells user code nothing when a write ends, so a daemon thread lists the run's
    checkpoints folder every POLL_S seconds (local storage) and notes when each `step-<N>`
    folder appears and disappears:
    - it appears when the checkpoint is committed: files and manifest written and fsynced, the
      folder renamed into place;
    - the store then reads it back (sha256 of every file), and only a checkpoint read back intact
      lets retention delete older ones. So when an older folder disappears, the newest one has
      just been confirmed (plus one listing of a few manifests, a few ms). With keep_last K, the
      first K checkpoints make nothing disappear, and their confirmation is not seen.
    The hand-off is timed in the loop right after the ctx.step() that saved: that call returns as
    soon as the snapshot is in the writer's hands.
    """

    def __init__(self, root: str, keep_last: int):
        self.root, self.keep_last = root, keep_last
        self._handed: dict[int, float] = {}
        self._appeared: dict[int, float] = {}
        self._confirmed: dict[int, float] = {}
        self._gone: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="bench-commit-watcher", daemon=True)
        self._thread.start()

    def handed(self, step: int) -> None:
        self._handed[step] = time.monotonic()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            try:
                names = os.listdir(self.root)
            except FileNotFoundError:
                continue
            present = {int(m.group(1)) for m in map(STEP_DIR.match, names) if m}
            for step in present - self._appeared.keys():
                self._appeared[step] = now
            vanished = self._appeared.keys() - present - self._gone
            if vanished and present:
                self._gone |= vanished
                self._confirmed.setdefault(max(present), now)

    def wait_last(self, timeout_s: float) -> None:
        """Until the last checkpoint handed over is confirmed (or committed, when it cannot be seen)."""
        last = max(self._handed, default=None)
        confirmable = len(self._handed) > self.keep_last
        deadline = time.monotonic() + timeout_s
        while last is not None and time.monotonic() < deadline:
            if last in (self._confirmed if confirmable else self._appeared):
                break
            time.sleep(POLL_S)
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        confirmed = [self._confirmed[s] - t for s, t in self._handed.items() if s in self._confirmed]
        appeared = [self._appeared[s] - t for s, t in self._handed.items() if s in self._appeared]
        out = {"checkpoints_handed": float(len(self._handed)), "checkpoints_confirmed_seen": float(len(confirmed))}
        if confirmed:
            out.update(commit_median_s=statistics.median(confirmed), commit_max_s=max(confirmed))
        if appeared:
            out.update(visible_median_s=statistics.median(appeared), visible_max_s=max(appeared))
        return out


def tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0
