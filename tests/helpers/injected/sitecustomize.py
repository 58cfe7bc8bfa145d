"""Fault injection at interpreter start, for training workers only: with
ORCHESTRATOR_TEST_UNREADABLE_RANK set (through the spec's env:), that rank's first attempt to
read the checkpoint its worker group resumes from fails as a storage outage would (EIO). A marker
file makes it happen once. Every other process started with this directory on its path is left
alone.

The store is patched when the worker first imports it, not here: importing it here would import
torch before Ray Train sets the worker's OMP_NUM_THREADS, and torch would then compute with
another thread count than an uninjected run (the same loss, other low bits in the weights).
"""

import os

if os.environ.get("ORCHESTRATOR_TEST_UNREADABLE_RANK"):
    import importlib.abc
    import importlib.util
    import sys

    STORE_MODULE = "orchestrator.checkpoint.store"

    def _patch(store) -> None:
        import errno

        rank = int(os.environ["ORCHESTRATOR_TEST_UNREADABLE_RANK"])
        marker = os.environ["ORCHESTRATOR_TEST_UNREADABLE_MARKER"]
        real_open_uri = store.CheckpointStore.open_uri

        def open_uri(self, uri, keep=None, *, verify_all=True):
            # The rank from torchrun's variables, which every rank has (a ctx job's rank is a child
            # process of its node's agent, with no Ray Train context).
            if int(os.environ.get("RANK", "-1")) == rank and not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(uri)
                raise OSError(errno.EIO, "injected: the storage does not answer this node")
            return real_open_uri(self, uri, keep, verify_all=verify_all)

        store.CheckpointStore.open_uri = open_uri

    class _PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != STORE_MODULE:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchOnImport())
