"""Recovery from a failure: seconds from the failure to the first optimizer step of the
restarted worker group, through the orchestrator ÷ through raw Ray Train V2 with its defaults.

Each measurement gets a fresh loopback cluster (`ray.cluster_utils.Cluster`: a head without CPUs
and three 1-CPU nodes) and a 2-worker DDP run (CPU, gloo) of the same small MLP (bench/recovery_job.py,
~0.15 s a step, a checkpoint every 10 steps). Once the run is past step `--kill-after` and its side
has a checkpoint it can resume from, the failure comes (`--fault`):

  node     (default) the node of the rank-0 worker dies (its raylet and its training workers
           SIGKILLed, as when a machine goes away) and a replacement 1-CPU node joins at once.
  elastic  both sides run elastic, workers (1, 3) on the three nodes; the node of the rank-0
           worker dies and no replacement comes: recovery is the first step at 2 workers. Then a
           node is added, and growth = add_node -> the first step at 3 workers.
  sigstop  the rank-1 training worker process is SIGSTOPped (a frozen process: it neither dies
           nor answers, the way a hung machine or a stuck driver call looks). No node is lost;
           the third node is free. The stopped process is SIGKILLed by its pid at the end of
           the measurement, whatever happened.

Recovery = time of the first step line written by the restarted group (a new rank-0 pid)
- time of the failure. The resumed step is printed too: it must be a checkpoint's step, not 0.

Sides, alternating (and taking turns at going first) for `--rounds` rounds:
  orchestrator  orchestrator.run(spec, address=cluster.address): a torch-path spec, checkpoint.every_n_steps 10,
                failure.hang_timeout_s = --hang-timeout (default 60, the product's default)
  raw           ray.train.torch.TorchTrainer with ScalingConfig(num_workers=2) (elastic: (1, 3)) and
                RunConfig(storage_path, FailureConfig(max_failures=3)): no RAY_TRAIN_* variables
                (any in this shell are removed for both sides), Ray's own timeouts
The summary is the median recovery of each side and their ratio orchestrator ÷ raw (goal <= 0.2).

With --fault sigstop the raw side is skipped unless --side raw or --side both is given: with
Ray's defaults nothing notices a frozen worker for 600 s (RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S)
and gloo's process-group timeout is 1800 s (TorchConfig.timeout_s). When it is measured, it is
waited for at most --timeout seconds and reported as "> TIMEOUT s (did not recover)".

    python bench/recovery.py [--fault node|sigstop] [--rounds 1] [--steps 60] [--kill-after 25]
                             [--side both|orchestrator|raw] [--hang-timeout 60]
                             [--fast-health-checks] [--timeout 300] [--keep DIR]

--fast-health-checks gives the head Ray's `_system_config` health checks of tests/e2e/test_node_loss.py
(period 1 s, timeout 1 s, 3 misses: a dead node is declared dead in ~3 s; with Ray's defaults,
3 s, 10 s and 5 misses, the other raylets heard of the death ~13 s after the kill here).
Off by default: the fair comparison is what each user gets from a cluster started with Ray's
defaults. --keep DIR keeps each measurement's output, step log and a copy of Ray's logs there.

Each measurement runs in a child process of its own (this file with --measure): Ray Train V2's
driver forwards every RAY_TRAIN_* variable of its environment to the controller, and the
orchestrator sets some in its own process, so running both sides in one process would leak the
orchestrator's settings into the raw side. Every wait has a time limit (--timeout), and every
process of a measurement's cluster is found by the measurement's own Ray temp folder in its
command line and killed by its pid if the cluster's shutdown left it behind.

bench/chaos.py reuses the helpers here (cluster start and teardown, child processes, node kills).
"""

from __future__ import annotations

import os

# Every node of the benchmark's clusters binds to loopback (must be set before Ray is imported).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The node-killing helpers are the node-loss tests' own.
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)

from node_faults import kill_node as _kill_node  # noqa: E402
from node_faults import training_worker_pids as _training_worker_pids  # noqa: E402

from bench.jsonl import read_jsonl  # noqa: E402

SIDES = ("orchestrator", "raw")
FAULTS = ("node", "sigstop", "elastic")
# tests/e2e/test_node_loss.py's settings; Ray's defaults are a 3 s period, 10 s timeout, 5 misses.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                      "health_check_timeout_ms": 1000}
CHECKPOINT_EVERY = 10
RESULT_PREFIX = "RECOVERY-RESULT "


# --- the measurement (child process) -----------------------------------------------------------

def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _wait_for(what: str, predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def _read_log(path: str) -> list[dict]:
    return read_jsonl(path)


def _processes_of(temp_dir: str) -> list[int]:
    """Processes whose command line names this measurement's Ray temp folder: its cluster's own."""
    needle = temp_dir.encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _reap(temp_dir: str) -> list[int]:
    """SIGKILL, by pid, whatever of this measurement's cluster outlived its shutdown."""
    left = _processes_of(temp_dir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _process_state(pid: int) -> str | None:
    """The process's state letter from /proc (T: stopped, Z: zombie, ...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _rank1_pid(cluster, rank0_pid: int) -> int:
    """The training worker that is not rank 0 (2 workers: rank 1), found as _kill_node finds
    training workers: the RayTrainWorker children of the worker nodes' raylets."""
    others = sorted({pid for node in cluster.worker_nodes for pid in _training_worker_pids(node)} - {rank0_pid})
    if len(others) != 1:
        raise RuntimeError(f"expected one training worker besides rank 0 (pid {rank0_pid}), found {others}")
    return others[0]


def start_cluster(fast_health_checks: bool, nodes: int = 3):
    """A loopback cluster: a head without CPUs and `nodes` 1-CPU nodes."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0}
    if fast_health_checks:
        head["_system_config"] = FAST_HEALTH_CHECKS
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster


def teardown(cluster, temp_dir: str, out: dict, keep_dir: str | None = None) -> str | None:
    """Shut the cluster down, copy its logs to keep_dir/ray-logs if asked, and SIGKILL by pid
    whatever of it is left. Returns the cluster's session folder (its logs stay readable)."""
    session = None
    if cluster is not None:
        session = cluster.head_node.get_session_dir_path()
        try:
            import ray

            # Normally the driver has disconnected already. If a wait timed out it is still
            # connected, and Cluster.shutdown refuses to remove the node a driver is on.
            if ray.is_initialized():
                ray.shutdown()
            cluster.shutdown()
        except Exception as exc:  # noqa: BLE001 - _reap below kills what is left
            out.setdefault("error", f"cluster shutdown: {type(exc).__name__}: {exc}")
        if keep_dir:
            shutil.copytree(os.path.join(session, "logs"), os.path.join(keep_dir, "ray-logs"),
                            ignore_dangling_symlinks=True, dirs_exist_ok=True)
    left = _reap(temp_dir)
    if left:
        out["reaped_pids"] = left
    return session


class Driver:
    """A training driver on a background thread: Cluster.add_node/remove_node must be called
    from the main thread, which therefore plays the failing world."""

    def __init__(self, target, *args, name: str = "driver", **kwargs):
        self.outcome: dict = {}
        self._thread = threading.Thread(target=self._guarded, args=(target, args, kwargs), name=name, daemon=True)
        self._thread.start()

    def _guarded(self, target, args, kwargs) -> None:
        try:
            self.outcome.update(target(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - reported in the measurement's result
            lines = str(exc).strip().splitlines()
            self.outcome["error"] = f"{type(exc).__name__}: {lines[-1] if lines else ''}"

    def ended(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()


def run_orchestrator(address: str, storage: str, name: str, cfg: dict, steps: int, *, every: int = CHECKPOINT_EVERY,
                     hang_timeout_s: float = 60.0, max_failures: int = 3, workers=2) -> dict:
    """The orchestrator side: a torch-path spec running bench.recovery_job:orchestrator_loop."""
    import orchestrator

    spec = {
        "name": name, "storage": storage, "resume_from": "none",
        "torch": {"train_loop": "bench.recovery_job:orchestrator_loop", "max_steps": steps, "config": cfg},
        "scaling": {"num_workers": workers},
        "checkpoint": {"every_n_steps": every},
        "failure": {"max_failures": max_failures, "hang_timeout_s": hang_timeout_s},
    }
    result = orchestrator.run(spec, address=address, console=None)
    return {"status": result.status, "restarts": result.restarts, "final_step": result.global_step,
            "wall_s": result.wall_seconds, "weights_sha256": result.weights_sha256, "goodput": result.goodput,
            "checkpoints_committed": result.checkpoints_committed, "checkpoint_stall_s": result.checkpoint_stall_s,
            "failures": [{"classification": f.get("classification"),
                          "hang": (f.get("hang") or {}).get("message"),
                          "ranks": [f"rank {r.get('rank')}: {r.get('error')}" for r in f.get("ranks", [])]}
                         for f in result.failures]}


def run_raw(address: str, storage: str, name: str, cfg: dict, steps: int, workers=2) -> dict:
    """The raw Ray Train V2 side, with Ray's defaults."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from bench.recovery_job import raw_loop

    # log_to_driver=False as the orchestrator's driver does: worker output stays in Ray's
    # log files on both sides (it changes nothing about recovery, only this terminal's noise).
    ray.init(address=address, log_to_driver=False)
    try:
        trainer = TorchTrainer(
            raw_loop, train_loop_config={**cfg, "steps": steps, "every": CHECKPOINT_EVERY},
            scaling_config=ScalingConfig(num_workers=workers),
            run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=3)),
        )
        result = trainer.fit()
        return {"status": "finished" if result.error is None else f"error: {result.error}",
                "final_step": (result.metrics or {}).get("step")}
    finally:
        ray.shutdown()


def _checkpoint_step(side: str, storage: str, name: str) -> int | None:
    """The step of the newest checkpoint a restart of the side would resume from (not merely one
    being written), or None."""
    if side == "orchestrator":
        from orchestrator import storage as orch_storage
        from orchestrator.checkpoint import CheckpointStore

        committed = CheckpointStore(orch_storage.resolve(os.path.join(storage, name))).committed()
        return max((info.step for info in committed), default=None)
    # Ray Train's controller writes this snapshot when it registers a reported checkpoint, which
    # it learns of only when it next polls the workers (every 2 s): a checkpoint reported just
    # before the kill is lost, and get_checkpoint() in the restarted group returns the one before.
    try:
        with open(os.path.join(storage, name, "checkpoint_manager_snapshot.json")) as f:
            latest = json.load(f).get("latest_checkpoint_result")
    except (OSError, ValueError):
        return None
    return (latest or {}).get("metrics", {}).get("step")


# Ray Train's controller log lines that mark the phases of a restart (best effort: the wording
# is Ray 2.60's; a phase not found is left out of the breakdown).
CONTROLLER_MARKS = (("noticed", "[FailurePolicy]"), ("restart", "Attempting to start training worker group"),
                    ("actors", "worker actors created in"), ("context", "Train context initialized on workers"),
                    ("group_started", "Started training worker group"))


def _controller_timeline(session_dir: str, killed_at: float) -> dict:
    """Seconds from the kill to each phase of the restart, read from the Train controller's log."""
    found: dict = {}
    folder = os.path.join(session_dir, "logs", "train")
    try:
        files = [f for f in os.listdir(folder) if f.startswith("ray-train-sys-controller-")]
    except OSError:
        return found
    for fname in files:
        with open(os.path.join(folder, fname)) as f:
            for raw in f:
                try:
                    entry = json.loads(raw)
                    at = entry["timestamp_ns"] / 1e9
                except (ValueError, KeyError):
                    continue
                if at < killed_at:
                    continue
                for key, needle in CONTROLLER_MARKS:
                    if key not in found and needle in entry.get("message", ""):
                        found[key] = round(at - killed_at, 2)
    return found


def measure(args) -> dict:
    side, temp_dir, work = args.measure, args.ray_temp_dir, args.work_dir
    name = f"recovery-{side}"
    storage = os.path.join(work, "storage")
    log = os.path.join(work, "steps.jsonl")
    cfg = {"log": log, "steps": args.steps, "batch_size": 32, "sleep_s": args.sleep_s}
    elastic = args.fault == "elastic"
    if elastic:
        cfg["data_world_size"] = 3
    out: dict = {"side": side, "fault": args.fault}
    cluster = driver = None
    killed_at = stopped_pid = None
    try:
        started = time.monotonic()
        cluster = start_cluster(args.fast_health_checks)
        out["cluster_start_s"] = round(time.monotonic() - started, 1)
        _say(f"{side}: cluster up in {out['cluster_start_s']} s; starting the run")
        if side == "orchestrator":
            driver = Driver(run_orchestrator, cluster.address, storage, name, cfg, args.steps,
                            hang_timeout_s=args.hang_timeout, workers=[1, 3] if elastic else 2,
                            name="orchestrator-driver")
        else:
            driver = Driver(run_raw, cluster.address, storage, name, cfg, args.steps,
                            workers=(1, 3) if elastic else 2, name="raw-driver")

        def ready_to_kill():
            steps = [line for line in _read_log(log) if line["event"] == "step"]
            if driver.ended():
                raise RuntimeError(f"the run ended before the kill: {driver.outcome}")
            if not steps or steps[-1]["step"] < args.kill_after:
                return None
            # Both sides resume from the same step: the newest checkpoint before --kill-after.
            saved = _checkpoint_step(side, storage, name)
            wanted = args.kill_after // CHECKPOINT_EVERY * CHECKPOINT_EVERY
            return steps[-1] if saved is not None and saved >= wanted else None

        last = _wait_for("a checkpoint and step >= --kill-after", ready_to_kill, args.timeout)
        old_pid = last["pid"]
        if args.fault in ("node", "elastic"):
            doomed = next((n for n in cluster.worker_nodes if old_pid in _training_worker_pids(n)), None)
            if doomed is None:
                raise RuntimeError(f"no worker node hosts rank 0 (pid {old_pid})")
            killed_at = time.time()
            _kill_node(cluster, doomed)
            out["kill_took_s"] = round(time.time() - killed_at, 3)
            if not elastic:
                cluster.add_node(num_cpus=1)  # the replacement joins right away
                out["replacement_joined_s"] = round(time.time() - killed_at, 2)
            what = "killed rank 0's node"
        else:
            victim = _rank1_pid(cluster, old_pid)
            killed_at = time.time()
            os.kill(victim, signal.SIGSTOP)
            stopped_pid = out["stopped_pid"] = victim
            what = f"SIGSTOPped rank 1 (pid {victim})"
        out["killed_after_step"] = max(line["step"] for line in _read_log(log)
                                       if line["event"] == "step" and line["pid"] == old_pid)
        _say(f"{side}: {what} after step {out['killed_after_step']}" +
             ("; replacement joined" if args.fault == "node" else ""))

        def first_new_step():
            found = next((line for line in _read_log(log) if line["event"] == "step" and line["pid"] != old_pid),
                         None)
            if found is None and driver.ended():
                raise RuntimeError(f"the run ended without a step after the failure: {driver.outcome}")
            return found

        try:
            first = _wait_for("the restarted group's first step", first_new_step, args.timeout)
        except TimeoutError:
            if args.fault != "sigstop":
                raise
            # A frozen worker that nothing notices within the limit: a result, not an error.
            out["did_not_recover_s"] = args.timeout
            out["status"] = f"no step after the SIGSTOP within {args.timeout:.0f} s (run not waited for)"
            _say(f"{side}: no step of a restarted group within {args.timeout:.0f} s of the SIGSTOP")
            first = None
        if first is not None:
            # A step the old rank 0 finished after the failure (its peer had sent its part) still counts.
            out["killed_after_step"] = max(line["step"] for line in _read_log(log)
                                           if line["event"] == "step" and line["pid"] == old_pid)
            ready = next((line for line in _read_log(log) if line["event"] == "ready" and line["pid"] != old_pid),
                         first)
            out.update(recovery_s=round(first["time"] - killed_at, 2),
                       group_ready_s=round(ready["time"] - killed_at, 2),
                       resumed_from_step=first["step"] - 1, world_size=first["world_size"])
            if stopped_pid is not None:
                # Did the restart end the frozen process (Ray kills the old group's actors)?
                out["stopped_pid_state_at_recovery"] = _process_state(stopped_pid) or "gone"
            _say(f"{side}: first step after the failure {out['recovery_s']} s later (step {first['step']})")
            if elastic:
                _measure_growth(cluster, log, driver, out, args.timeout)
            elif driver.join(args.timeout):
                out.update(driver.outcome)
            else:
                out["status"] = f"still running after {args.timeout:.0f} s"
    except Exception as exc:  # noqa: BLE001 - the parent reports the measurement as failed
        record_error(out, exc, driver)
    finally:
        if stopped_pid is not None:
            # Never leave the frozen process behind: SIGKILL it by its pid (a stopped process dies of it).
            state = _process_state(stopped_pid)
            if state not in (None, "Z"):
                out["stopped_pid_killed_by_bench"] = state
                try:
                    os.kill(stopped_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        session = teardown(cluster, temp_dir, out, args.keep)
        if session is not None and killed_at is not None:
            out["ray_controller"] = _controller_timeline(session, killed_at)
    return out


def record_error(out: dict, exc: BaseException, driver) -> None:
    """A measurement that failed: its traceback on stderr, the error (and the driver's) in its result."""
    traceback.print_exc()
    out["error"] = f"{type(exc).__name__}: {exc}"
    if driver is not None and driver.outcome.get("error"):
        out["driver_error"] = driver.outcome["error"]


def _measure_growth(cluster, log: str, driver, out: dict, timeout: float) -> None:
    """Elastic: add a node back and time the first step at 3 workers. The run is not waited for."""
    added_at = time.time()
    cluster.add_node(num_cpus=1)

    def first_grown_step():
        found = next((line for line in _read_log(log) if line["event"] == "step" and line["world_size"] == 3
                      and line["time"] > added_at), None)
        if found is None and driver.ended():
            raise RuntimeError(f"the run ended before it grew: {driver.outcome}")
        return found

    grown = _wait_for("the first step at 3 workers after add_node", first_grown_step, timeout)
    out.update(growth_s=round(grown["time"] - added_at, 2), status="grew back to 3 (run not waited for)")
    _say(f"grew back: first step at 3 workers {out['growth_s']} s after add_node")


# --- the benchmark (parent process) -------------------------------------------------------------

def spawn_child(script: str, child_args: list[str], work: str, limit_s: float, label: str,
                prefix: str = "rayrec-") -> dict:
    """Run `script child_args --ray-temp-dir T --work-dir work` in a child process with its own
    Ray temp folder and no RAY_TRAIN_* variables; return the JSON it printed after RESULT_PREFIX."""
    os.makedirs(work, exist_ok=True)
    # The measurement's own Ray temp folder (RAY_TMPDIR: Ray's files, sockets, and the address
    # file Cluster writes, away from any other Ray on this machine): every process of its
    # cluster names it in its command line. Short: socket paths are limited to ~107 characters.
    temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_TRAIN_")}
    env["RAY_TMPDIR"] = temp_dir
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))  # workers import bench.*
    env["ORCHESTRATOR_STATE_DIR"] = os.path.join(work, "state")
    cmd = [sys.executable, script, *child_args, "--ray-temp-dir", temp_dir, "--work-dir", work]
    output = os.path.join(work, "output.log")
    try:
        with open(output, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env)
            try:
                proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except KeyboardInterrupt:  # the child got the Ctrl-C too: let it shut its cluster down
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
        with open(output) as f:
            text = f.read()
        results = [line[len(RESULT_PREFIX):] for line in text.splitlines() if line.startswith(RESULT_PREFIX)]
        got = json.loads(results[-1]) if results else {"error": f"no result (exit {proc.returncode})"}
        if "error" in got:
            got["output_tail"] = "\n".join(text.splitlines()[-25:])
        return got
    finally:
        left = _reap(temp_dir)
        if left:
            print(f"  warning: killed {len(left)} leftover process(es) of the {label} measurement's cluster: {left}")
        shutil.rmtree(temp_dir, ignore_errors=True)


def finish_child(result: dict) -> None:
    """The child's end: print its result for the parent, and skip interpreter teardown (a driver
    thread left running after a timeout could block it in Ray's atexit shutdown; the cluster is
    already gone)."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)


def run_measurement(side: str, args, work: str) -> dict:
    child_args = ["--measure", side, "--fault", args.fault, "--steps", str(args.steps),
                  "--kill-after", str(args.kill_after), "--sleep-s", str(args.sleep_s),
                  "--timeout", str(args.timeout), "--hang-timeout", str(args.hang_timeout)]
    if args.fast_health_checks:
        child_args.append("--fast-health-checks")
    if args.keep:
        child_args += ["--keep", work]
    # Three waits of --timeout each, plus cluster start-up and shutdown.
    got = spawn_child(os.path.abspath(__file__), child_args, work, 3 * args.timeout + 180, side)
    got.setdefault("side", side)
    return got


def _describe(r: dict) -> str:
    if "did_not_recover_s" in r:
        return (f"recovery > {r['did_not_recover_s']:.0f} s (did not recover: no step of a restarted group "
                f"within --timeout of the SIGSTOP after step {r.get('killed_after_step')})")
    if "recovery_s" not in r:
        return f"FAILED: {r.get('error')}" + (f" (driver: {r['driver_error']})" if r.get("driver_error") else "")
    extra = f", restarts {r['restarts']}" if "restarts" in r else ""
    if r.get("failures"):
        extra += "; failures: " + ", ".join(f["classification"] or "?" for f in r["failures"])
    if "stopped_pid_state_at_recovery" in r:
        extra += f"; the stopped pid at recovery: {r['stopped_pid_state_at_recovery']}"
    phases = ", ".join(f"{k} {v:.1f}" for k, v in r.get("ray_controller", {}).items())
    phases = f"Ray Train controller: {phases} s; " if phases else ""
    return (f"recovery {r['recovery_s']:.2f} s ({phases}loop ready {r['group_ready_s']:.2f} s), failed after step "
            f"{r['killed_after_step']}, resumed from step {r['resumed_from_step']} with {r['world_size']} workers; "
            + (f"growth {r['growth_s']:.2f} s (add_node -> first step at 3 workers); " if "growth_s" in r else "")
            + f"run {r.get('status', '?')}{extra}" + (f"; driver: {r['error']}" if r.get("error") else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", choices=FAULTS, default="node",
                        help="node: kill rank 0's node (default); sigstop: SIGSTOP the rank-1 worker process")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60, help="steps of each run (the kill comes at --kill-after)")
    parser.add_argument("--kill-after", type=int, default=25,
                        help="kill once the run is past this step and has a checkpoint to resume from")
    parser.add_argument("--sleep-s", type=float, default=0.15, help="seconds a step is slowed by")
    parser.add_argument("--side", choices=("both", *SIDES), default=None,
                        help="default: both for --fault node; orchestrator for --fault sigstop")
    parser.add_argument("--hang-timeout", type=float, default=60.0,
                        help="the orchestrator side's failure.hang_timeout_s (default 60, the product default)")
    parser.add_argument("--fast-health-checks", action="store_true",
                        help="head _system_config: node health checks every 1 s, 3 misses (default: Ray's)")
    parser.add_argument("--timeout", type=float, default=300, help="limit on each wait, seconds")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="keep each measurement's output, step log and Ray logs in DIR")
    # Internal: one measurement, in a child process.
    parser.add_argument("--measure", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--ray-temp-dir", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= args.kill_after + 5:
        parser.error("--steps must leave some steps after --kill-after")
    if args.hang_timeout < 5:
        parser.error("--hang-timeout must be >= 5 (the spec's minimum)")

    if args.measure:
        sys.path.insert(0, REPO)
        finish_child(measure(args))

    side = args.side or ("orchestrator" if args.fault == "sigstop" else "both")
    sides = SIDES if side == "both" else (side,)
    dropped = sorted(k for k in os.environ if k.startswith("RAY_TRAIN_"))
    fault = {"node": "kill rank 0's node (raylet + its workers SIGKILLed), a replacement node joins at once",
             "elastic": "workers (1, 3): kill rank 0's node, no replacement; then add a node back",
             "sigstop": "SIGSTOP the rank-1 worker process (SIGKILLed by pid after the measurement)"}[args.fault]
    print(f"cluster: head num_cpus=0 + 3 x 1-CPU nodes on 127.0.0.1; health checks: "
          f"{'fast ' + json.dumps(FAST_HEALTH_CHECKS) if args.fast_health_checks else 'Ray defaults'}; "
          f"2 workers, {args.steps} steps of ~{args.sleep_s} s, checkpoint every {CHECKPOINT_EVERY}; "
          f"fault: {fault}, after step >= {args.kill_after}; orchestrator failure.hang_timeout_s = "
          f"{args.hang_timeout:g}" + (f"; not passed on: {', '.join(dropped)}" if dropped else ""), flush=True)
    if args.fault == "sigstop" and "raw" not in sides:
        print("raw side: not measured for --fault sigstop (pass --side raw or --side both to measure it up to "
              "--timeout): with Ray's defaults a frozen worker goes unnoticed for 600 s "
              "(RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S) and gloo waits 1800 s (TorchConfig.timeout_s)", flush=True)
    keep = os.path.abspath(args.keep) if args.keep else None
    results: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="recovery-") as scratch:
        for i in range(args.rounds):
            # Take turns at going first, so a machine that drifts faster or slower does not favour one side.
            order = sides if i % 2 == 0 else tuple(reversed(sides))
            for s in order:
                work = os.path.join(keep or scratch, f"round{i + 1}-{s}")
                got = run_measurement(s, args, work)
                results[s].append(got)
                print(f"round {i + 1} {s:<12} {_describe(got)}", flush=True)
                if "output_tail" in got:
                    print("  " + got["output_tail"].replace("\n", "\n  "), flush=True)
    if keep:
        print(f"kept in {keep}")

    what = "SIGSTOP" if args.fault == "sigstop" else "kill"
    medians, lower_bounds = {}, {}
    for s in sides:
        ok = [r["recovery_s"] for r in results[s] if "recovery_s" in r]
        stuck = [r["did_not_recover_s"] for r in results[s] if "did_not_recover_s" in r]
        if ok and not stuck:
            medians[s] = statistics.median(ok)
            resumed = sorted({r["resumed_from_step"] for r in results[s] if "recovery_s" in r})
            print(f"{s:<12} median recovery {medians[s]:.2f} s over {len(ok)} of {args.rounds} round(s) "
                  f"({what} -> first optimizer step of the restarted group; resumed from step(s) {resumed})")
        elif stuck:
            lower_bounds[s] = min(stuck)
            print(f"{s:<12} > {min(stuck):.0f} s (did not recover) in {len(stuck)} of {args.rounds} round(s)"
                  + (f"; recovered in {ok} s in the others" if ok else ""))
        else:
            print(f"{s:<12} no successful measurement")
    growth = {s: statistics.median(g) for s in sides if (g := [r["growth_s"] for r in results[s] if "growth_s" in r])}
    for s, seconds in growth.items():
        print(f"{s:<12} median growth {seconds:.2f} s (add_node -> first optimizer step at 3 workers)")
    if len(growth) == 2:
        print(f"growth ratio orchestrator / raw: {growth['orchestrator'] / growth['raw']:.3f}")
    if len(medians) == 2:
        print(f"ratio orchestrator / raw: {medians['orchestrator'] / medians['raw']:.3f} (goal <= 0.2)")
    elif "orchestrator" in medians and "raw" in lower_bounds:
        print(f"ratio orchestrator / raw: < {medians['orchestrator'] / lower_bounds['raw']:.3f} "
              f"(raw did not recover within {lower_bounds['raw']:.0f} s; goal <= 0.2)")


if __name__ == "__main__":
    main()
