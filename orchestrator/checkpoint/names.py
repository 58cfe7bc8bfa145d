"""The names of a checkpoint's state files, for both harnesses, in one place: a checkpoint
written by one release must be found by the next, so these names never change.

Unsharded, one file holds the whole state (`state.pt` for a plain PyTorch loop, `lightning.ckpt`
for Lightning). Sharded (fsdp), every rank writes its own part beside it, named from the whole
file's name: `state-00003.pt`, `lightning-00003.ckpt`.
"""

from __future__ import annotations

import os

TORCH_STATE = "state.pt"
LIGHTNING_STATE = "lightning.ckpt"


def shard_file(whole: str, rank: int) -> str:
    """Rank `rank`'s file of a sharded checkpoint whose unsharded state file is named `whole`."""
    stem, suffix = os.path.splitext(whole)
    return f"{stem}-{rank:05d}{suffix}"
