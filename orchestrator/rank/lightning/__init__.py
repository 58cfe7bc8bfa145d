"""The Lightning path in a rank child: fit, fsdp, deepspeed, loggers, the Parquet DataModule, and
stream_split (a user's IterableDataset shared out over the ranks)."""
