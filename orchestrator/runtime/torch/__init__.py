"""The plain-PyTorch path inside a worker: train_loop(ctx)."""
