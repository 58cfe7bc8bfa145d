"""A second SIGTERM stops at once (orchestrator/driver/signals.py; docs/failures.md, "Stopping a
run"): the first asks the workers for a stop checkpoint within the grace; the second, while they
are still at it, ends the run then and there: exit 143, the ranks ended, and nothing already
committed touched.

The run is a real `orchestrator run` of the digits ctx job, in local mode (one node: its first line
says so) and on the session's warm Ray cluster (Ray Train's workers as the agents), whose rank 0 holds one step for far longer than the grace and hears no stop, so that
only the second signal can end the run before the grace runs out.
"""

from __future__ import annotations

import signal
import time

import pytest
from conftest import wait_for
from signalled_runs import SignalledRun
from specs import torch_spec

from orchestrator import storage
from orchestrator.checkpoint import CheckpointStore
from orchestrator.processes import is_alive

# Far longer than the run could take to end after the second signal, however loaded the machine.
GRACE_S = 240
HOLD_S = 600
# Seconds the command may take to end after the second SIGTERM: the driver stops waiting within
# its next poll (0.2 s), then writes its summary and ends its ranks (SIGKILL 2 s after SIGTERM).
AT_ONCE_S = 60
# Seconds the first SIGTERM alone is watched not to end the run.
FIRST_ALONE_S = 3
HOLD_AT = 12  # after the checkpoint of step 10 (every_n_steps: 10)


@pytest.mark.timeout(400)
@pytest.mark.slow  # a real run on each path (the local one too, as the suite's other local runs)
@pytest.mark.parametrize("path", ["local", "ray"])
def test_a_second_sigterm_ends_a_stopping_run_at_once_with_exit_143_keeping_what_was_committed(
        tmp_path, monkeypatch, request, path):
    if path == "ray":
        request.getfixturevalue("warm_cluster")  # the run joins it, as after `orchestrator up`
    monkeypatch.setenv("ORCHESTRATOR_STOP_GRACE_S", str(GRACE_S))
    marker, pids = tmp_path / "holding", tmp_path / "pids"
    pids.mkdir()
    spec = torch_spec("twice", tmp_path, loop="held_step:train_loop", hold_at=HOLD_AT, hold_s=HOLD_S,
                      marker=str(marker), pids_dir=str(pids))
    run = SignalledRun(spec, str(tmp_path))
    try:
        wait_for(lambda: marker.exists() or run.process.poll() is not None, timeout=240, interval=0.2)
        assert run.process.poll() is None, "the run ended before it could be stopped:\n" + "\n".join(run.lines[-40:])
        run.send(signal.SIGTERM)
        requested = run.line(lambda line: line.startswith("stop requested:"), timeout=60)
        time.sleep(FIRST_ALONE_S)
        assert run.process.poll() is None, "the first SIGTERM alone ended the run:\n" + "\n".join(run.lines[-40:])
        second = time.monotonic()
        run.send(signal.SIGTERM)
        code, output = run.finish(timeout=AT_ONCE_S)  # an AssertionError with its output if it does not end
        took = time.monotonic() - second
    finally:
        run.kill()

    first = next(line for line in output.splitlines() if not line.startswith("run name: "))
    assert first.startswith("local mode: one node, 2 rank(s)" if path == "local" else "on Ray"), output[:2000]
    assert f"grace {GRACE_S:.1f} s; signal again to stop at once" in requested, requested
    assert code == 143, output[-4000:]
    assert took < AT_ONCE_S, took
    assert "run 'twice' stopped by SIGTERM after step" in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    # The ranks were ended, rank 0 in the middle of its held step.
    ranks = [int(path.read_text()) for path in sorted(pids.glob("rank-*.pid"))]
    assert len(ranks) == 2, ranks
    wait_for(lambda: not any(is_alive(pid) for pid in ranks), timeout=30)
    # No stop checkpoint (the workers never reached a step to take it at), and the one committed
    # before the stop is there, whole: the newest, and it verifies.
    store = CheckpointStore(storage.resolve(str(tmp_path / "twice")))
    committed = store.committed()
    assert [(i.step, i.manifest.reason) for i in committed] == [(10, "steps")], committed
    assert store.verify(committed[-1]).status == "committed"
    assert f"the newest committed checkpoint is {committed[-1].uri}" in output, output[-4000:]
