"""The driver of a run on Ray, taken over (docs/checkpoints.md, "One writer per run"). A driver
that stood still (SIGSTOPped) for longer than the lease's TTL, taken over by a driver of another
host (a UTS namespace with its own hostname, which cannot check the first one's pid): once it goes
on, its next heartbeat tells it, it says so, ends its workers and exits 1 without touching
summary.json, while the new driver ends the run with the clean weights. The runs join the
session's warm cluster. (A SIGKILLed driver on Ray, `driver died` and the same command taking it
over: tests/e2e/test_cli.py.)"""

from __future__ import annotations

import json
import signal

import pytest
from conftest import run_cli, wait_for
from signalled_runs import SignalledRun, another_host
from specs import torch_spec

from orchestrator.checkpoint.lease import LEASE_TTL_S

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_cluster")]


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie has: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.timeout(600)
def test_a_driver_on_ray_taken_over_by_another_hosts_driver_learns_it_at_its_next_heartbeat_ends_its_workers_and_exits_1(
        tmp_path, clean_torch):
    prefix = another_host("other-host")
    if prefix is None:
        pytest.skip("no UTS namespace can be made here (unshare missing, or not allowed)")
    marker, pids = tmp_path / "at-step-12", tmp_path / "pids"
    pids.mkdir()
    # Rank 0 holds after step 12 (after the step-10 checkpoint) until the run's stop: no commit
    # comes after it, so only the driver's heartbeat can find the takeover. The hang timeout is
    # longer than the hold, which is not what is tested here.
    spec = torch_spec("taken-over", tmp_path / "runs", loop="paced_digits:train_loop", sleep_s=0.02, mark_at=12,
                      marker=str(marker), hold_s=500, pids_dir=str(pids))
    spec["failure"]["hang_timeout_s"] = 500
    run_dir = tmp_path / "runs" / "taken-over"
    first = SignalledRun(spec, str(tmp_path))
    second = None
    try:
        wait_for(lambda: marker.exists() or first.process.poll() is not None, timeout=300)
        assert first.process.poll() is None, "\n".join(first.lines[-40:])
        workers = [json.loads(path.read_text()) for path in pids.iterdir()]
        assert sorted(w["rank"] for w in workers) == [0, 1], workers
        processes = [w[key] for w in workers for key in ("pid", "ppid")]  # each rank and its agent
        assert not any(_gone(pid) for pid in processes), workers
        # The first driver stands still: its heartbeat too. The same command on another host
        # watches that heartbeat for the lease's TTL, then takes the run over (generation 2).
        first.send(signal.SIGSTOP)
        second = SignalledRun(spec, str(tmp_path), prefix=prefix)
        watching = second.line(lambda line: "watching its heartbeat" in line, timeout=180)
        assert "generation 1" in watching and f"pid {first.process.pid}" in watching, watching
        wait_for((run_dir / "leases" / f"{2:09d}").exists, timeout=LEASE_TTL_S + 120)
        first.send(signal.SIGCONT)
        code, output = first.finish(timeout=120)
        # Its workers are ended (every rank and its agent), and summary.json is not its to write.
        assert not (run_dir / "summary.json").exists(), (run_dir / "summary.json").read_text()
        wait_for(lambda: all(_gone(pid) for pid in processes), timeout=60)
        new_code, new_output = second.finish(timeout=400)
    finally:
        first.kill()  # (a stopped process is SIGKILLed all the same)
        if second is not None:
            second.kill()
    assert first.first_line().startswith("on Ray"), output[:2000]
    assert "run 'taken-over' was taken over by another driver: ending this driver's workers now" in output, output
    assert code == 1 and "Traceback" not in output, output[-4000:]
    assert "another driver took the run over" in output and "generation 2 now holds it (host other-host" in output, output
    assert new_code == 0 and second.first_line().startswith("on Ray"), new_output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"]["step"] == 10 and summary["weights_sha256"] == clean_torch.weights_sha256, summary
