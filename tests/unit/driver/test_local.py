"""Which mode a run goes in (orchestrator/driver/local.py): local for one node with no cluster
named or up, Ray otherwise; --local refused, with the reason, where only a cluster serves; a
local run's first ranks started before the command imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.driver import local
from orchestrator.errors import UserError
from orchestrator.spec import resolve_spec


def _job(**scaling):
    return resolve_spec({"name": "m", "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1},
                         "scaling": {"num_workers": 2, **scaling}})


def _script(nnodes):
    return resolve_spec({"name": "s", "script": {"path": "bench/local_start_script.py", "nproc_per_node": 2},
                         "scaling": {"num_workers": nnodes}})


@pytest.fixture(autouse=True)
def _no_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a user's shell without one


def test_one_node_with_no_cluster_named_or_up_runs_locally_and_says_how_to_choose_ray():
    mode = local.choose(_job(), None)
    assert mode.local and mode.line.startswith("local mode: one node, 2 rank(s) on this machine") and "--ray" in \
        mode.line
    assert local.choose(_script(1), None).local


def test_an_address_several_nodes_or_an_elastic_size_go_to_ray_and_say_why(monkeypatch):
    assert local.choose(_job(), "127.0.0.1:6379").line == "on Ray: joining the cluster at 127.0.0.1:6379"
    assert "2 nodes need a cluster" in local.choose(_script(2), None).line
    assert not local.choose(_job(num_workers=[1, 2]), None).local
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # under `ray job submit`
    assert local.choose(_job(), None).line == "on Ray: joining the cluster at 10.0.0.1:6379"
    assert local.choose(_job(), None, local.RAY).line == "on Ray (--ray)"


def test_local_is_refused_with_the_reason_where_only_a_cluster_serves():
    with pytest.raises(UserError, match=r"asks for 2 nodes \(--nnodes 2\), which only a Ray cluster gives"):
        local.choose(_script(2), None, local.LOCAL)
    with pytest.raises(UserError, match=r"an elastic size \(1 to 2 workers\)"):
        local.choose(_job(num_workers=[1, 2]), None, local.LOCAL)
    with pytest.raises(UserError, match=r"a Ray cluster was named too \(127.0.0.1:6379"):
        local.choose(_job(), "127.0.0.1:6379", local.LOCAL)


def test_ranks_that_ask_for_more_than_the_machine_has_are_refused_at_once():
    cpus = len(os.sched_getaffinity(0))
    local.check_fits_here(_job(num_workers=cpus))
    with pytest.raises(UserError, match=rf"{cpus + 1} worker\(s\) x 1 rank\(s\) cannot run on this machine in local "
                                        rf"mode: they ask for {{CPU: {cpus + 1}}}.*Fix:"):
        local.check_fits_here(_job(num_workers=cpus + 1))


def test_a_warm_clusters_record_whose_cluster_is_gone_is_removed_and_said_and_the_run_goes_local(tmp_path):
    import json
    import socket

    from orchestrator.cluster.records import state_dir
    from orchestrator.cluster.warm import RECORD_NAME

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record = state_dir() / RECORD_NAME
    record.write_text(json.dumps({"address": f"127.0.0.1:{port}", "session_dir": str(tmp_path / "gone"),
                                  "temp_dir": str(tmp_path / "gone"), "token": "x" * 64, "started_at": 0.0}))
    mode = local.choose(_job(), None)
    assert mode.local and not record.exists()
    assert len(mode.notes) == 1 and f"the warm local cluster recorded at 127.0.0.1:{port}" in mode.notes[0]


def test_a_local_runs_first_ranks_start_before_the_command_has_imported_torch(tmp_path):
    """The command starts a ctx run's first ranks from the spec's import-free pass, before it pays
    for torch itself (in a fresh process, as the command line's): they import it beside it."""
    code = (
        "import sys, json\n"
        "from orchestrator.driver import local\n"
        "from orchestrator.spec import resolve_spec\n"
        "job = resolve_spec({'name': 'm', 'torch': {'train_loop': 'jobs.digits_torch:train_loop', 'max_epochs': 1},"
        " 'scaling': {'num_workers': 1, 'nproc_per_node': 2}}, read_only=True)\n"
        "started = local.start(job, None, 'auto')\n"
        "pids = sorted(started.spares.pids)\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'ranks': len(pids), 'local': started.mode.local}))\n"
        "started.spares.close()\n"
    )
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")}  # no warm cluster of the user's
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"torch": False, "ranks": 2, "local": True}
