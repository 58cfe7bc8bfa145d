"""A training script written the torchrun way, as the people we build for write theirs: env://
init, LOCAL_RANK, DDP, DistributedSampler, SGD with momentum, its own checkpoint at each epoch end
in --work_dir, and --resume_from=latest. It knows nothing of the orchestrator.

    torchrun --nproc_per_node 2 tests/helpers/torchrun_seed.py --work_dir /tmp/w --resume_from=latest
    orchestrator torchrun --nproc_per_node 2 tests/helpers/torchrun_seed.py --work_dir {run_dir}/work --resume_from=latest

For the tests and bench/torchrun.py it can also hurt itself once (--fault kill|stop|bug|exit on
--fault_rank at --fault_epoch/--fault_step, remembered by a marker file in --work_dir so that the
restarted script does not do it again), write its environment (--env_out DIR), and append one
line per event (start, first step, epoch end, steps/s) to <work_dir>/events.jsonl.
"""

import argparse
import hashlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE",
            "ORCHESTRATOR_RUN_DIR", "CUDA_VISIBLE_DEVICES")


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--resume_from", default="latest", choices=["latest", "none"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    # One fault, or several separated by commas: the i-th strikes at epoch fault_epoch + i.
    parser.add_argument("--fault", default="none")
    parser.add_argument("--fault_rank", type=int, default=1)
    parser.add_argument("--fault_epoch", type=int, default=1)
    parser.add_argument("--fault_step", type=int, default=3)
    parser.add_argument("--env_out", default=None)
    return parser.parse_args()


def event(args, rank, kind, **fields):
    if rank == 0:
        with open(os.path.join(args.work_dir, "events.jsonl"), "a") as f:
            f.write(json.dumps({"kind": kind, "time": time.time(), "pid": os.getpid(),
                                "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), **fields}) + "\n")


def hurt_once(args, rank, epoch, step):
    """The fault, once per work_dir: a marker says it happened (a restarted script goes on)."""
    faults = [f for f in args.fault.split(",") if f != "none"]
    index = epoch - args.fault_epoch
    if rank != args.fault_rank or step != args.fault_step or not 0 <= index < len(faults):
        return
    fault = faults[index]
    assert fault in ("kill", "stop", "bug", "exit"), fault
    marker = os.path.join(args.work_dir, f"fault-{fault}.done")
    if os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write(str(time.time()))
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return  # continued: the supervisor is ending this process
    if fault == "exit":
        raise SystemExit(3)
    raise ValueError(f"bad batch at epoch {epoch} step {step}")  # the bug: tests look for this line


def fingerprint(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@record
def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    os.makedirs(args.work_dir, exist_ok=True)
    if args.env_out:
        os.makedirs(args.env_out, exist_ok=True)
        seen = {key: os.environ.get(key) for key in ENV_KEYS}
        seen["cuda_device"] = torch.cuda.current_device() if cuda else None
        seen["parent_pid"] = os.getppid()
        seen["extra"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_", "SEED_"))}
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        with open(os.path.join(args.env_out, f"rank-{rank}-restart-{restart}.json"), "w") as f:
            json.dump(seen, f)
    event(args, rank, "start", world_size=world)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 4, (args.samples,)))
    model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 4))
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    checkpoint = os.path.join(args.work_dir, "checkpoint.pt")
    if args.resume_from == "latest" and os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
        print(f"rank {rank}: resumed from epoch {start_epoch}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    first, steps, window_start = True, 0, None
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            hurt_once(args, rank, epoch, step)
            loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            steps += 1
            if first:
                event(args, rank, "first_step", epoch=epoch)
                first, window_start, steps = False, time.perf_counter(), 0
        print(f"rank {rank}: epoch {epoch} loss {loss.item():.4f}", flush=True)
        if rank == 0:
            partial = checkpoint + ".partial"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}, partial)
            os.replace(partial, checkpoint)
        dist.barrier()
        event(args, rank, "epoch_end", epoch=epoch)
    if window_start is not None and steps:
        event(args, rank, "rate", steps_per_s=steps / (time.perf_counter() - window_start), steps=steps)
    if rank == 0:
        with open(os.path.join(args.work_dir, "final.json"), "w") as f:
            json.dump({"sha256": fingerprint(model), "epochs": args.epochs, "world_size": world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
