"""Which checkpoints retention may delete: a pure decision over what the store lists.

Only a checkpoint read back and confirmed on storage (`verified`) can make older ones
redundant. The newest verified checkpoint is the anchor: nothing newer than it is touched
(unverified, possibly still being written or found bad), the anchor itself is always kept, and
`keep_last` counts back from it. Without an anchor nothing committed is deleted, so with
`keep_last: 1` a bad newest checkpoint never costs the good one before it.
"""

from __future__ import annotations

from orchestrator.checkpoint.info import CheckpointInfo

DELETING_PREFIX = ".tmp-deleting-"


def doomed(infos: list[CheckpointInfo], verified: set[str], keep_last: int | None,
           keep_best: tuple[int, str, str] | None = None) -> list[CheckpointInfo]:
    """The checkpoints to delete, oldest first. `infos` is the store's scan (oldest first).

    Also doomed: partial folders (interrupted writes) older than the newest committed
    checkpoint, and folders an earlier pass moved aside but could not finish removing. Superseded
    checkpoints (an earlier branch's, set aside when the run branched) are another trajectory's:
    kept while `keep_last` keeps everything, else removed once older than the newest committed.
    """
    committed = [i for i in infos if i.status == "committed"]
    leftovers = [i for i in infos if i.name.startswith(DELETING_PREFIX)]
    anchors = [i for i in committed if i.name in verified]
    if not anchors:
        return leftovers
    anchor = anchors[-1]
    upto = [i for i in committed if i.step <= anchor.step]
    keep = {anchor.name}
    keep.update(i.name for i in (upto if keep_last is None else upto[-keep_last:] if keep_last > 0 else []))
    keep.update(i.name for i in committed if i.step > anchor.step)
    if keep_best is not None:
        k, monitor, mode = keep_best
        scored = [i for i in committed if monitor in i.manifest.metrics]
        scored.sort(key=lambda i: i.manifest.metrics[monitor], reverse=(mode == "max"))
        keep.update(i.name for i in scored[:k])
    newest = committed[-1].step
    stale = [i for i in infos if i.status != "committed" and i.step < newest and i not in leftovers
             and (keep_last is not None or i.status != "superseded")]
    return [i for i in committed if i.name not in keep] + stale + leftovers
