"""The plain-PyTorch path in a rank child.

    loop.py  train_loop(ctx): the context that makes a DDP loop resumable, and its data loaders
"""
