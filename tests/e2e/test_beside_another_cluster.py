"""A run beside another Ray cluster on the same machine keeps its workers.

Ray Train's PlacementGroupCleaner asks Ray's state API every second whether the run's controller
is alive, and removes the run's placement group when it is not; given no address, that client
asks the machine's newest cluster (a user's own `ray start --head`). Asked there, our controller
was "not found", so dead: the training run's placement group was removed, its workers destroyed,
and an attempt lost (CI: "Destroying worker since its placement group was removed", the first
of a fault test's restarts used up before it had begun). The other cluster here comes up while
the run trains, as a user's may, and stays up for several of the cleaner's checks.

An embedded cluster has no dashboard, so its cleaner's own question fails and it stops asking;
tests/unit/cluster/test_own_address.py checks that its processes find their own cluster too.
"""

from __future__ import annotations

import os
import time

import pytest
from cli_runs import BackgroundRun
from conftest import wait_for
from other_cluster import plain_head
from specs import torch_spec

pytestmark = pytest.mark.slow

# The cleaner checks every second: this many seconds of the other cluster's dashboard answering
# give it several checks while the run holds.
CHECKS_WINDOW_S = 6


@pytest.mark.timeout(400)
@pytest.mark.usefixtures("warm_cluster")
def test_a_run_keeps_its_placement_group_when_another_cluster_with_a_dashboard_comes_up_beside_it(tmp_path):
    marker, release = tmp_path / "at-step-5", tmp_path / "release"
    spec = torch_spec("beside", tmp_path, loop="faulty:slow_loop", sleep_s=0.05, mark_at=5, marker=str(marker),
                      hold_s=300, release=str(release))
    spec["torch"]["max_epochs"] = 1
    # Rank 0's hold (the other head's start, its dashboard's, the window) is no hang, however
    # long a loaded machine makes it.
    spec["failure"]["hang_timeout_s"] = 300
    run = BackgroundRun(spec, str(tmp_path), mode="ray")
    try:
        wait_for(marker.exists, timeout=240)
        with plain_head(_without_auth(), dashboard=True):
            time.sleep(CHECKS_WINDOW_S)
            assert not run.ended(), "the run ended while it was held"
            release.write_text("")
            result = run.result(timeout=240)
    finally:
        release.write_text("")
        BackgroundRun.end_all()

    assert result.status == "finished"
    assert result.failures == [], result.failures
    assert result.restarts == 0 and len(result.starts) == 1


def _without_auth() -> dict[str, str]:
    """A user's cluster without token auth: its dashboard answers whoever asks."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    return {**env, "RAY_AUTH_MODE": "disabled"}
