"""The Lightning path inside a worker: fit, fsdp, deepspeed, loggers, the Parquet DataModule."""
