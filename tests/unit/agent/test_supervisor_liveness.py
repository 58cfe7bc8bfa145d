"""How a torchrun script's ranks are judged alive (no Ray): a rank that finished is finished, a
rank that never steps an optimizer is judged by its Python stack and CPU time, and one rank at
work keeps its waiting peers from a hang verdict; a frozen group is still caught."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from conftest import wait_for

from orchestrator.agent.children import BOOTSTRAP, LocalRanks, Placement
from orchestrator.monitor.watchdog import HangWatchdog
from orchestrator.protocol import Beat
from orchestrator.rank.heartbeat import FINISHED, WORKING

LIMIT = 10.0


def _script(rank, step, phase="training", idle=0.0, stack_idle=0.0, active_idle=0.0):
    """A script rank's beat: `idle` since its last step, `stack_idle` since its stack moved,
    `active_idle` since any sign of life (a step, its stack, its CPU)."""
    return Beat(rank=rank, step=step, phase=phase, idle_s=idle, node_id=f"node-{rank}", pid=100 + rank,
                stack_idle_s=stack_idle, active_idle_s=active_idle)


def _dog(world_size=2) -> HangWatchdog:
    dog = HangWatchdog(hang_timeout_s=LIMIT, phase_limits={"starting": 30.0})
    dog.new_attempt(1, world_size=world_size, now=0)
    return dog


def test_a_rank_that_exited_0_is_finished_while_its_peer_works_alone_past_the_timeout():
    """Rank 1 finished after 5 steps; rank 0 evaluates, saves, uploads for 25 s: no verdict."""
    dog = _dog()
    for t in range(0, 26):
        assert dog.observe(1, _script(1, 5, FINISHED), now=t) is None
        # Rank 0 stepped before, and takes no step now; its stack and CPU show it at work.
        assert dog.observe(1, _script(0, 5, idle=t, stack_idle=0.5, active_idle=0.5), now=t) is None


def test_a_finished_ranks_silence_is_no_hang_but_its_peers_freeze_still_is():
    dog = _dog()
    dog.observe(1, _script(1, 5, FINISHED), now=0)  # its agent sends no more beats for it
    for t in range(1, 11):
        assert dog.observe(1, _script(0, 5, idle=t, stack_idle=t, active_idle=t), now=t) is None
    verdict = dog.observe(1, _script(0, 5, idle=11, stack_idle=11, active_idle=11), now=11)
    assert verdict.ranks == [0] and "no CPU time" in verdict.what
    assert "rank 1 at step 5 (finished)" in verdict.message


def test_a_script_that_never_steps_is_not_held_to_the_startup_limit_while_it_works():
    """An evaluation script: no optimizer, an hour of work, its stack and CPU moving."""
    dog = _dog()
    for t in range(0, 3600):
        for rank in (0, 1):
            assert dog.observe(1, _script(rank, 0, WORKING, idle=t, stack_idle=1, active_idle=1), now=t) is None


def test_one_rank_at_work_keeps_its_waiting_peers_from_a_verdict_and_a_frozen_group_is_caught():
    dog = _dog()
    # Rank 1 waits in a barrier (frozen); rank 0 preprocesses (its CPU busy in C: no stack move).
    for t in range(0, 60):
        assert dog.observe(1, _script(1, 0, WORKING, idle=t, stack_idle=t, active_idle=t), now=t) is None
        assert dog.observe(1, _script(0, 0, WORKING, idle=t, stack_idle=t, active_idle=0.5), now=t) is None
    # Then rank 0 freezes too: both still for longer than the timeout.
    for t in range(60, 71):
        assert dog.observe(1, _script(0, 0, WORKING, idle=t, stack_idle=t, active_idle=t - 60), now=t) is None
        dog.observe(1, _script(1, 0, WORKING, idle=t, stack_idle=t, active_idle=t), now=t)
    verdict = dog.observe(1, _script(0, 0, WORKING, idle=71, stack_idle=71, active_idle=11), now=71)
    assert verdict is not None and verdict.ranks == [0, 1]
    assert verdict.what.startswith("made no progress (no optimizer step, no move of its Python stack")


def test_stepping_ranks_that_stop_stepping_are_hung_unless_a_ranks_stack_moves():
    """A rank spinning in an NCCL collective uses CPU without progress: for ranks that step, with
    every peer running, only a step or a stack move counts."""
    dog = _dog()
    for t in range(0, 12):  # rank 0 evaluates (its stack moves); rank 1 waits for it, spinning
        assert dog.observe(1, _script(0, 40, idle=t, stack_idle=0.5, active_idle=0.1), now=t) is None
        assert dog.observe(1, _script(1, 40, idle=t, stack_idle=t, active_idle=0.1), now=t) is None
    # Rank 0's stack stops moving too, its CPU still busy: a collective that never completes.
    dog.observe(1, _script(0, 40, idle=13, stack_idle=10.5, active_idle=0.1), now=13)
    verdict = dog.observe(1, _script(1, 40, idle=13, stack_idle=13, active_idle=0.1), now=13)
    assert verdict.ranks == [0, 1] and verdict.what == (
        "made no progress (no optimizer step, no move of its Python stack)")


def test_a_stopped_rank_of_a_script_that_never_steps_is_caught_by_its_silence():
    dog = _dog()
    dog.observe(1, _script(1, 0, WORKING, active_idle=0.2), now=0)  # then SIGSTOPped: no more beats
    for t in range(1, 11):
        assert dog.observe(1, _script(0, 0, WORKING, idle=t, stack_idle=t, active_idle=t), now=t) is None
    verdict = dog.observe(1, _script(0, 0, WORKING, idle=11, stack_idle=11, active_idle=11), now=10.5)
    assert verdict.what == "stopped answering" and verdict.ranks == [1]


def test_when_every_rank_is_silent_no_verdict_is_given():
    """Nobody beats (the whole node is gone, or the monitor's calls stall): nothing to tell from
    here; Ray's own health check takes over."""
    dog = HangWatchdog(hang_timeout_s=LIMIT)
    dog.new_attempt(1, world_size=2, now=0)
    dog.observe(1, Beat(0, 3, "training", 0.0), now=0)
    dog.observe(1, Beat(1, 3, "training", 0.0), now=0)
    assert dog.check(now=100) is None and dog.verdict is None


# --- the bootstrap's liveness -------------------------------------------------------------------


def _beat_file(path) -> tuple[int, float, float, float]:
    with open(path, "rb") as f:
        return struct.unpack("<qddd", f.read(32))


def test_the_bootstrap_notes_when_the_main_threads_stack_last_moved_and_times_steps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "p = torch.nn.Parameter(torch.zeros(1))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "for _ in range(6):\n"
        "    opt.step()\n"
        "    time.sleep(0.05)\n"
        "print('stepped', flush=True)\n"
        "end = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n"
        "    sum(range(1000))\n"
        "print('frozen', flush=True)\n"
        "time.sleep(60)\n")
    beat = tmp_path / "beat"
    process = subprocess.Popen([sys.executable, BOOTSTRAP, str(script)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "ORCHESTRATOR_BEAT_FILE": str(beat)})
    try:
        assert process.stdout.readline().strip() == "stepped"
        steps, _, step_time, _ = _beat_file(beat)
        assert steps == 6 and 0.04 < step_time < 1.0
        time.sleep(2.5)  # the loop: its stack moves at every look
        assert time.monotonic() - _beat_file(beat)[3] < 2.5
        assert process.stdout.readline().strip() == "frozen"
        time.sleep(3.5)  # asleep in one call: its stack does not move
        assert time.monotonic() - _beat_file(beat)[3] > 2.0
    finally:
        process.kill()
        process.wait()


@pytest.mark.timeout(60)
def test_the_agent_reads_a_ranks_steps_step_time_and_stack_from_its_beat_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "p = torch.nn.Parameter(torch.zeros(1))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "for _ in range(4):\n"
        "    opt.step()\n"
        "    time.sleep(0.1)\n"
        "time.sleep(60)\n")
    placement = Placement(group_rank=0, group_world_size=1, local_world_size=1, master_addr="127.0.0.1",
                          master_port=29500, attempt=1, max_restarts=0, run_id="live")
    ranks = LocalRanks([str(script)], cwd=str(tmp_path), base_env=dict(os.environ), placement=placement,
                       scratch=str(tmp_path / "scratch"), log_dir=str(tmp_path / "logs"))
    try:
        progress = wait_for(lambda: (p := ranks.children[0].progress()).steps == 4 and p, timeout=30)
        assert 0.08 < progress.step_time_s < 1.0
        time.sleep(3)
        assert ranks.children[0].progress().stack_idle_s > 1.5
    finally:
        ranks.stop()
