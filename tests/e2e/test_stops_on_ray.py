"""A SIGTERM'd `orchestrator run` on Ray, as a user's shell or a scheduler sends it, with the run's
storage on an S3 server (moto, on loopback) that the Ray workers write: the stop checkpoint is
committed there and verifies, the command exits 143, and the same command resumes from it to the
clean run's weights (docs/failures.md, "Stopping a run"; docs/checkpoints.md, `storage:` a
pyarrow.fs URI). The same run has rank 1 slowed by half in its own work a step: it is named a
straggler on Ray as in local mode (docs/failures.md, "Stragglers": on every path; the local runs
are in test_straggler_runs.py).

The runs join the session's warm cluster (`orchestrator up`), started with the S3 server's
credentials in its nodes' environment, as a user exports them before `up`: Ray Train's controller
writes its own files under `storage:` with the nodes' credentials (docs/cluster.md, "Secrets in
env:")."""

from __future__ import annotations

import json
import signal
import socket
import uuid

import pyarrow.fs as pafs
import pytest
from cli_runs import run_spec
from conftest import run_cli, wait_for
from signalled_runs import SignalledRun
from specs import STEPS_PER_EPOCH, torch_spec

pytestmark = pytest.mark.slow

# Rank 0 holds after this step until the stop reaches it: the stop comes mid-run however slow the
# machine, and the straggler window (STRAGGLER_AFTER_S) has passed long before (50 steps of at
# least 0.15 s).
HOLD_AT = 50
STRAGGLER_AFTER_S = 3.0


@pytest.fixture
def warm_cluster_with_s3_credentials(warm_cluster, s3_server):
    """The session's warm cluster, whose nodes have the S3 server's credentials (conftest's
    `_warm_record`), and the server's URI prefix."""
    return s3_server


def _read(uri: str) -> bytes:
    """A file of the run on S3, read with pyarrow itself (not the orchestrator's storage layer)."""
    fs, path = pafs.FileSystem.from_uri(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


@pytest.mark.timeout(600)
def test_a_sigtermed_run_on_ray_with_s3_storage_names_its_straggler_commits_a_stop_checkpoint_there_exits_143_and_resumes_to_the_clean_weights(
        tmp_path, warm_cluster_with_s3_credentials, clean_torch):
    storage_uri = warm_cluster_with_s3_credentials.format(prefix=f"stops-{uuid.uuid4().hex[:8]}")
    run_uri = storage_uri.replace("?", "/stopped-on-s3?", 1)
    marker = tmp_path / f"at-step-{HOLD_AT}"
    spec = torch_spec("stopped-on-s3", storage_uri, loop="paced_digits:train_loop", sleep_s=0.1, slow_rank=1,
                      slow_factor=1.5, marker=str(marker), mark_at=HOLD_AT, hold_s=300)
    spec["failure"]["straggler_after_s"] = STRAGGLER_AFTER_S
    run = SignalledRun(spec, str(tmp_path))
    try:
        warning = run.line(lambda line: "is a straggler" in line, timeout=300)
        wait_for(lambda: marker.exists() or run.process.poll() is not None, timeout=240)
        assert run.process.poll() is None, "the run ended before it could be stopped:\n" + "\n".join(run.lines[-40:])
        run.send(signal.SIGTERM)
        code, output = run.finish(timeout=240)
    finally:
        run.kill()
    assert run.first_line().startswith("on Ray"), output[:2000]
    assert code == 143, output[-4000:]
    assert "stopped by SIGTERM after step" in output, output[-4000:]
    # The straggler, named on Ray with its node and host, once, while the run went on.
    assert sum("is a straggler" in line for line in output.splitlines()) == 1, output[-4000:]
    assert warning.startswith("warning: rank 1 (node ") and f"host {socket.gethostname()}" in warning, warning

    # The stop checkpoint, on S3: the newest committed (its manifest uploaded last, the commit), at
    # or after the held step, and whole: `orchestrator checkpoints --verify` re-reads every file.
    summary = json.loads(_read(run_uri.replace("?", "/summary.json?", 1)))
    assert summary["status"] == "stopped", summary
    newest = summary["final_checkpoint"]
    assert newest.startswith("s3://") and "/stopped-on-s3/checkpoints/step-" in newest, newest
    manifest = json.loads(_read(newest.replace("?", "/manifest.json?", 1)))  # (the URI names the server)
    assert manifest["reason"] == "stop" and HOLD_AT <= manifest["step"] < 3 * STEPS_PER_EPOCH, manifest
    verified = run_cli("checkpoints", "stopped-on-s3", "--storage", storage_uri, "--verify", timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"step-{manifest['step']:09d}" in verified.stdout, verified.stdout
    [straggler] = summary["stragglers"]
    assert straggler["rank"] == 1 and straggler["host"] == socket.gethostname(), straggler
    assert 1.3 <= straggler["ratio"] < 2.5, straggler

    # The same command resumes from the stop checkpoint, on S3 again, to the clean run's weights.
    lines: list[str] = []
    resumed = run_spec(spec, str(tmp_path), lines=lines)
    assert lines[0].startswith("on Ray"), lines[:3]
    assert resumed.resumed_from["uri"] == newest and resumed.resumed_from["step"] == manifest["step"], resumed
    assert resumed.final_checkpoint.startswith("s3://") and resumed.global_step == clean_torch.global_step
    assert resumed.weights_sha256 == clean_torch.weights_sha256
