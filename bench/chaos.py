"""Goodput under repeated node failures, in compressed time, and what it means at one kill per
10 minutes.

Each scenario gets a fresh loopback cluster (`ray.cluster_utils.Cluster`: a head without CPUs
and three 1-CPU nodes, as bench/recovery.py) and one orchestrator torch job: 2 DDP workers (CPU,
gloo) training the small MLP of bench/recovery_job.py for `--steps` steps, each slowed to about
`--step-s` seconds with a sleep (a known amount of work), a checkpoint every `--every` steps.

  clean      no failures: the reference wall time, step time, checkpoint stall and weights.
  every T s  a random node that hosts a training worker is killed (its raylet and its training
             workers SIGKILLed, as when a machine goes away) T seconds of training after the
             first step of the current worker group (so the time a restart takes is not counted
             in T), with a seeded jitter of +-half a checkpoint interval so that the kills fall
             at random points between checkpoints; a replacement 1-CPU node joins right after
             each kill, so capacity comes back. No kill once the run is within 5 steps of its end.

For each: wall time, goodput from the run's summary (productive ÷ wall; lost seconds by cause;
recomputed steps), restarts, each kill's recovery (kill -> first step of the restarted group),
and whether the final weights_sha256 equals the clean run's (it must: the resume is exact).

Then a model, fitted on these runs, extrapolated to one kill per `--target-interval` seconds
(600: the issue's target) for a long run, startup left out (a fixed cost, paid once per run):

    goodput ~ 1 - (R + C/2 * s) / T_kill - sigma / (C * s)

R: mean lost seconds per restart (lost_s.restarts + lost_s.capacity_wait per restart, over the
runs with kills); C/2 * s: the work recomputed per failure, on average half a checkpoint
interval of C steps of s seconds (s: the clean run's productive seconds per step); sigma / (C * s):
the checkpoint stall, sigma seconds per checkpoint (the clean run's). It prints the goodput at the
measured C and the range of checkpoint intervals that gives >= 97 %.

    python bench/chaos.py [--intervals 30,60,120] [--steps 400] [--step-s 0.1] [--every 20]
                          [--timeout 300] [--seed 0] [--fast-health-checks] [--keep DIR]

Every scenario runs in a child process of its own with its own Ray temp folder (bench/recovery.py's
spawn_child): every wait has a time limit (--timeout), the cluster is always shut down, and any of
its processes left behind are killed by their pids.
"""

from __future__ import annotations

import os

# Every node binds to loopback (must be set before Ray is imported).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import argparse
import json
import math
import random
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.recovery import (  # noqa: E402 - after the environment and the path are set
    FAST_HEALTH_CHECKS,
    Driver,
    _kill_node,
    _read_log,
    _say,
    _training_worker_pids,
    _wait_for,
    finish_child,
    record_error,
    run_orchestrator,
    spawn_child,
    start_cluster,
    teardown,
)

CLEAN = "clean"
# No kill this close to the run's end: a kill during the final save would leave no step to wait for.
END_MARGIN_STEPS = 5
GOAL = 0.97


# --- one scenario (child process) ---------------------------------------------------------------

def measure(args) -> dict:
    interval = None if args.measure == CLEAN else float(args.measure)
    temp_dir, work = args.ray_temp_dir, args.work_dir
    label = CLEAN if interval is None else f"every {interval:g} s"
    log = os.path.join(work, "steps.jsonl")
    cfg = {"log": log, "steps": args.steps, "batch_size": 32, "sleep_s": args.step_s}
    # Seeded per scenario: the same --seed gives the same kill jitters and node choices.
    rng = random.Random(f"{args.seed}-{args.measure}")
    out: dict = {"scenario": args.measure, "kills": []}
    cluster = driver = None
    try:
        cluster = start_cluster(args.fast_health_checks)
        _say(f"{label}: cluster up; starting the run")
        driver = Driver(run_orchestrator, cluster.address, os.path.join(work, "storage"), f"chaos-{args.measure}",
                        cfg, args.steps, every=args.every, max_failures=-1, name="chaos-driver")

        def steps() -> list[dict]:
            return [line for line in _read_log(log) if line["event"] == "step"]

        def first_step_of_new_group(old_pids: set):
            found = next((line for line in steps() if line["pid"] not in old_pids), None)
            if found is None and driver.ended():
                raise RuntimeError(f"the run ended without a step of a new worker group: {driver.outcome}")
            return found

        group = _wait_for("the first optimizer step", lambda: first_step_of_new_group(set()), args.timeout)
        seen_pids = {group["pid"]}
        while interval is not None and not driver.ended():
            jitter = rng.uniform(-0.5, 0.5) * args.every * args.step_s
            due = group["time"] + interval + jitter
            while time.time() < due and not driver.ended():
                time.sleep(0.05)
            done = steps()
            if driver.ended() or not done or done[-1]["step"] >= args.steps - END_MARGIN_STEPS:
                break
            hosts = [n for n in cluster.worker_nodes if _training_worker_pids(n)]
            if not hosts:
                raise RuntimeError("no node hosts a training worker")
            doomed = rng.choice(hosts)
            rank0 = group["pid"] in _training_worker_pids(doomed)
            killed_at = time.time()
            _kill_node(cluster, doomed)
            cluster.add_node(num_cpus=1)  # the replacement joins right away
            kill = {"at_s": round(killed_at - group["time"], 2), "after_step": done[-1]["step"],
                    "rank0_node": rank0}
            out["kills"].append(kill)
            _say(f"{label}: kill {len(out['kills'])}: the node of rank {0 if rank0 else 1} after step "
                 f"{kill['after_step']}; replacement joined")
            seen_pids |= {line["pid"] for line in steps()}
            group = _wait_for("the restarted group's first step",
                              lambda old=frozenset(seen_pids): first_step_of_new_group(old), args.timeout)
            seen_pids.add(group["pid"])
            kill.update(recovery_s=round(group["time"] - killed_at, 2), resumed_from_step=group["step"] - 1)
            _say(f"{label}: first step of the restarted group {kill['recovery_s']} s after the kill "
                 f"(resumed from step {kill['resumed_from_step']})")
        if driver.join(args.timeout):
            out.update(driver.outcome)
        else:
            out["error"] = f"the run was still going {args.timeout:.0f} s after the last kill"
    except Exception as exc:  # noqa: BLE001 - the parent reports the scenario as failed
        record_error(out, exc, driver)
    finally:
        teardown(cluster, temp_dir, out, args.keep)
    return out


# --- the benchmark (parent process) -------------------------------------------------------------

def run_scenario(scenario: str, args, work: str) -> dict:
    child_args = ["--measure", scenario, "--steps", str(args.steps), "--step-s", str(args.step_s),
                  "--every", str(args.every), "--timeout", str(args.timeout), "--seed", str(args.seed)]
    if args.fast_health_checks:
        child_args.append("--fast-health-checks")
    if args.keep:
        child_args += ["--keep", work]
    # Waits: the first step, one per kill (each at most T + jitter + --timeout), and the end; plus
    # cluster start-up and shutdown. Kills come T s of training apart, so there are at most
    # (the clean run's training time, padded 3x) / T of them.
    work_s = args.steps * args.step_s * 3 + 60
    kills = 0 if scenario == CLEAN else math.ceil(work_s / float(scenario)) + 1
    limit = 2 * args.timeout + kills * (float(scenario if kills else 0) + args.timeout) + 240
    got = spawn_child(os.path.abspath(__file__), child_args, work, limit, scenario, prefix="raychaos-")
    got.setdefault("scenario", scenario)
    return got


def _lost(r: dict, cause: str) -> float:
    return float(r.get("goodput", {}).get("lost_s", {}).get(cause, 0.0))


def _row(label: str, r: dict, reference: str | None) -> str:
    if "goodput" not in r or not r["goodput"]:
        return f"{label:<12} FAILED: {r.get('error')}" + (f" (driver: {r['driver_error']})"
                                                         if r.get("driver_error") else "")
    g = r["goodput"]
    startup = _lost(r, "startup")
    without = g["productive_s"] / max(g["wall_s"] - startup, 1e-9)
    lost = ", ".join(f"{k} {v:.1f}" for k, v in g["lost_s"].items() if v >= 0.05)
    if reference is None:
        same = "-"
    else:
        same = "yes" if r.get("weights_sha256") == reference else f"NO ({(r.get('weights_sha256') or '?')[:12]})"
    recoveries = [k["recovery_s"] for k in r.get("kills", []) if "recovery_s" in k]
    rec = ", ".join(f"{x:.1f}" for x in recoveries) or "-"
    classes = [f.get("classification") for f in r.get("failures", [])]
    return (f"{label:<12} {g['wall_s']:7.1f} {g['goodput']:8.1%} {without:13.1%} {len(r.get('kills', [])):5d} "
            f"{r.get('restarts', 0):8d} {g['recomputed_steps']:10d}  {same:<8} {r.get('status', '?'):<9} "
            f"lost (s): {lost}; kill->first step (s): {rec}"
            + (f"; failures: {', '.join(map(str, classes))}" if classes else "")
            + (f"; error: {r['error']}" if r.get("error") else ""))


def model_goodput(r_s: float, c: float, s: float, sigma: float, t_kill: float) -> float:
    return 1 - (r_s + c / 2 * s) / t_kill - sigma / (c * s)


def extrapolate(clean: dict, chaos: list[dict], args) -> None:
    print()
    if not clean.get("goodput") or not clean.get("final_step"):
        print("extrapolation: needs a finished clean run")
        return
    with_kills = [r for r in chaos if r.get("goodput") and r.get("restarts")]
    if not with_kills:
        print("extrapolation: needs a finished run with at least one restart")
        return
    restarts = sum(r["restarts"] for r in with_kills)
    restart_s = sum(_lost(r, "restarts") for r in with_kills)
    capacity_s = sum(_lost(r, "capacity_wait") for r in with_kills)
    r_s = (restart_s + capacity_s) / restarts
    steps = clean["final_step"]
    s = clean["goodput"]["productive_s"] / steps  # productive seconds per step, stalls excluded
    checkpoints = max(clean.get("checkpoints_committed") or 1, 1)
    sigma = _lost(clean, "checkpoint_stall") / checkpoints
    recomputed = sum(r["goodput"]["recomputed_steps"] for r in with_kills) / restarts
    c, t = args.every, args.target_interval
    print("model: goodput ~ 1 - (R + C/2 * s) / T_kill - sigma / (C * s)   (startup left out: a fixed cost, "
          "paid once per run; a real run lasts hours)")
    print(f"  R     = {r_s:.2f} s lost per restart ({restart_s:.1f} s restarts + {capacity_s:.1f} s capacity_wait "
          f"over {restarts} restart(s) in {len(with_kills)} run(s))")
    print(f"  C     = {c} steps between checkpoints; measured recomputed steps per restart {recomputed:.1f} "
          f"(model: C/2 = {c / 2:g})")
    print(f"  s     = {s:.4f} s per step (clean run: {clean['goodput']['productive_s']:.1f} productive s / "
          f"{steps} steps)")
    print(f"  sigma = {sigma * 1000:.1f} ms checkpoint stall per checkpoint (clean run: "
          f"{_lost(clean, 'checkpoint_stall'):.3f} s over {checkpoints} checkpoints) -> "
          f"{sigma / (c * s):.2%} of training at C = {c}")
    g = model_goodput(r_s, c, s, sigma, t)
    print(f"  at T_kill = {t:g} s, C = {c}: goodput ~ {g:.2%}  (restarts {r_s / t:.2%}, recomputed "
          f"{c / 2 * s / t:.2%}, checkpoint stall {sigma / (c * s):.2%})")
    candidates = range(1, 200001)
    ok = [n for n in candidates if model_goodput(r_s, n, s, sigma, t) >= GOAL]
    best = max(candidates, key=lambda n: model_goodput(r_s, n, s, sigma, t))
    best_text = (f"best C = {best} ({best * s:.1f} s of training): {model_goodput(r_s, best, s, sigma, t):.2%}, "
                 f"of which recomputation + checkpoint stall cost "
                 f"{1 - r_s / t - model_goodput(r_s, best, s, sigma, t):.2%}")
    if ok:
        print(f"  >= {GOAL:.0%} at T_kill = {t:g} s: checkpoint every {ok[0]} to {ok[-1]} steps "
              f"({ok[0] * s:.1f} to {ok[-1] * s:.0f} s of training); {best_text}")
    else:
        # The most R may be for 97 % at the best checkpoint interval.
        floor = 1 - r_s / t - model_goodput(r_s, best, s, sigma, t)
        print(f"  >= {GOAL:.0%} at T_kill = {t:g} s: not reachable with any checkpoint interval: restarts alone cost "
              f"{r_s / t:.2%} of T_kill; {best_text}; 97 % needs R <= {t * (1 - GOAL - floor):.1f} s per failure")
    for r in with_kills:
        kills = len(r.get("kills", []))
        if not kills:
            continue
        gp = r["goodput"]
        span = gp["wall_s"] - _lost(r, "startup") - _lost(r, "other")
        t_eff = span / kills  # the mean time between kills this run actually had
        measured = gp["productive_s"] / span
        print(f"  check, {r['scenario']:>6}: {kills} kill(s) in {span:.0f} s of training and restarts "
              f"(T_kill {t_eff:.0f} s): measured {measured:.1%}, model {model_goodput(r_s, c, s, sigma, t_eff):.1%} "
              "(startup and end of run left out of both)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="30,60,120",
                        help="comma-separated seconds of training between kills, one run each (plus a clean run)")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps of each run")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds a step is slowed to (a sleep)")
    parser.add_argument("--every", type=int, default=20, help="checkpoint.every_n_steps")
    parser.add_argument("--timeout", type=float, default=300, help="limit on each wait, seconds")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kills' jitter and node choice")
    parser.add_argument("--target-interval", type=float, default=600,
                        help="seconds between kills to extrapolate to (the issue's target: 600)")
    parser.add_argument("--fast-health-checks", action="store_true",
                        help="head _system_config: node health checks every 1 s, 3 misses (default: Ray's)")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="keep each scenario's output, step log, storage and Ray logs in DIR")
    # Internal: one scenario, in a child process.
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--ray-temp-dir", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        intervals = [float(x) for x in args.intervals.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--intervals: comma-separated seconds, not {args.intervals!r}")
    if any(t <= 0 for t in intervals) or args.steps <= END_MARGIN_STEPS or args.every < 1:
        parser.error("--intervals must be > 0, --steps > 5 and --every >= 1")

    if args.measure:
        finish_child(measure(args))

    print(f"cluster: head num_cpus=0 + 3 x 1-CPU nodes on 127.0.0.1; health checks: "
          f"{'fast ' + json.dumps(FAST_HEALTH_CHECKS) if args.fast_health_checks else 'Ray defaults'}; "
          f"2 workers, {args.steps} steps of ~{args.step_s} s, checkpoint every {args.every} steps; "
          f"kills every {', '.join(f'{t:g}' for t in intervals)} s of training (seed {args.seed}), "
          "a replacement node after each", flush=True)
    keep = os.path.abspath(args.keep) if args.keep else None
    scenarios = [CLEAN] + [f"{t:g}" for t in intervals]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        for scenario in scenarios:
            started = time.monotonic()
            got = run_scenario(scenario, args, os.path.join(keep or scratch, f"chaos-{scenario}"))
            results[scenario] = got
            print(f"{scenario}: done in {time.monotonic() - started:.0f} s"
                  + (f": {got['error']}" if got.get("error") else ""), flush=True)
            if "output_tail" in got:
                print("  " + got["output_tail"].replace("\n", "\n  "), flush=True)
    if keep:
        print(f"kept in {keep}")

    reference = results[CLEAN].get("weights_sha256")
    print()
    print(f"{'run':<12} {'wall s':>7} {'goodput':>8} {'w/o startup':>13} {'kills':>5} {'restarts':>8} "
          f"{'recomputed':>10}  {'same sha':<8} {'status':<9}")
    for scenario in scenarios:
        label = CLEAN if scenario == CLEAN else f"every {scenario} s"
        print(_row(label, results[scenario], None if scenario == CLEAN else reference))
    print(f"clean weights_sha256: {reference}")
    extrapolate(results[CLEAN], [results[s] for s in scenarios[1:]], args)


if __name__ == "__main__":
    main()
