"""The torchrun-way script the script-path tests train (torchrun_seed.py): where it is, what it
writes (its events, its final weights), and its clean run under plain torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, free_port

SEED = os.path.join("tests", "helpers", "torchrun_seed.py")
EPOCHS = "4"
# The line of the script's bug (--fault bug), which a failed run must name.
BUG_LINE = next(i for i, line in enumerate(open(os.path.join(REPO, SEED)), 1) if "the bug: tests look" in line)


def events(work: str) -> list[dict]:
    with open(os.path.join(work, "events.jsonl")) as f:
        return [json.loads(line) for line in f]


def final(work: str) -> dict:
    with open(os.path.join(work, "final.json")) as f:
        return json.load(f)


def plain_torchrun_weights(work: str) -> dict:
    """The clean run's weights under plain torchrun (c10d rendezvous on loopback), 2 ranks, EPOCHS epochs."""
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nnodes", "1", "--nproc_per_node", "2",
         "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", SEED, "--work_dir", work,
         "--epochs", EPOCHS], cwd=REPO, capture_output=True, text=True, timeout=300)
    # final.json is written once training is over. (torch 2.13's gloo at times aborts a rank in its
    # teardown after that, under torchrun's c10d rendezvous: torchrun then exits 1.)
    assert os.path.exists(os.path.join(work, "final.json")), done.stdout[-2000:] + done.stderr[-3000:]
    return final(work)
