"""Training data: one global, world-size-independent order of samples per epoch."""
