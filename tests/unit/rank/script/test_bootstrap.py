"""The bootstrap's measure of a rank's own work a step (rank/script/bootstrap.py's _StepWork), on a
real script under the bootstrap, as every rank child runs: from the end of one optimizer step to
the end of the next forward, the loss included; what follows the forward (the backward, where a
DDP rank waits for its peers) is not."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.agent.children import BOOTSTRAP
from orchestrator.rank.agent_contract import BEAT_FILE_VAR, BEAT_LAYOUT

LOADING_S, AFTER_FORWARD_S = 0.03, 0.06


def test_a_ranks_own_work_is_its_batch_forward_and_loss_and_not_what_follows(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
        "loss_fn = torch.nn.MSELoss()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(24):\n"
        f"    time.sleep({LOADING_S})  # loading the batch: the rank's own work\n"
        "    x, y = torch.randn(4, 8), torch.randn(4, 1)\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        f"    time.sleep({AFTER_FORWARD_S})  # after the forward: where a DDP rank would wait\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n")
    beat = tmp_path / "beat"
    done = subprocess.run([sys.executable, BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, BEAT_FILE_VAR: str(beat)})
    assert done.returncode == 0, done.stderr
    steps, _, step_time, _, work = BEAT_LAYOUT.unpack(beat.read_bytes()[:BEAT_LAYOUT.size])
    assert steps == 24
    # Slack above for a busy machine's late wake-ups; never the AFTER_FORWARD_S that follows.
    assert LOADING_S <= work < LOADING_S + AFTER_FORWARD_S / 2, (work, step_time)
    assert step_time >= LOADING_S + AFTER_FORWARD_S
