"""A small deterministic training run that checkpoints every step through the real store.

`python tests/helpers/crash_writer.py STORAGE_URI unsharded|sharded` trains from the newest committed
checkpoint (`latest`) to STEPS and prints the final weights' sha256. With
ORCHESTRATOR_TEST_KILL_AT set, the process SIGKILLs itself at that phase of a save: the
kill-at-each-phase tests run it that way (`--serve` forks each such writer), then resume it with
`train()` in-process.

Sharded mode writes each checkpoint as two ranks' shards (rank r holds the r-th half of every
tensor) and commits them as rank 0 does, so both commit protocols are exercised.
"""

from __future__ import annotations

import sys
import uuid

import torch

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore, Manifest, Serialized, loads_state
from orchestrator.checkpoint.manifest import library_versions
from orchestrator.rank.fingerprint import weights_sha256

STEPS = 5
KEEP_LAST = 1

# Looked up once here, so that processes forked after this module's import do not each pay ~1 s.
library_versions()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 8, generator=generator), torch.randn(16, 4, generator=generator)


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4)


def restore(store: CheckpointStore, sharded: bool) -> tuple[torch.nn.Module, int]:
    model = fresh_model()
    selection = store.latest_loadable()
    if selection.info is None:
        return model, 0
    if sharded:
        halves = [loads_state(selection.files[f"shard-{r}.pt"], source="shard") for r in range(2)]
        state = {name: torch.cat([halves[0][name], halves[1][name]]) for name in halves[0]}
    else:
        state = loads_state(selection.files["state.pt"], source="state")
    model.load_state_dict(state)
    return model, selection.info.step


def save(store: CheckpointStore, model: torch.nn.Module, step: int, sharded: bool) -> None:
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    manifest = Manifest(step=step, epoch=0, batch_in_epoch=step, world_size=2 if sharded else 1,
                        kind="torch", files={}, sharded=sharded)
    if sharded:
        token = uuid.uuid4().hex[:8]
        for rank in range(2):
            half = {name: tensor.chunk(2)[rank].clone() for name, tensor in state.items()}
            store.write_shard(step, token, rank, {f"shard-{rank}.pt": Serialized(half)})
        store.commit_shards(manifest, token, timeout_s=30, poll_s=0.01)
    else:
        store.commit(manifest, {"state.pt": Serialized(state)})
    store.retain(keep_last=KEEP_LAST)


def train(uri: str, sharded: bool) -> tuple[int, str]:
    """Resume from `latest`, train to STEPS saving after each step; (resumed step, weights sha256)."""
    store = CheckpointStore(storage.resolve(uri))
    model, start = restore(store, sharded)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(start + 1, STEPS + 1):
        x, y = batch(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        save(store, model, step, sharded)
    return start, weights_sha256(model.state_dict())


def serve() -> None:
    """Fork one killed writer per request: a JSON line {uri, sharded, kill_at, env} on stdin,
    answered with the child's wait status on stdout.

    Forked from this process (torch imported once, no threads, no storage client started), a
    writer starts in milliseconds rather than the seconds a new interpreter takes.
    """
    import json
    import os

    from orchestrator.checkpoint import phases

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.environ.update(request["env"])
            os.environ[phases.KILL_ENV] = request["kill_at"]
            try:
                train(request["uri"], request["sharded"])
            finally:
                os._exit(0)  # not killed: the test reports the phase as never reached
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        print(train(sys.argv[1], sys.argv[2] == "sharded")[1])
