"""torchrun scripts: an unmodified torchrun script under `orchestrator torchrun` against plain `torchrun`.

The script is tests/helpers/torchrun_seed.py (env:// init, DistributedSampler, DDP, SGD with momentum, its
own checkpoint at each epoch end, --resume_from latest), 2 ranks on this machine. Rank 0 appends
its events to <work_dir>/events.jsonl ("start" after init_process_group, "first_step" after the
first optimizer step of each start of the ranks, "rate"); a fault leaves a marker file holding the
time.time() of the fault. Every figure is read off those files, the same way for both sides.

  a. steps/s of a clean run: the "rate" event, timed inside the loop from the first step to the
     end (2 epochs, a 32 -> 32768 -> 4 MLP, batch 128 a rank: ~45 ms a step here). Ratio
     orchestrator ÷ torchrun, goal >= 0.99.
  b. in-place restart after a SIGKILLed rank (--fault kill: rank 1 kills itself at step 3 of epoch
     1; --step_sleep 0.05, a small MLP): seconds from the kill to the first step of the restarted
     ranks (TORCHELASTIC_RESTART_COUNT 1), which resume from the script's own epoch checkpoint.
     torchrun --max_restarts 1 against orchestrator torchrun --max_restarts 1. Ratio
     orchestrator ÷ torchrun, goal <= 1.5. Plain torchrun needs two things to restart at all on
     torch 2.13 here: the c10d rendezvous on loopback (with the static one the restarted ranks
     hang in init_process_group), and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: otherwise the
     rendezvous' TCPStore, kept across restarts and shared with the ranks, still holds the first
     attempt's keys, and the restarted ranks' gloo connects to the dead ranks' addresses
     ("connectFullMesh failed ... Connection refused"). The bench sets it for torchrun's side.
  c. the same fault on the ctx path: bench/torchrun_ctx_job.py (the same MLP, data, batch and
     sleep, written for ctx) through `orchestrator run SPEC.yaml`, 2 workers, a checkpoint every
     5 steps, failure.max_failures 1. Rank 1 is a child of its node's agent there, restarted in
     place with its peer. Restart = kill -> first step of the next attempt. Ratio this ÷ b's
     plain torchrun figure, goal <= 1.5.
  e. the same run with rank 1's agent (the Ray Train worker, the rank's parent) SIGKILLed instead:
     Ray Train restarts the whole worker group. Ratio c ÷ e, goal <= 0.35.
  l. the same fault on the Lightning path: bench/torchrun_lightning_job.py (the same MLP, data,
     batch and sleep as a LightningModule, Lightning's DDPStrategy in each rank) through a
     `lightning:` spec, against plain torchrun running the same module as a Lightning script
     (ModelCheckpoint every 5 steps, ckpt_path="last"): both pay Lightning's imports on a restart.
     Ratio orchestrator ÷ torchrun, goal <= 1.5.
  m. l with rank 1's agent SIGKILLed: Ray Train's group restart. Ratio l ÷ m, goal <= 0.35.
  d. a SIGSTOPped rank (--fault stop, same place): orchestrator torchrun with
     failure.hang_timeout_s 10 detects the silent rank, dumps the stacks and restarts the ranks in
     place: seconds from the stop to the first step after the restart. Plain torchrun has no hang
     detection (rank 0 waits in gloo's all-reduce for its 30 min timeout): it is given --stop-wait
     seconds (90) after the stop to take a step, then ended.

a also prints, over the same window and sampled from /proc, rank 0's CPU milliseconds a step (all
its threads) and the CPU used by everything else the command started, in % of a core (torchrun's
agent; the CLI, Ray's processes and the node's supervisor): where steps/s differ and CPU time a
step does not, a rank was waiting for a core, and the second figure says how much the launcher
took of the cores the ranks share. b
and d also print when the restarted rank 0's process was started (from /proc: the launcher's own
share of the restart) and its "start" event (the script's start-up: Python, imports,
init_process_group), each in seconds after the fault.

Each part runs both sides in a round, alternating, the sides taking turns at going first, for
--rounds rounds; figures are medians over the rounds (ratios: the median of the rounds' ratios).
Start-up is not in any figure. Each measurement has a folder of its own in a temp dir (removed at
the end unless --keep DIR) and a time limit (--timeout). Every command starts in a session of its
own; the bench remembers every process it starts (the command and all its descendants, looked up
in /proc while it runs) and SIGKILLs by pid whatever is left when a measurement ends, plus the
processes of any embedded Ray cluster whose driver did not end it (the orchestrator's driver
records, in a private ORCHESTRATOR_STATE_DIR: no warm cluster of `orchestrator up` is joined).

    python bench/torchrun.py [--rounds 1] [--skip c,d] [--keep DIR] [--stop-wait 90] [--timeout 300]
    python bench/torchrun.py --gpu      # parts a and b only: NCCL, one GPU a rank (at most 2 ranks)
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.jsonl import read_jsonl  # noqa: E402 - after the path is set

SEED = os.path.join(REPO, "tests", "helpers", "torchrun_seed.py")
LIGHTNING_SCRIPT = os.path.join(REPO, "bench", "torchrun_lightning_job.py")
PARTS = {"a": "steps/s", "b": "SIGKILL, in place", "c": "SIGKILL, ctx path", "d": "SIGSTOP",
         "e": "SIGKILLed agent, ctx path", "l": "SIGKILL, Lightning path", "m": "SIGKILLed agent, Lightning path"}
# The parts run through `orchestrator run SPEC` alone: part -> (runtime, fault, what).
RUN_PARTS = {"c": ("torch", "kill", "ctx path (in place)"),
             "e": ("torch", "kill_agent", "ctx path, agent killed (group restart)"),
             "m": ("lightning", "kill_agent", "Lightning path, agent killed (group restart)")}
SIDES = ("torchrun", "orchestrator")

# a: heavy enough that a step takes tens of ms on a CPU core (45 ms here), 256 steps a rank.
RATE_ARGS = ["--width", "32768", "--samples", "32768", "--batch_size", "128", "--epochs", "2"]
# On GPUs: larger batches (the data loader's collation, on the CPU, is then most of a step).
GPU_RATE_ARGS = ["--width", "32768", "--samples", "262144", "--batch_size", "1024", "--epochs", "2"]
# b, c, d: a small model slowed to ~55 ms a step; 32 steps an epoch a rank, 3 epochs.
FAULT_WORKLOAD = {"width": 1024, "samples": 4096, "batch_size": 64, "epochs": 3, "step_sleep": 0.05}
FAULT_AT = {"epoch": 1, "step": 3}
CTX_CHECKPOINT_EVERY = 5
HANG_TIMEOUT_S = 10
POLL_S = 0.25


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- processes --------------------------------------------------------------------------------------


TICK = os.sysconf("SC_CLK_TCK")


def _process_table() -> tuple[dict[int, list[tuple[int, int]]], dict[int, float]]:
    """(parent pid -> [(pid, start time in clock ticks)], pid -> CPU seconds) for every process."""
    children: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children[int(fields[1])].append((int(entry), int(fields[19])))
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / TICK
    return children, cpu


def _boot_wall_time() -> float:
    """time.time() at boot: a /proc start time (clock ticks since boot) plus this is a wall time."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat else None


def _still_there(pid: int, started: int | None) -> bool:
    """Alive (not a zombie waiting to be reaped) and the process seen (not a reused pid)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and started is not None and stat[1] == started


def _kill(pid: int, started: int | None) -> bool:
    if not _still_there(pid, started):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


class Command:
    """A command in a session of its own, its output in a file, and every process it starts,
    remembered (pid and start time) as they are seen, so that all of them can be ended by pid."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: str):
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.started = time.time()
        self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: dict[int, int | None] = {self.process.pid: _start_time(self.process.pid)}
        # pid -> [(time.time(), CPU seconds)] at every look; pid -> command line, as first seen.
        self.cpu: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
        self.cmdlines: dict[int, str] = {}
        self.look()

    def look(self) -> None:
        table, cpu = _process_table()
        now = time.time()
        todo = list(self.seen)
        while todo:
            for pid, started in table.get(todo.pop(), []):
                if pid not in self.seen:
                    self.seen[pid] = started
                    todo.append(pid)
        for pid in self.seen:
            if pid in cpu:
                self.cpu[pid].append((now, cpu[pid]))
            if pid in cpu:  # read again at every look: a fork's child shows its parent's until it execs
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        line = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    line = ""
                if line:
                    self.cmdlines[pid] = line

    def ranks(self) -> list[int]:
        """The seen processes that ran the training script (not the launcher naming it)."""
        script = os.path.basename(SEED)
        return [pid for pid, line in self.cmdlines.items() if script in line and pid != self.process.pid]

    def spawned_at(self, pid: int) -> float | None:
        """The wall time a process seen among the command's was started (10 ms resolution)."""
        started = self.seen.get(pid)
        return None if started is None else _boot_wall_time() + started / TICK

    def cpu_share(self, pids, start: float, end: float) -> float | None:
        """CPU seconds per second of the seen processes `pids` together over [start, end], each
        counted between its first and its last look inside (None: the window is under 1 s)."""
        if end - start < 1.0:
            return None
        used = 0.0
        for pid in pids:
            inside = [c for t, c in self.cpu.get(pid, []) if start <= t <= end]
            if len(inside) >= 2:
                used += inside[-1] - inside[0]
        return used / (end - start)

    def wait(self, timeout: float, until=None) -> str:
        """'exited', 'until' (the predicate came true) or 'timeout'."""
        deadline = time.monotonic() + timeout
        while True:
            self.look()
            if self.process.poll() is not None:
                return "exited"
            if until is not None and until():
                return "until"
            if time.monotonic() >= deadline:
                return "timeout"
            time.sleep(POLL_S)

    def end(self) -> int:
        """SIGKILL the command's process group and every remembered process still alive (those
        of a command that exited by itself get 2 s to go first). Returns how many processes a
        command that had exited left behind (0 for one that was still running: ending it is the plan)."""
        self.look()
        running = self.process.poll() is None
        if running:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and any(
                    _still_there(pid, started) for pid, started in self.seen.items() if pid != self.process.pid):
                time.sleep(0.1)
        left = sum(_kill(pid, started) for pid, started in self.seen.items() if pid != self.process.pid)
        self.process.wait()
        self._log.close()
        return 0 if running else left

    def tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def _reap_embedded_clusters(state_dir: str) -> int:
    """Kill, by pid, the processes of embedded Ray clusters whose driver died without ending them
    (the driver's record is left in the private state dir then)."""
    from orchestrator.processes import is_alive, session_pids

    killed = 0
    for record in glob.glob(os.path.join(state_dir, "driver-*.json")):
        try:
            with open(record) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if is_alive(data.get("pid", -1)) or not data.get("session_dir"):
            continue
        for pid in session_pids(data["session_dir"]):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        os.unlink(record)
    return killed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the two sides ----------------------------------------------------------------------------------


class Setup:
    def __init__(self, args: argparse.Namespace, root: str):
        self.args, self.root = args, root
        self.state_dir = os.path.join(root, "orchestrator-state")
        os.makedirs(self.state_dir, exist_ok=True)
        self.nproc = args.nproc
        if args.gpu:
            import torch

            self.nproc = min(args.nproc, torch.cuda.device_count())
        # Both sides get the same environment: OMP_NUM_THREADS only with --omp-threads (else each
        # sets 1 for 2 ranks a node), no Ray address (the orchestrator starts an embedded cluster).
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("OMP_NUM_THREADS", "RAY_ADDRESS") and not k.startswith("RAY_TRAIN_")}
        if args.omp_threads:  # as a user's shell exports it: torchrun's ranks inherit it, and so do ours
            self.env["OMP_NUM_THREADS"] = str(args.omp_threads)
        self.env["ORCHESTRATOR_STATE_DIR"] = self.state_dir
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        # torch 2.13's c10d rendezvous shares its TCPStore with the ranks (TORCHELASTIC_USE_AGENT_STORE)
        # and keeps it across restarts, first attempt's keys included: the restarted ranks' gloo
        # connects to the dead ranks' addresses ("connectFullMesh failed ... Connection refused")
        # and torchrun's restart fails. Without the sharing, rank 0 hosts a fresh store each start.
        self.torchrun_env = {**self.env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    def folder(self, label: str) -> str:
        path = os.path.join(self.root, label)
        os.makedirs(path, exist_ok=True)
        return path

    def command(self, side: str, folder: str, script_args: list[str],
                sets: tuple[str, ...] = (), script: str = SEED) -> tuple[list[str], str]:
        """The argv of one side and the script's work dir."""
        if side == "torchrun":
            work = os.path.join(folder, "work")
            return ([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                     str(self.nproc), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{_free_port()}",
                     "--max_restarts", "1", script, "--work_dir", work, *script_args], work)
        argv = [sys.executable, "-m", "orchestrator", "torchrun", "--nproc_per_node", str(self.nproc),
                "--max_restarts", "1", "--storage", folder, "--name", "run"]
        for item in sets:
            argv += ["--set", item]
        if self.args.gpu:
            argv.append("--gpu")
        return [*argv, SEED, "--work_dir", "{run_dir}/work", *script_args], os.path.join(folder, "run", "work")

    def start(self, side: str, argv: list[str], folder: str) -> Command:
        env = self.torchrun_env if side == "torchrun" else self.env
        return Command(argv, env, os.path.join(folder, "output.log"))

    def finish(self, command: Command) -> dict:
        """End what is left of a measurement's processes; note what a command that exited left behind."""
        left = command.end() + _reap_embedded_clusters(self.state_dir)
        return {"left_behind": left} if left else {}


def _events(work: str) -> list[dict]:
    return read_jsonl(os.path.join(work, "events.jsonl"))


def _marker(work: str, fault: str) -> float | None:
    try:
        with open(os.path.join(work, f"fault-{fault}.done")) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def _fault_args(setup: Setup, fault: str) -> list[str]:
    w = FAULT_WORKLOAD
    return ["--width", str(w["width"]), "--samples", str(w["samples"]), "--batch_size", str(w["batch_size"]),
            "--epochs", str(w["epochs"]), "--step_sleep", str(w["step_sleep"]), "--fault", fault,
            "--fault_rank", str(setup.nproc - 1), "--fault_epoch", str(FAULT_AT["epoch"]),
            "--fault_step", str(FAULT_AT["step"])]


def _failed(command: Command, outcome: str, what: str) -> dict:
    if outcome == "timeout":
        return {"error": f"{what}: not done within the time limit", "log": command.log_path}
    code = command.process.returncode
    return {"error": f"{what}: exited with status {code}", "log": command.log_path,
            "tail": command.tail()} if code else {}


def _restart(events: list[dict], fault_at: float | None, key: str, after: int, command: Command | None = None
             ) -> dict:
    """Seconds from the fault to the restarted rank 0's process start (where `command` saw it: not
    for Ray's pre-started workers), its "start" event (after init_process_group) and its first step."""
    if fault_at is None:
        return {"error": "the fault never happened (no marker file)"}
    first = next((e for e in events if e["kind"] == "first_step" and e[key] > after), None)
    start = next((e for e in events if e["kind"] == "start" and e[key] > after), None)
    if first is None:
        return {"error": "no first step after the fault"}
    got = {"restart_s": first["time"] - fault_at}
    if start is not None:
        got["to_start_s"] = start["time"] - fault_at
        spawned = command.spawned_at(start["pid"]) if command is not None else None
        if spawned is not None:
            got["to_spawn_s"] = spawned - fault_at
    return got


# --- the parts --------------------------------------------------------------------------------------


def _merge(got: dict, measured: dict) -> dict:
    """The run's own outcome over the figures read off its files (an error names the run first)."""
    return {**measured, **got} if "error" in got else {**got, **measured}


def part_rate(setup: Setup, side: str, label: str) -> dict:
    folder = setup.folder(label)
    argv, work = setup.command(side, folder, GPU_RATE_ARGS if setup.args.gpu else RATE_ARGS)
    command = setup.start(side, argv, folder)
    got: dict = {}
    try:
        got = _failed(command, command.wait(setup.args.timeout), f"{side} clean run")
        got["wall_s"] = time.time() - command.started
        events = _events(work)
        rate = next((e for e in events if e["kind"] == "rate"), None)
        first = next((e for e in events if e["kind"] == "first_step"), None)
        if rate is not None:
            got.update(steps_per_s=rate["steps_per_s"], steps=rate["steps"])
            if first is not None:
                # Over the same window, from /proc: rank 0's CPU time a step (all its threads), and
                # the CPU time of everything else the command started (the launcher: torchrun's
                # agent; the CLI, Ray's processes and the node's supervisor), in cores.
                ranks = command.ranks()
                share = command.cpu_share([rate["pid"]], first["time"], rate["time"])
                if share is not None:
                    got["cpu_ms_per_step"] = 1000 * share / rate["steps_per_s"]
                others = [pid for pid in command.seen if pid not in ranks]
                launcher = command.cpu_share(others, first["time"], rate["time"])
                if launcher is not None:
                    got["launcher_cores"] = launcher
        elif "error" not in got:
            got["error"] = f"{side} clean run: no rate event"
    finally:
        got.update(setup.finish(command))
    return got


def part_kill(setup: Setup, side: str, label: str) -> dict:
    folder = setup.folder(label)
    argv, work = setup.command(side, folder, _fault_args(setup, "kill"))
    command = setup.start(side, argv, folder)
    got: dict = {}
    try:
        got = _failed(command, command.wait(setup.args.timeout), f"{side} with a SIGKILLed rank")
        got = _merge(got, _restart(_events(work), _marker(work, "kill"), "restart", 0, command))
    finally:
        got.update(setup.finish(command))
    return got


def part_lightning(setup: Setup, side: str, label: str) -> dict:
    """A SIGKILLed rank of the Lightning job: plain torchrun running it as a script, or its spec."""
    if side == "orchestrator":
        return part_ctx(setup, label, "kill", "lightning")
    folder = setup.folder(label)
    argv, work = setup.command(side, folder, _fault_args(setup, "kill"), script=LIGHTNING_SCRIPT)
    command = setup.start(side, argv, folder)
    got: dict = {}
    try:
        got = _failed(command, command.wait(setup.args.timeout), "plain torchrun, Lightning script, a SIGKILLed rank")
        got = _merge(got, _restart(_events(work), _marker(work, "kill"), "attempt", 1, command))
    finally:
        got.update(setup.finish(command))
    return got


def part_ctx(setup: Setup, label: str, fault: str = "kill", runtime: str = "torch") -> dict:
    """The fault on the ctx path (runtime torch) or the Lightning path, through `orchestrator run`."""
    folder = setup.folder(label)
    work = os.path.join(folder, "work")
    w = FAULT_WORKLOAD
    faults = {"fault": fault, "fault_rank": setup.nproc - 1, "fault_epoch": FAULT_AT["epoch"],
              "fault_step": FAULT_AT["step"]}
    if runtime == "torch":
        section = {"torch": {"train_loop": "bench.torchrun_ctx_job:train_loop", "max_epochs": w["epochs"],
                             "config": {"work_dir": work, "width": w["width"], "samples": w["samples"],
                                        "batch_size": w["batch_size"], "step_sleep": w["step_sleep"], **faults}}}
    else:
        section = {"lightning": {
            "model": {"class_path": "bench.torchrun_lightning_job.FaultyMLP",
                      "init_args": {"work_dir": work, "width": w["width"], "step_sleep": w["step_sleep"], **faults}},
            "data": {"class_path": "bench.torchrun_lightning_job.MLPData",
                     "init_args": {"samples": w["samples"], "batch_size": w["batch_size"]}},
            "trainer": {"max_epochs": w["epochs"]}}}
    spec = {"name": "ctx", "storage": folder, "resume_from": "none", **section,
            "scaling": {"num_workers": setup.nproc},
            "checkpoint": {"every_n_steps": CTX_CHECKPOINT_EVERY},
            "failure": {"max_failures": 1}}
    spec_path = os.path.join(folder, "spec.yaml")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)  # JSON is YAML
    command = setup.start("orchestrator", [sys.executable, "-m", "orchestrator", "run", spec_path], folder)
    got: dict = {}
    try:
        got = _failed(command, command.wait(setup.args.timeout), f"{runtime} path, fault {fault}")
        events = _events(work)
        first_attempt = min((e["attempt"] for e in events), default=0)
        got = _merge(got, _restart(events, _marker(work, "kill"), "attempt", first_attempt))
    finally:
        got.update(setup.finish(command))
    return got


def part_stop(setup: Setup, side: str, label: str) -> dict:
    folder = setup.folder(label)
    sets = (f"failure.hang_timeout_s={HANG_TIMEOUT_S}",) if side == "orchestrator" else ()
    argv, work = setup.command(side, folder, _fault_args(setup, "stop"), sets)
    command = setup.start(side, argv, folder)
    got: dict = {}
    try:
        if side == "orchestrator":
            got = _failed(command, command.wait(setup.args.timeout), "orchestrator with a SIGSTOPped rank")
            got = _merge(got, _restart(_events(work), _marker(work, "stop"), "restart", 0, command))
        else:
            got = _torchrun_after_stop(setup, command, work)
    finally:
        got.update(setup.finish(command))
    return got


def _torchrun_after_stop(setup: Setup, command: Command, work: str) -> dict:
    """Plain torchrun: wait for the stop, then up to --stop-wait seconds for a step after it."""
    outcome = command.wait(setup.args.timeout, until=lambda: _marker(work, "stop") is not None)
    stopped_at = _marker(work, "stop")
    if stopped_at is None:
        return _failed(command, outcome, "torchrun before the stop") or {"error": "torchrun ended before the stop"}

    def step_after_stop() -> dict | None:
        # Rank 0's next event could only be the epoch's end (it needs rank 1's gradients) or the
        # first step of restarted ranks.
        return next((e for e in _events(work) if e["time"] > stopped_at and (
            e["kind"] == "epoch_end" or (e["kind"] == "first_step" and e["restart"] > 0))), None)

    outcome = command.wait(max(0.0, stopped_at + setup.args.stop_wait - time.time()), until=step_after_stop)
    stepped = step_after_stop()
    got = {"recovered": stepped is not None, "waited_s": time.time() - stopped_at, "outcome": outcome}
    if stepped is not None:
        got["restart_s"] = stepped["time"] - stopped_at
    return got


# --- the report -------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _breakdown(got: dict) -> str:
    parts = []
    if "to_spawn_s" in got:
        parts.append(f"new rank-0 process at {got['to_spawn_s']:.2f} s")
    if "to_start_s" in got:
        parts.append(f"its 'start' event (imports, init_process_group) at {got['to_start_s']:.2f} s")
    return f" ({', '.join(parts)})" if parts else ""


def _line(part: str, side: str, got: dict) -> str:
    if "error" in got:
        tail = ("\n    " + got["tail"].strip().replace("\n", "\n    ")) if got.get("tail") else ""
        return f"{part} {side}: FAILED: {got['error']} (log: {got.get('log', '-')}){tail}"
    extra = f"; it left {got['left_behind']} process(es) behind (killed)" if got.get("left_behind") else ""
    if part == "a":
        cpu = f", rank 0 {got['cpu_ms_per_step']:.0f} ms CPU a step" if "cpu_ms_per_step" in got else ""
        if "launcher_cores" in got:
            cpu += f", the launcher's processes {100 * got['launcher_cores']:.1f}% of a core meanwhile"
        return (f"a {side}: {got['steps_per_s']:.2f} steps/s over {got['steps']} steps{cpu} "
                f"(run wall {got['wall_s']:.1f} s){extra}")
    if part == "d" and side == "torchrun" and not got.get("recovered"):
        how = " (torchrun exited)" if got.get("outcome") == "exited" else ""
        return f"d torchrun: no step within {got['waited_s']:.0f} s of the SIGSTOP: did not recover{how}{extra}"
    return (f"{part} {side}: {got['restart_s']:.2f} s from the fault to the first step after the restart"
            f"{_breakdown(got)}{extra}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated letters: " + ",".join(PARTS))
    parser.add_argument("--keep", metavar="DIR", help="keep every measurement's folder (logs, events) under DIR")
    parser.add_argument("--stop-wait", type=float, default=90.0,
                        help="seconds plain torchrun is given after the SIGSTOP to take a step (part d)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--nproc", type=int, default=2,
                        help="ranks (--nproc_per_node) on both sides; 1 with --omp-threads 1 leaves a core of "
                             "a 2-core machine to each launcher's own processes")
    parser.add_argument("--omp-threads", type=int, default=0,
                        help="OMP_NUM_THREADS exported to both commands (default: unset, torchrun's rule)")
    parser.add_argument("--gpu", action="store_true",
                        help="one GPU a rank, NCCL (min(--nproc, GPUs) ranks); parts a and b only")
    args = parser.parse_args()
    skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    if skip - set(PARTS):
        parser.error(f"--skip takes letters of {', '.join(PARTS)}, got {args.skip!r}")
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("--gpu: torch sees no CUDA device; nothing measured")
            return 1
        skip |= {"c", "d", "e", "l", "m"}
    parts = [p for p in PARTS if p not in skip]

    root = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="torchrun-bench-")
    os.makedirs(root, exist_ok=True)
    setup = Setup(args, root)
    results: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    failed = False
    try:
        for index in range(args.rounds):
            order = SIDES if index % 2 == 0 else SIDES[::-1]
            for part in parts:
                if part in RUN_PARTS:
                    runtime, fault, what = RUN_PARTS[part]
                    _say(f"round {index + 1}, part {part}: {what}, orchestrator run")
                    got = part_ctx(setup, f"r{index + 1}-{part}-{runtime}", fault, runtime)
                    results[(part, "orchestrator")].append(got)
                    failed |= "error" in got
                    print(f"round {index + 1}: " + _line(part, what, got), flush=True)
                    continue
                got_round = {}
                for side in order:
                    _say(f"round {index + 1}, part {part}: {side}")
                    measure = {"a": part_rate, "b": part_kill, "d": part_stop, "l": part_lightning}[part]
                    got = measure(setup, side, f"r{index + 1}-{part}-{side}")
                    got_round[side] = got
                    results[(part, side)].append(got)
                    failed |= "error" in got
                    print(f"round {index + 1}: " + _line(part, side, got), flush=True)
                ours, theirs = got_round["orchestrator"], got_round["torchrun"]
                if part == "a" and "steps_per_s" in ours and "steps_per_s" in theirs:
                    ratios["a"].append(ours["steps_per_s"] / theirs["steps_per_s"])
                if part in ("b", "l") and "restart_s" in ours and "restart_s" in theirs:
                    ratios[part].append(ours["restart_s"] / theirs["restart_s"])
                if part in ratios and len(ratios[part]) == index + 1:
                    print(f"round {index + 1}: part {part} ratio orchestrator / torchrun {ratios[part][-1]:.3f}",
                          flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    def med(part: str, side: str, key: str) -> float | None:
        return _median([r.get(key) for r in results.get((part, side), [])])

    rows = []
    if "a" in parts:
        rows.append(("a", f"steps/s, clean run, {setup.nproc} ranks", _fmt(med("a", "orchestrator", "steps_per_s"),
                     digits=2), _fmt(med("a", "torchrun", "steps_per_s"), digits=2),
                     _fmt(_median(ratios["a"]), digits=3), ">= 0.99"))
    if "b" in parts:
        rows.append(("b", "SIGKILLed rank -> first step after the in-place restart",
                     _fmt(med("b", "orchestrator", "restart_s"), " s", 2), _fmt(med("b", "torchrun", "restart_s"),
                     " s", 2), _fmt(_median(ratios["b"]), digits=3), "<= 1.5"))
    if "c" in parts:
        ctx, plain = med("c", "orchestrator", "restart_s"), med("b", "torchrun", "restart_s")
        ratio = _fmt(ctx / plain if plain and ctx is not None else None, digits=3)
        rows.append(("c", "the same fault on the ctx path, in place (`orchestrator run`)", _fmt(ctx, " s", 2),
                     _fmt(plain, " s", 2), f"ctx ÷ plain torchrun (b): {ratio}", "<= 1.5"))
    if "e" in parts:
        group, ctx = med("e", "orchestrator", "restart_s"), med("c", "orchestrator", "restart_s")
        ratio = _fmt(ctx / group if group and ctx is not None else None, digits=3)
        rows.append(("e", "ctx path, the agent SIGKILLed: Ray Train's group restart", _fmt(group, " s", 2), "-",
                     f"in place (c) ÷ group restart: {ratio}", "<= 0.35"))
    if "l" in parts:
        rows.append(("l", "Lightning job, SIGKILLed rank -> first step after the restart (`orchestrator run` "
                     "against plain torchrun of the same Lightning script)", _fmt(med("l", "orchestrator", "restart_s"),
                     " s", 2), _fmt(med("l", "torchrun", "restart_s"), " s", 2), _fmt(_median(ratios["l"]), digits=3),
                     "<= 1.5"))
    if "m" in parts:
        group, lit = med("m", "orchestrator", "restart_s"), med("l", "orchestrator", "restart_s")
        ratio = _fmt(lit / group if group and lit is not None else None, digits=3)
        rows.append(("m", "Lightning path, the agent SIGKILLed: Ray Train's group restart", _fmt(group, " s", 2), "-",
                     f"in place (l) ÷ group restart: {ratio}", "<= 0.35"))
    if "d" in parts:
        stops = results.get(("d", "torchrun"), [])
        if stops and not any(r.get("recovered") for r in stops):
            theirs = f"did not recover within {args.stop_wait:.0f} s"
        else:
            theirs = _fmt(med("d", "torchrun", "restart_s"), " s", 2)
        rows.append(("d", f"SIGSTOPped rank -> first step after the restart (hang_timeout_s {HANG_TIMEOUT_S})",
                     _fmt(med("d", "orchestrator", "restart_s"), " s", 2), theirs, "-", "detected and restarted"))
    rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}, medians"
    print(f"\n| part | figure ({rounds}) | orchestrator torchrun | plain torchrun | ratio | goal |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.keep:
        print(f"\nkept: {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
