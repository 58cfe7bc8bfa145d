"""On Ray, agents and ranks run at the driver's niceness, not at the lower priority (niceness 15)
Ray gives its workers (docs/failures.md, "A rank that fails"): a run on the warm cluster from a
command started at a niceness of its own, whose ranks write theirs and their agent's."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from cli_runs import _command, _env
from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="a niceness below Ray's 15 needs the privilege (root here, CAP_SYS_NICE)")
def test_on_ray_the_agents_and_ranks_run_at_the_drivers_niceness_not_rays_lower_one(tmp_path, warm_cluster):
    out = tmp_path / "niceness"
    out.mkdir()
    spec = {"name": "nice", "storage": str(tmp_path), "seed": 0,
            "torch": {"train_loop": "python_api_jobs:record_niceness", "max_epochs": 1,
                      "config": {"out_dir": str(out)}},
            "scaling": {"num_workers": 2}}
    driver_niceness = min(os.nice(0) + 3, 12)  # neither the test's nor Ray's: the command's own
    done = subprocess.run(_command(spec, None, str(tmp_path), "ray"), capture_output=True, text=True, cwd=REPO,
                          env=_env(), timeout=240,
                          preexec_fn=lambda: os.nice(driver_niceness - os.nice(0)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = next(line for line in done.stdout.splitlines() if not line.startswith("run name: "))
    assert "on Ray" in first, first
    seen = {name: json.loads((out / name).read_text()) for name in sorted(os.listdir(out))}
    assert seen == {f"rank-{r}": {"rank": driver_niceness, "agent": driver_niceness} for r in (0, 1)}, seen
