"""Jobs that are slow where a real job is legitimately slow, for the hang watchdog's phases.

None of them hangs: each one's slow part ends on its own, well within the spec's phase limits,
and a run of them must finish without a single restart. `SLOW_S` is longer than the tests'
`failure.hang_timeout_s` (5 s, the smallest the spec allows), so that timing the slow part as
training would end the group.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from jobs.digits import DigitsClassifier
from jobs.digits_data import load_split
from jobs.digits_torch import build_model
from orchestrator.checkpoint import CheckpointStore

# Seconds of each slow part: longer than the hang timeout of 5 s, with a margin for a loaded machine.
SLOW_S = 9.0


def slow_storage_then_evaluation(ctx) -> None:
    """Rank 0's first retention pass stalls (slow storage); the loop stops at max_steps in the
    middle of an epoch and then evaluates for a while, as users do after their loop."""
    if ctx.rank == 0:
        real_retain = CheckpointStore.retain
        stalled = []

        def retain(self, *args, **kwargs):
            if not stalled:  # once: the next save waits for this write, its peers for that save
                stalled.append(True)
                time.sleep(SLOW_S)
            return real_retain(self, *args, **kwargs)

        CheckpointStore.retain = retain
    model = ctx.prepare_model(build_model(32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = ctx.data_loader(load_split("train"), batch_size=32)
    ctx.track(model=model, optimizer=optimizer)
    for _epoch in ctx.epochs():
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            ctx.step()
    time.sleep(SLOW_S)  # the user's evaluation after the loop
    ctx.report(evaluated=1.0)


class SlowFirstStep(DigitsClassifier):
    """A first training step as long as a compiled model's or an autotuned one's."""

    def training_step(self, batch, batch_idx):
        if self.global_step == 0:
            time.sleep(SLOW_S)
        return super().training_step(batch, batch_idx)
