"""Every rank's environment, for each kind of job, on fixed inputs: the agent's environment without
Ray's variables, the user's shell's and the job's on top, its threads (torchrun's rule for a
script, its share of the agent's for a ctx or Lightning rank, the CPUs Ray would give in local
mode), its niceness, unbuffered output. The expected environments were recorded from the agent
before its launchers shared one recipe (agent/rank_env.py): a change to any rank's environment
shows here."""

from __future__ import annotations

import os

import pytest

from orchestrator.agent.children import Placement
from orchestrator.driver import local
from orchestrator.run_dir import RunDir
from orchestrator.spec import validate
from orchestrator.worker_config import LinkAddress, ScriptContext, WorkerConfig

# The agent's own environment (a Ray Train worker's): Ray's variables, Ray Train's process group's.
AGENT = {"PATH": "/usr/bin", "HOME": "/home/u", "RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_TOKEN": "secret",
         "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500",
         "ACCELERATE_TORCH_DEVICE": "cpu", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "8",
         "NCCL_DEBUG": "WARN", "PYTHONPATH": "/code"}
STORAGE = "/runs"


def _placement(k: int) -> Placement:
    return Placement(0, 1, k, "127.0.0.1", 29400, 1, 3, "envs")


def _script_job(env=None):
    return validate({"name": "envs", "storage": STORAGE, "env": env or {}, "script": {"path": "train.py"}},
                    check_imports=False)


def _session_job(env=None, cpus=None, workers=1):
    scaling = {"num_workers": workers, **({"resources_per_worker": {"CPU": cpus}} if cpus else {})}
    return validate({"name": "envs", "storage": STORAGE, "env": env or {}, "scaling": scaling,
                     "torch": {"train_loop": "jobs.digits_torch:train_loop", "max_steps": 5}}, read_only=True)


def _agent_env(monkeypatch, environ):
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)


def script_env(monkeypatch, job, shell, k, niceness=5):
    """A script's rank's environment, as its agent builds it for an attempt (rank_start.py)."""
    from orchestrator.agent.rank_start import RankStart

    _agent_env(monkeypatch, AGENT)
    context = ScriptContext(cwd="/", env=shell)
    return RankStart(job, context, RunDir.of(job.storage, job.name)).env(_placement(k), niceness)


def session_env(monkeypatch, tmp_path, job, k, environ=AGENT, niceness=5):
    """A ctx or Lightning rank's environment, as its agent builds it for an attempt (session_ranks.py)."""
    from orchestrator.agent.echo import Echo
    from orchestrator.agent.group import AgentGroup
    from orchestrator.agent.launcher import RankSetting
    from orchestrator.agent.session_ranks import Answers, SessionLauncher

    _agent_env(monkeypatch, environ)
    link = LinkAddress(str(tmp_path / "link"), b"key")
    config = WorkerConfig(spec=job, run_uri=f"{STORAGE}/envs", resume_uri=None, monitor=link, log_dir=None,
                          fence=None, storage_nonce=None, niceness=niceness)
    group = AgentGroup(0, 1, "node-a", "127.0.0.1", k, local=True)
    setting = RankSetting(config, group, str(tmp_path), str(tmp_path / "logs"), Echo(lambda output: None))
    launcher = SessionLauncher(setting, Answers(None, on_ray_train=False))
    try:
        env = launcher.env(_placement(k), in_place=False)
    finally:
        launcher.close()
    assert env.pop("ORCHESTRATOR_RANK_CONFIG") == str(tmp_path / "rank-config-1.pkl")
    return env


def first_ranks_env(monkeypatch, job, environ):
    """The environment a local run's first ranks import under (driver/local.py `first_spares`)."""
    _agent_env(monkeypatch, environ)
    return local.first_ranks_env(job, {})


KEPT = {"PATH": "/usr/bin", "HOME": "/home/u", "NCCL_DEBUG": "WARN", "PYTHONPATH": "/code"}
SCRIPT = {**KEPT, "ORCHESTRATOR_RUN_DIR": "/runs/envs", "ORCHESTRATOR_NICENESS": "5", "PYTHONUNBUFFERED": "1"}
SESSION = {**KEPT, "PYTHONUNBUFFERED": "1", "ORCHESTRATOR_DEVICE": "cpu", "ORCHESTRATOR_NODE_ID": "node-a",
           "ORCHESTRATOR_NICENESS": "5"}


@pytest.mark.parametrize("k, shell, job_env, threads", [
    (2, {}, {}, "1"),  # torchrun's rule: one thread a rank when a node runs more than one
    (1, {}, {}, None),  # one rank: the library's own default, not Ray's count for the worker
    (2, {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO"}, {}, "4"),  # the user's shell's
    (4, {}, {"OMP_NUM_THREADS": "3"}, "3"),  # the job's env
])
def test_a_scripts_rank_gets_torchruns_threads_unless_the_user_set_them(monkeypatch, k, shell, job_env, threads):
    env = script_env(monkeypatch, _script_job(job_env), shell, k)
    expected = {**SCRIPT, **shell, **job_env}
    if threads is not None:
        expected["OMP_NUM_THREADS"] = threads
    assert env == expected


def test_a_scripts_rank_keeps_an_unbuffered_output_the_user_chose(monkeypatch):
    env = script_env(monkeypatch, _script_job({"PYTHONUNBUFFERED": "x"}), {}, 1)
    assert env["PYTHONUNBUFFERED"] == "x"


@pytest.mark.parametrize("k, job_env, environ, threads", [
    (3, {}, AGENT, "2"),  # its share of the agent's 8 (Ray Train's rule for the worker's CPUs)
    (16, {}, AGENT, "1"),  # never fewer than one
    (2, {"OMP_NUM_THREADS": "5"}, AGENT, "5"),  # the job's env
    (2, {}, {k: v for k, v in AGENT.items() if k != "OMP_NUM_THREADS"}, None),  # the agent has no count
])
def test_a_session_rank_gets_its_share_of_the_agents_threads(monkeypatch, tmp_path, k, job_env, environ, threads):
    env = session_env(monkeypatch, tmp_path, _session_job(job_env), k, environ)
    expected = {**SESSION, **job_env}
    if threads is not None:
        expected["OMP_NUM_THREADS"] = threads
    assert env == expected


def test_a_session_ranks_output_is_unbuffered_whatever_the_job_says(monkeypatch, tmp_path):
    env = session_env(monkeypatch, tmp_path, _session_job({"PYTHONUNBUFFERED": "x"}), 1)
    assert env["PYTHONUNBUFFERED"] == "1"


@pytest.mark.parametrize("cpus, workers, shell_threads, threads", [
    (2, 2, None, "2"),  # Ray would give 2 CPUs to each of 2 workers: 4 threads for their 2 ranks
    (4, 2, None, "4"),  # 8 threads, 2 ranks
    (4, 1, "6", "6"),  # the user's shell's count is the agent's
])
def test_a_local_runs_first_ranks_import_under_the_threads_their_attempt_gives(monkeypatch, tmp_path, cpus, workers,
                                                                                 shell_threads, threads):
    job = _session_job(cpus=cpus, workers=workers)
    environ = {k: v for k, v in AGENT.items() if k != "OMP_NUM_THREADS"}
    if shell_threads:
        environ["OMP_NUM_THREADS"] = shell_threads
    first = first_ranks_env(monkeypatch, job, environ)
    # The agent's process, as local.session makes it, then the attempt's environment.
    ranks = job.scaling.num_workers * job.ranks_per_worker
    attempt = session_env(monkeypatch, tmp_path, job, ranks, {**environ, **local._agent_env(job, {})})
    assert first["OMP_NUM_THREADS"] == attempt["OMP_NUM_THREADS"] == threads
    assert first == {k: v for k, v in attempt.items() if k in first}
    assert set(attempt) - set(first) == {"ORCHESTRATOR_DEVICE", "ORCHESTRATOR_NODE_ID", "ORCHESTRATOR_NICENESS"}
