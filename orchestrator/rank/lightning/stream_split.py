"""Sharing a user's IterableDataset out over the ranks, in each rank child of the Lightning path
(from train_dataloader, while Trainer.fit sets up its data: every rank at the same point).

A stream that is the same on every rank is cut: each rank takes sample `rank` of every `world` in
a row of it. A stream that already splits itself by rank (datasets' split_dataset_by_node,
WebDataset's split_by_node, a `torch.distributed.get_rank()` in its own `__iter__`, a rank kept
in an attribute) is kept as written, as Lightning keeps every IterableDataset: cut again, it
would lose (world - 1) / world of its samples without a word.

Which of the two a stream is, is read from its data, so that no library needs to be known: every
rank reads the first sample of a fresh iterator of its stream, in its own process (not in a
loader worker; the RNG is put back afterwards, so the training draws the same random numbers as
without the look), hashes it, and the ranks compare the hashes in one collective. The same
first sample everywhere: the same stream. Different: already split. A stream that says it was
split (datasets' `_distributed`, a WebDataset pipeline holding split_by_node) is not read at all.
Every rank takes part in the collective exactly once, whatever its stream does (ends at once,
raises, holds something that cannot be hashed): a rank that fails alone must not leave the
others waiting.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset

from orchestrator.rank import collectives
from orchestrator.rank.rng import capture_rng, restore_rng

# What one rank knows of its stream: it says it is split, the hash of its first sample, it is
# empty, or its first sample could not be read or hashed (`detail` says why).
Kind = Literal["declared", "first", "empty", "unknown"]

_RESUME = ("a resume in the middle of an epoch starts that epoch's stream again from its beginning "
           "(exact mid-epoch resume needs a map-style Dataset)")
# Nested deeper than this, a sample is taken for a structure that refers to itself.
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Evidence:
    kind: Kind
    detail: str = ""


def rank_share(dataset: IterableDataset, world: int, rank: int) -> tuple[IterableDataset, str]:
    """This rank's part of the user's stream (`dataset` itself when it is kept as written), and
    what the driver should say about it. Collective when world > 1: every rank calls it."""
    name = type(dataset).__name__
    if world == 1:
        return dataset, f"the training loader reads an IterableDataset ({name}): {_RESUME}"
    evidence = collectives.all_gather_object(_evidence(dataset))
    declared = [e.detail for e in evidence if e.kind == "declared"]
    firsts = {e.detail for e in evidence if e.kind in ("first", "empty")}
    if declared or len(firsts) > 1:
        why = declared[0] if declared else "its first sample differs between ranks"
        return dataset, (f"the training loader reads an IterableDataset ({name}) that is already split by rank "
                         f"({why}): it is kept as written, each rank reading its own part, and {_RESUME}")
    cut = _RankShard(dataset, world, rank)
    unknown = [e.detail for e in evidence if e.kind == "unknown"]
    if unknown:
        return cut, (f"the training loader reads an IterableDataset ({name}) whose first samples could not be "
                     f"compared between the ranks ({unknown[0]}), so it is taken for the same stream on every "
                     f"rank: each rank takes one sample of every {world} in a row of it (if it splits itself by "
                     f"rank, {world - 1} of every {world} of its samples are lost so: to have it kept as written, "
                     f"make its first sample readable in the rank's own process), and {_RESUME}")
    return cut, (f"the training loader reads an IterableDataset ({name}), the same stream on every rank (its "
                 f"first sample is): each rank takes one sample of every {world} in a row of it, and {_RESUME}")


def _evidence(dataset: IterableDataset) -> Evidence:
    """What this rank can say of its stream, without taking anything from the training's reading."""
    declared = _declared_split(dataset)
    if declared:
        return Evidence("declared", declared)
    rng = capture_rng()
    try:
        iterator = iter(dataset)
        if iterator is dataset:
            return Evidence("unknown", f"the __iter__ of {type(dataset).__name__} returns the stream itself, so "
                                       "a sample read from it would be missing from the training")
        try:
            sample = next(iterator)
        except StopIteration:
            return Evidence("empty")
        finally:
            getattr(iterator, "close", lambda: None)()  # a generator's own cleanup (its open files) runs now
    except Exception as exc:  # the training's own reading raises it again, where the user expects it
        return Evidence("unknown", f"reading it raised {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        restore_rng(rng)
    try:
        return Evidence("first", sample_digest(sample))
    except Exception as exc:  # something no hash can be taken of (an open file, a lock): not the user's error
        return Evidence("unknown", f"its first sample, a {type(sample).__name__}, could not be hashed: "
                                   f"{type(exc).__name__}: {str(exc)[:300]}")


def _declared_split(dataset: Any) -> str:
    """How a stream says it is split by rank, read from attributes only (no library is imported)."""
    distributed = getattr(dataset, "_distributed", None)  # datasets.IterableDataset
    if hasattr(distributed, "rank") and hasattr(distributed, "world_size"):
        return f"split_dataset_by_node split it over {distributed.world_size} ranks"
    stages = getattr(dataset, "pipeline", None)  # webdataset.DataPipeline, WebDataset
    if isinstance(stages, list) and any(getattr(s, "__name__", "") == "split_by_node" for s in stages):
        return "its pipeline holds split_by_node"
    return ""


def sample_digest(sample: Any) -> str:
    """A hash of a sample's content that is the same in every process for equal samples: tensors
    and arrays by dtype, shape and bytes; mappings and sets in an order of their own (not their
    insertion or hash order); any other object by what it pickles to (its class and state)."""
    digest = hashlib.sha256()
    _feed(digest, sample, 0)
    return digest.hexdigest()


def _feed(digest, value: Any, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"a sample nested more than {_MAX_DEPTH} deep")

    def token(tag: str, data: bytes) -> None:
        digest.update(f"{tag}:{len(data)}:".encode())
        digest.update(data)

    if value is None or isinstance(value, (bool, int, float, complex)):
        token(type(value).__name__, repr(value).encode())
    elif isinstance(value, str):
        token("str", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        token("bytes", bytes(value))
    elif isinstance(value, torch.Tensor):
        tensor = value.detach()
        tensor = (tensor.to_dense() if tensor.layout != torch.strided else tensor).cpu().resolve_conj().resolve_neg()
        token("tensor", f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        token("data", tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "tobytes"):  # numpy, no import
        if getattr(value.dtype, "hasobject", False):  # its bytes would be addresses
            token("objects", f"{value.shape}".encode())
            _feed(digest, value.tolist(), depth + 1)
        else:
            token("array", f"{value.dtype.str}{value.shape}".encode())
            token("data", value.tobytes())
    elif isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        token("named", f"{getattr(value, '__module__', '')}.{value.__qualname__}".encode())
    elif isinstance(value, Mapping):
        _feed_unordered(digest, type(value).__qualname__, list(value.items()), depth)
    elif isinstance(value, (set, frozenset)):
        _feed_unordered(digest, type(value).__qualname__, list(value), depth)
    elif isinstance(value, (list, tuple)):
        token(type(value).__qualname__, str(len(value)).encode())
        for item in value:
            _feed(digest, item, depth + 1)
    else:  # what pickling would keep of it, walked like the rest (a set in its state in an order of its own)
        reduced = value.__reduce_ex__(4)
        if isinstance(reduced, str):
            token("global", reduced.encode())
            return
        parts = list(reduced[:3])
        parts += [list(part) if part is not None else None for part in reduced[3:5]]
        _feed(digest, tuple(parts), depth + 1)


def _feed_unordered(digest, tag: str, items: list, depth: int) -> None:
    """Items whose order means nothing (a mapping's pairs, a set's members), in the order of their hashes."""
    hashes = []
    for item in items:
        inner = hashlib.sha256()
        _feed(inner, item, depth + 1)
        hashes.append(inner.digest())
    digest.update(f"{tag}:{len(hashes)}:".encode())
    for h in sorted(hashes):
        digest.update(h)


class _RankShard(IterableDataset):
    """One rank's share of a stream that is the same on every rank: sample `rank` of each `world`
    consecutive samples (an incomplete last group is dropped, so every rank runs the same steps)."""

    def __init__(self, dataset: IterableDataset, world: int, rank: int):
        self.dataset, self.world, self.rank = dataset, world, rank

    def __iter__(self):
        group = []
        for sample in self.dataset:
            group.append(sample)
            if len(group) == self.world:
                yield group[self.rank]
                group = []
