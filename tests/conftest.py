"""Shared fixtures. Tests that start Ray are marked `slow`; each one cleans up its own processes.

The suite runs on every core with pytest -n (the README's command): each xdist worker has its own
warm cluster and S3 server, the clean runs are run once for all workers, and the tests that start
loopback clusters in the test process stay on one worker (IN_PROCESS_CLUSTERS). Whatever a test
checks of the machine (scratch folders, Ray processes) is its own run's, found by its own folder
or session, never by a machine-wide listing that a test beside it would change.

What every test gets here is state of its own, no setting of Ray's or the orchestrator's: the
autouse fixture `_isolated_state` gives it an empty state folder (ORCHESTRATOR_STATE_DIR, where
`orchestrator up` records the warm cluster), a data cache of its own (ORCHESTRATOR_DATA_DIR) and
the repository as its working directory, so that no warm cluster is found (neither a user's nor
another test's) and a one-node run in auto mode goes local, whatever else is up on the machine;
`s3_server` adds the loopback server's credentials to its environment. Otherwise the tests run the
product in the environment a user's shell has. Tests whose point is a run on one node run it as a
user's first command does, in local mode (no cluster named or up: driver/local.py), which costs no
Ray process at all; tests of the Ray path on one node (its agents as Ray Train workers,
its dashboard, its jobs) ask for `warm_cluster`: their runs join one warm local cluster
(`orchestrator up`) for the session. Every Ray node a test starts is on loopback because the product puts its own
clusters there (orchestrator/cluster/environment.py) and the tests' own clusters name 127.0.0.1 as
their node address.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from clusters import shared_loopback_cluster, three_nodes, uses_shared_cluster  # noqa: F401  (fixtures)

from orchestrator.cluster.warm import RECORD_NAME  # where `orchestrator up` records its cluster

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The tests that start loopback clusters in the test process (ray.cluster_utils.Cluster), by
# nodeid prefix. Under pytest -n they run on one worker, one after another: the shared cluster
# (tests/helpers/clusters.py) is started once for them, and no two clusters with Ray's fixed default
# ports (the dashboard's) run at once.
IN_PROCESS_CLUSTERS = (
    "tests/e2e/test_elastic.py::",
    "tests/e2e/test_node_loss.py::",
    "tests/e2e/test_placement.py::",
    "tests/unit/cli/test_doctor_checks.py::test_doctor_",
    "tests/e2e/test_torchrun.py::test_two_nodes_of_two_ranks",
    "tests/e2e/test_preemptions_used_up.py::",
)


def pytest_collection_modifyitems(config, items):
    """The slow tests come before the fast ones, so that under pytest -n a worker's last tests
    are short ones and neither waits long on the other at the end; the tests on the shared
    loopback cluster come last, together, so that one process running the whole suite does not
    keep the cluster idle beside the others (under -n they are one unit of work, which goes
    first). Every test on the shared loopback cluster must be listed in IN_PROCESS_CLUSTERS."""
    for item in items:
        if uses_shared_cluster(item) and not item.nodeid.startswith(IN_PROCESS_CLUSTERS):
            raise pytest.UsageError(f"{item.nodeid} uses the shared loopback cluster: add it to "
                                    "IN_PROCESS_CLUSTERS in tests/conftest.py, so that pytest -n keeps it on one worker")
    items.sort(key=lambda item: (uses_shared_cluster(item), item.get_closest_marker("slow") is None))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest -n: xdist's load scheduling, with the tests of IN_PROCESS_CLUSTERS as one unit of
    work (one worker, in turn). The biggest units go first, so that unit starts at once, and the
    rest, one test a unit, go to whichever worker is free, in the order above."""
    from xdist.scheduler import LoadScopeScheduling

    class InProcessClustersOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "in-process clusters" if nodeid.startswith(IN_PROCESS_CLUSTERS) else nodeid

    return InProcessClustersOnOneWorker(config, log)


def _private_state(patch: pytest.MonkeyPatch, make_dir) -> None:
    """Keep the embedded-cluster records and the digits Parquet cache private (in folders
    `make_dir(name)` gives), and work from the repository as a user of its jobs/ does."""
    patch.setenv("ORCHESTRATOR_STATE_DIR", str(make_dir("state")))
    patch.setenv("ORCHESTRATOR_DATA_DIR", os.environ.get("ORCHESTRATOR_TEST_DATA_DIR", str(make_dir("data"))))
    patch.chdir(REPO)


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    """Each test's own state, data cache and working directory."""
    _private_state(monkeypatch, lambda name: tmp_path / name)
    yield


@contextlib.contextmanager
def isolated_state(tmp_path_factory, warm_record: str | None = None):
    """The same for a module or session fixture, which pytest sets up before (outside) the
    settings of the test that first asks for it; with `warm_record` (the `_warm_record` fixture),
    its runs join the session's warm cluster as a `warm_cluster` test's do."""
    with pytest.MonkeyPatch.context() as patch:
        _private_state(patch, tmp_path_factory.mktemp)
        if warm_record is not None:
            join_warm_cluster(warm_record)
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def _s3_endpoint():
    """A real S3-protocol server (moto) on loopback, with the bucket `runs`, for the session."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
                 aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket="runs")
    yield f"s3://runs/{{prefix}}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    server.stop()


@pytest.fixture
def s3_server(_s3_endpoint, monkeypatch):
    """A URI prefix pyarrow.fs can open on the loopback S3 server. The credentials are in this
    test's environment alone, as a user exports them in the shell that runs the command (a
    cluster the test starts inherits them, as it would there)."""
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    return _s3_endpoint


def run_cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


@pytest.fixture
def run_temp_dir(tmp_path) -> str:
    """A temp dir of the test's own for its runs' workers: a spec that names it as `TMPDIR` in its
    `env` gets every worker's temp files there (Python's tempfile, and so the orchestrator's
    scratch, follows TMPDIR), so what a run leaves behind is its own, whatever other tests run
    beside it (pytest -n)."""
    folder = tmp_path / "temp"
    folder.mkdir()
    return str(folder)


def scratch_in(folder: str) -> set[str]:
    """The orchestrator's folders in a temp dir (workers' scratch, resume copies)."""
    return {n for n in os.listdir(folder) if n.startswith("orchestrator-")}


def assert_resumed_to_clean_weights(killed, clean, marker, kill_step: int) -> None:
    """A run killed once at `kill_step` (its fault wrote `marker`) ended exactly where the clean run did."""
    assert os.path.exists(marker), "the fault was never injected"
    assert killed.restarts == 1, f"kill at step {kill_step}"
    assert killed.global_step == clean.global_step
    assert killed.weights_sha256 == clean.weights_sha256, f"kill at step {kill_step}"


def wait_for(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s")


@pytest.fixture(scope="session")
def _warm_record(tmp_path_factory):
    """One warm local cluster (`orchestrator up`) for the session, started as a user starts it, in
    a state folder of its own; the path of its record. `orchestrator down` ends it with the session."""
    # The nodes get the loopback S3 server's credentials, as a cluster's nodes get theirs from an
    # instance role or the shell that ran `up`: Ray Train's controller writes its own files under an
    # s3:// `storage:` with the nodes' environment (docs/cluster.md, "Secrets in env:").
    env = {"ORCHESTRATOR_STATE_DIR": str(tmp_path_factory.mktemp("warm-state")),
           "ORCHESTRATOR_DATA_DIR": os.environ.get("ORCHESTRATOR_TEST_DATA_DIR", str(tmp_path_factory.mktemp("warm-data"))),
           **S3_CREDENTIALS}
    started = run_cli("up", env=env, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    yield os.path.join(env["ORCHESTRATOR_STATE_DIR"], RECORD_NAME)
    stopped = run_cli("down", env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def join_warm_cluster(record: str) -> None:
    """Runs from now on join the session's warm cluster: its record is put in the state folder
    they read, where `orchestrator up` leaves it for a user."""
    state = os.environ["ORCHESTRATOR_STATE_DIR"]
    os.makedirs(state, exist_ok=True)
    shutil.copy(record, os.path.join(state, RECORD_NAME))


@pytest.fixture
def warm_cluster(_warm_record):
    """This test's runs join the session's warm local cluster, as a user's do after `orchestrator
    up`, instead of each starting and stopping an embedded one (3-5 s a run here). For tests whose
    point is the run, not how its cluster starts: the embedded path keeps tests of its own
    (test_cli, test_warm, and every other test that does not ask for this).

    Such a test runs its jobs through the command line (cli_runs.run_spec), as a user's shell
    does: a driver in the test process could not join a loopback cluster once anything in the
    session imported Ray before the orchestrator (orchestrator.run refuses, saying so)."""
    join_warm_cluster(_warm_record)


def _once_for_the_session(tmp_path_factory, name: str, _warm_record: str, spec_of):
    """The RunResult of the run `spec_of(name, storage)`, run once for the whole session: under
    pytest -n, the first worker to ask runs it (on its own warm cluster) while any other that asks
    waits on a lock, then reads the same run's summary. A run that failed is run again by the
    next worker to ask, so each one's test sees the failure itself."""
    from cli_runs import run_spec

    from orchestrator import storage as storages
    from orchestrator.observe.result import RunResult

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder every worker's basetemp is in
    folder = shared / f"session-{name}"
    with open(shared / f"session-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, whatever happens
        done = RunResult.load(storages.resolve(str(folder)).join("clean"))
        if done is not None and done.status == "finished":
            return done
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        with isolated_state(tmp_path_factory, _warm_record):
            return run_spec(spec_of("clean", folder), str(folder))


@pytest.fixture(scope="session")
def clean_torch(tmp_path_factory, _warm_record):
    """The uninterrupted torch run (specs.torch_spec) every interrupted one is compared with."""
    from specs import torch_spec

    return _once_for_the_session(tmp_path_factory, "clean-torch", _warm_record, torch_spec)


@pytest.fixture(scope="session")
def clean_lightning(tmp_path_factory, _warm_record):
    """The uninterrupted Lightning run (specs.lightning_spec) every interrupted one is compared with."""
    from specs import lightning_spec

    return _once_for_the_session(tmp_path_factory, "clean-lightning", _warm_record, lightning_spec)


@pytest.fixture(scope="session")
def plain_torchrun(tmp_path_factory) -> dict:
    """The seed script's clean run under plain torchrun (seed_runs.py): the weights every run of it
    through the orchestrator must end with."""
    from seed_runs import plain_torchrun_weights

    return plain_torchrun_weights(str(tmp_path_factory.mktemp("plain") / "work"))


@pytest.fixture
def small_filesystem(tmp_path):
    """A real 3 MB filesystem (tmpfs) for full-disk tests, where mounting is allowed (root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)
