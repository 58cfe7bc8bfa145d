"""Fault injection at interpreter start, for training workers only: with
ORCHESTRATOR_TEST_UNREADABLE_RANK set (through the spec's env:), that rank's first attempt to
read the checkpoint its worker group resumes from fails as a storage outage would (EIO). A marker
file makes it happen once. Every other process started with this directory on its path is left
alone."""

import os

if os.environ.get("ORCHESTRATOR_TEST_UNREADABLE_RANK"):
    import errno

    from orchestrator.checkpoint import store

    _rank = int(os.environ["ORCHESTRATOR_TEST_UNREADABLE_RANK"])
    _marker = os.environ["ORCHESTRATOR_TEST_UNREADABLE_MARKER"]
    _open_uri = store.CheckpointStore.open_uri

    def open_uri(self, uri, keep=None, *, verify_all=True):
        import ray.train

        if ray.train.get_context().get_world_rank() == _rank and not os.path.exists(_marker):
            with open(_marker, "w") as f:
                f.write(uri)
            raise OSError(errno.EIO, "injected: the storage does not answer this node")
        return _open_uri(self, uri, keep, verify_all=verify_all)

    store.CheckpointStore.open_uri = open_uri
