"""The bootstrap (rank/script/bootstrap.py) on real scripts, as every rank child runs it: its
measure of a rank's own work a step (_StepWork: from the end of one optimizer step to the end of
the next forward, the loss included; what follows the forward, the backward where a DDP rank
waits for its peers, is not), and a spare's share of the CPUs while it waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.agent.children import BOOTSTRAP
from orchestrator.rank.script.bootstrap import BEAT, BEAT_FILE_VAR

LOADING_S, AFTER_FORWARD_S = 0.03, 0.06


def test_a_ranks_own_work_is_its_batch_forward_and_loss_and_not_what_follows(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
        "loss_fn = torch.nn.MSELoss()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(24):\n"
        f"    time.sleep({LOADING_S})  # loading the batch: the rank's own work\n"
        "    x, y = torch.randn(4, 8), torch.randn(4, 1)\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        f"    time.sleep({AFTER_FORWARD_S})  # after the forward: where a DDP rank would wait\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n")
    beat = tmp_path / "beat"
    done = subprocess.run([sys.executable, BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, BEAT_FILE_VAR: str(beat)})
    assert done.returncode == 0, done.stderr
    steps, _, step_time, _, work = BEAT.unpack(beat.read_bytes()[:BEAT.size])
    assert steps == 24
    # Slack above for a busy machine's late wake-ups; never the AFTER_FORWARD_S that follows.
    assert LOADING_S <= work < LOADING_S + AFTER_FORWARD_S / 2, (work, step_time)
    assert step_time >= LOADING_S + AFTER_FORWARD_S


def _session_niceness(pid: int) -> int:
    with open(f"/proc/{pid}/autogroup") as f:  # "/autogroup-123 nice 19"
        return int(f.read().split()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="this kernel has no scheduler autogroups")
def test_a_waiting_spare_yields_the_cpus_as_a_session_and_a_handed_one_takes_its_share_back(tmp_path):
    """A spare is a session of its own; where Linux's scheduler shares the CPUs between sessions
    first (autogroups), its own niceness 19 weighs nothing against the ranks' sessions: the
    session's niceness must be 19 too, or the spare takes a full share from the training beside it."""
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"import os\nopen({str(marker)!r}, 'w').write(open('/proc/self/autogroup').read())\n")
    spare = subprocess.Popen([sys.executable, BOOTSTRAP, "--spare", "json", str(script)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        deadline = time.monotonic() + 30
        while _session_niceness(spare.pid) != 19 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _session_niceness(spare.pid) == 19
        if os.getpriority(os.PRIO_PROCESS, 0) == 0 and os.geteuid() == 0:  # it may take niceness 0 back
            env = {**os.environ, BEAT_FILE_VAR: str(tmp_path / "beat")}
            spare.stdin.write(json.dumps(env) + "\n")
            spare.stdin.close()
            assert spare.wait(timeout=60) == 0, spare.stdout.read()
            assert marker.read_text().split()[-1] == "0"
    finally:
        spare.kill()
        spare.wait()
        spare.stdout.close()
