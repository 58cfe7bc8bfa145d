"""The processes of an embedded cluster find that cluster when Ray looks for "the cluster of this
machine", not the machine's newest one (a user's `ray start --head`): Ray Train's placement group
cleaner asks the cluster it finds whether the run's controller lives, and removes the run's
placement group when that cluster has never heard of it (tests/e2e/test_beside_another_cluster.py
shows a warm cluster's run losing its workers that way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO
from other_cluster import plain_head

pytestmark = pytest.mark.slow

# In a process of its own, as a user's command: an embedded cluster, and what Ray's own address
# discovery says in one of its workers.
DISCOVERY = """
import json
from orchestrator.cluster.environment import keep_ray_on_loopback
keep_ray_on_loopback(None)  # as the command line does before it imports Ray
import ray
from ray._private import services
from orchestrator.cluster import connection
link = connection.connect(None)

@ray.remote(num_cpus=0)
def found():
    return services.canonicalize_bootstrap_address(None)

print(json.dumps({"own": ray.get_runtime_context().gcs_address, "found": ray.get(found.remote())}))
connection.disconnect(link)
"""


@pytest.mark.timeout(180)
def test_an_embedded_clusters_processes_find_their_own_cluster_beside_the_machines_newest():
    with plain_head(dict(os.environ)) as other:
        done = subprocess.run([sys.executable, "-c", DISCOVERY], capture_output=True, text=True, timeout=150,
                              cwd=REPO, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["found"] == seen["own"] != other["address"], seen
