"""Connecting the driver to Ray: the embedded and warm clusters, their processes, the driver's
environment (loopback), capacity, and the one module of Ray's private API."""
