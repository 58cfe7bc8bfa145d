"""Ray's dashboard on the warm local cluster (`orchestrator up`): the address and the token are
printed, and what it shows of a run is true: the Jobs API lists the run's driver by the run's name;
Ray Train's state API lists the run by name, finished (not aborted by a driver that left), with
each worker's rank, node and pid; the Actors API lists the run's monitor by name; without the
token it answers nothing."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest
from cli_runs import run_spec
from conftest import run_cli
from specs import torch_spec


def _get(record: dict, path: str, token: str | None) -> dict:
    request = urllib.request.Request(record["dashboard"] + path,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_cluster")
@pytest.mark.timeout(400)
def test_the_warm_clusters_dashboard_shows_the_run_by_name_finished_with_its_ranks(tmp_path, _warm_record):
    state = {"ORCHESTRATOR_STATE_DIR": os.path.dirname(_warm_record)}
    record = json.loads(open(_warm_record).read())
    up = run_cli("up", env=state, timeout=60)
    assert up.returncode == 0 and f"dashboard: {record['dashboard']} (Ray asks for the cluster's token" in up.stdout
    assert "RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(orchestrator up --token) ray job submit --address" in up.stdout
    token = run_cli("up", "--token", env=state, timeout=60)
    assert token.returncode == 0 and token.stdout.strip() == record["token"]

    spec = torch_spec("on-the-dashboard", tmp_path)
    spec["torch"]["max_epochs"] = 1
    result = run_spec(spec, str(tmp_path))
    assert result.status == "finished"

    runs = [r for r in _get(record, "/api/train/v2/runs/v1", record["token"])["train_runs"]
            if r["name"].startswith("on-the-dashboard-")]
    assert len(runs) == 1 and runs[0]["status"] == "FINISHED", runs
    workers = runs[0]["attempts"][-1]["workers"]
    assert sorted(w["world_rank"] for w in workers) == [0, 1]
    # Each worker is a node's agent (a RayTrainWorker), its ranks the agent's children.
    assert all(w["node_ip"] == "127.0.0.1" and w["pid"] > 0 and w["actor_id"] for w in workers)
    actors = _get(record, "/api/v0/actors?detail=1&limit=10000", record["token"])["data"]["result"]["result"]
    monitor = [a for a in actors if a["class_name"] == "RunMonitor" and a["name"] == "on-the-dashboard monitor"]
    assert len(monitor) == 1 and monitor[0]["repr_name"] == "RunMonitor(run='on-the-dashboard')"

    # The Jobs page: the run's driver job, named by the run (its Name column).
    jobs = [j for j in _get(record, "/api/jobs/", record["token"]) if (j.get("metadata") or {}).get("job_name")
            == "on-the-dashboard"]
    assert len(jobs) == 1 and jobs[0]["status"] == "SUCCEEDED" and "orchestrator" in jobs[0]["entrypoint"]

    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(record, "/api/train/v2/runs/v1", None)
    assert refused.value.code in (401, 403)
