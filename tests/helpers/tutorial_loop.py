"""The tutorial DDP loop as users port it by hand: a training loader and a validation loader,
both from ctx.data_loader, validation after every epoch with its counts summed over the ranks.
The training samples are augmented at random in two DataLoader worker processes, as image jobs'
are (augment_jobs.NoisyDigits); the validation samples are the plain split, read in the rank's
own process. With `fault` in its config, rank `kill_rank` SIGKILLs itself once after step `kill_at`."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from augment_jobs import NoisyDigits
from faulty import _kill_once

from jobs.digits_data import load_split
from jobs.digits_torch import build_model


def train_loop(ctx) -> None:
    fault = ctx.config.get("fault")
    model = ctx.prepare_model(build_model(64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_loader = ctx.data_loader(NoisyDigits(), batch_size=32, num_workers=2)
    val_loader = ctx.data_loader(load_split("val"), batch_size=64, shuffle=False)
    ctx.track(model=model, optimizer=optimizer)

    for _epoch in ctx.epochs():
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            ctx.step(loss=loss.item())
            if fault:
                _kill_once(fault["marker"], ctx.global_step, fault["kill_at"], ctx.rank, fault["kill_rank"])
        model.eval()
        counts = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
        dist.all_reduce(counts)
        ctx.report(val_acc=(counts[0] / counts[1].clamp(min=1)).item(), val_seen=counts[1].item())
