"""A torchrun script with one rank slowed for real (straggler_jobs.py's training, written the
torchrun way): `python straggler_script.py --steps N --work_s S --slow_rank R --slow_factor F`."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--work_s", type=float, default=0.02)
parser.add_argument("--slow_rank", type=int, default=-1)
parser.add_argument("--slow_factor", type=float, default=1.0)
args = parser.parse_args()

dist.init_process_group("gloo", init_method="env://")
rank = int(os.environ["RANK"])
sleep_s = args.work_s * (args.slow_factor if rank == args.slow_rank else 1.0)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    time.sleep(sleep_s)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
