"""The Lightning path in a rank child: fit, fsdp, deepspeed, loggers, the Parquet DataModule."""
