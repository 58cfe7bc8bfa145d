"""The small script of bench/local_start.py: 24 DDP steps of a small MLP on 2 ranks, written the
torchrun way. Rank 0 writes time.time() to $FIRST_STEP_FILE after its first optimizer step, and to
$FIRST_STEP_FILE.end after its last."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(24):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,))).backward()
    optimizer.step()
    if step == 0 and dist.get_rank() == 0 and os.environ.get("FIRST_STEP_FILE"):
        with open(os.environ["FIRST_STEP_FILE"], "w") as f:
            f.write(str(time.time()))
if dist.get_rank() == 0 and os.environ.get("FIRST_STEP_FILE"):
    with open(os.environ["FIRST_STEP_FILE"] + ".end", "w") as f:
        f.write(str(time.time()))
dist.destroy_process_group()
