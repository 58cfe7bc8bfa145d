"""Torchrun scripts that do what users' scripts do and the seed does not (tests/e2e/test_torchrun_promises.py):

    --mode alone    rank 1 takes 5 optimizer steps and exits 0; rank 0 never steps an optimizer and
                    works alone for --work_s (an evaluation, a save, an upload)
    --mode helpers  each rank starts a `sleep` and a fork Pool worker and writes their pids, then
                    takes --steps optimizer steps; on its first start rank 1 calls sys.exit(3) after
                    5 steps, on its second it SIGKILLs itself; the third runs to the end. Rank 0
                    prints --flood lines at its end. Each rank writes which RAY_* variables it sees.
    --mode bug      as helpers, but rank 1 raises ValueError after starting its helpers

Every file it writes goes to --work_dir (pids-<rank>-<attempt>.json, env-<rank>.json, steps.json).
"""

import argparse
import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def write(path: str, value) -> None:
    with open(path + ".partial", "w") as f:
        json.dump(value, f)
    os.replace(path + ".partial", path)


def busy(seconds: float) -> None:
    """Work in Python, as an evaluation loop does."""
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total += sum(range(1000))


def steps(n: int, pause: float = 0.0) -> list[float]:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    times = []
    for _ in range(n):
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.monotonic())
        time.sleep(pause)
    return times


def start_helpers(work: str, rank: int, attempt: int) -> None:
    sleeper = subprocess.Popen(["sleep", "600"])
    pool = multiprocessing.get_context("fork").Pool(1)
    write(os.path.join(work, f"pids-{rank}-{attempt}.json"), [sleeper.pid, pool.apply(os.getpid)])
    start_helpers.keep = (sleeper, pool)  # alive until the process ends


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["alone", "helpers", "bug"], required=True)
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--work_s", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--flood", type=int, default=0)
    args = parser.parse_args()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    os.makedirs(args.work_dir, exist_ok=True)
    print(f"rank {rank}: attempt {attempt} started", flush=True)

    if args.mode == "alone":
        if rank == 1:
            steps(5)
            print("rank 1: done", flush=True)
            return
        busy(args.work_s)
        print("rank 0: evaluated alone", flush=True)
        return

    write(os.path.join(args.work_dir, f"env-{rank}.json"), sorted(k for k in os.environ if k.startswith("RAY_")))
    start_helpers(args.work_dir, rank, attempt)
    if args.mode == "bug" and rank == 1:
        raise ValueError("a bug after the helpers started")
    dist.init_process_group("gloo")
    times = []
    for step in range(args.steps):
        times += steps(1, pause=0.02)
        if rank == 1 and step == 5 and attempt == 0:
            sys.exit(3)  # the script's own choice: restart me
        if rank == 1 and step == 5 and attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
    if rank == 0:
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        write(os.path.join(args.work_dir, "steps.json"), {"median_s": gaps[len(gaps) // 2]})
        for i in range(args.flood):
            print(f"rank 0: flood line {i}")
    print(f"rank {rank}: attempt {attempt} finished", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
