"""The Lightning path in a rank child.

    fit.py           the harness: its callback, the store's CheckpointIO, and resume
    fsdp.py          `strategy: fsdp`: FSDP2 under Lightning, its sharded checkpoints
    deepspeed.py     `strategy: deepspeed`: DeepSpeed ZeRO saving to and resuming from the store
    loggers.py       the spec's Lightning loggers: one logger run for the whole training run
    datamodule.py    the LightningDataModule built from the spec's `data:` section
    stream_split.py  a user's IterableDataset shared out over the ranks
"""
