"""Runnable example jobs: specs plus their model and data code. Copy one to start your own."""
