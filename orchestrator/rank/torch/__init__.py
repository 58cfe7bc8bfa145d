"""The plain-PyTorch path in a rank child: train_loop(ctx)."""
