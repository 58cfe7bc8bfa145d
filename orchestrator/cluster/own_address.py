"""Every process of a run's job names its own cluster in RAY_ADDRESS, so that Ray code that looks
for "the cluster of this machine" finds the run's cluster and no other.

Ray Train starts a PlacementGroupCleaner beside each run's controller (a detached actor). Every
second it asks Ray's state API whether the controller is alive, and removes the run's placement
group when it is not. That state API client is given no address: it takes RAY_ADDRESS, else the
machine's newest cluster (the file that `ray start` and ray.cluster_utils leave in /tmp/ray), else
the only GCS running on the machine (ray.dashboard.utils.get_address_for_submission_client). With
another cluster on the machine (a user's `ray start --head`, a test's cluster), the cleaner asks
that cluster's dashboard, which has never heard of our controller: "not found" reads as dead, and
it removes the placement group of a run that is training. Its workers are destroyed ("Destroying
worker since its placement group was removed") and the run loses an attempt to nothing.

With RAY_ADDRESS set in every process of the job (the controller, its cleaner, the workers), the
cleaner asks its own cluster. An embedded cluster has no dashboard: there the question fails, and
the cleaner stops asking, as it does on a machine with one cluster.
"""

from __future__ import annotations

import random
import socket

ADDRESS_ENV_VAR = "RAY_ADDRESS"
# Ray's head takes its GCS port from here when ray.init starts a local cluster (ray._private.node).
GCS_PORT_ENV_VAR = "RAY_GCS_SERVER_PORT"
LOOPBACK = "127.0.0.1"
# Ports below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default), which
# outgoing connections and bind(0) draw from, and above Ray's worker ports (10002-19999): a port
# found free here is not handed to anyone else in the second before the GCS binds it.
FIRST_PORT, LAST_PORT = 20000, 32767
PORT_TRIES = 50


def joined(address: str) -> dict[str, str]:
    """The job variables for a cluster joined at `address`; none for addresses Ray resolves itself
    ("auto", a Ray Client address), which name no GCS yet."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "://" in address:
        return {}
    return {ADDRESS_ENV_VAR: address}


def embedded() -> dict[str, str]:
    """The variables an embedded cluster starts with: its GCS port chosen here, and that address,
    which every process of the cluster inherits. ray.init(address="local") itself ignores
    RAY_ADDRESS."""
    port = _unused_port()
    return {GCS_PORT_ENV_VAR: str(port), ADDRESS_ENV_VAR: f"{LOOPBACK}:{port}"}


def _unused_port() -> int:
    # Checked on every interface: Ray's GCS listens on all of them.
    for port in random.sample(range(FIRST_PORT, LAST_PORT + 1), PORT_TRIES):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: any port the kernel gives
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]
