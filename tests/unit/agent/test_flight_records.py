"""torch's flight recorder taken from real ranks: two processes of a gloo group under the
bootstrap, one waiting in an all-reduce its peer never enters; the agent asks both for their
dumps (agent/flight_records.py), keeps them beside the logs, and the comparison names the rank
that never entered (monitor/collectives.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from orchestrator.agent import flight_records
from orchestrator.agent.children import BOOTSTRAP, Child
from orchestrator.monitor.collectives import odd_ranks

SCRIPT = """
import os, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=os.environ["INIT"])
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
open(os.environ["READY"], "w").close()
if rank == 0:
    dist.all_reduce(t)  # waits for its peer, which never comes
else:
    time.sleep(300)  # stuck in its own code
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_rank_that_never_entered_its_peers_collective_is_named_from_real_dumps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "logs"
    logs.mkdir()
    init = f"tcp://127.0.0.1:{_free_port()}"
    children = []
    try:
        for rank in range(2):
            where = tmp_path / f"rank{rank}"
            where.mkdir()
            env = {**os.environ, "RANK": str(rank), "INIT": init, "READY": str(where / "ready"),
                   **flight_records.rank_env(dict(os.environ), str(where), str(logs))}
            process = subprocess.Popen([sys.executable, BOOTSTRAP, str(script)], env=env, start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            children.append(Child(rank, rank, process, str(where / "beat"), str(where / "failure.json"),
                                  str(logs / f"rank-{rank}.log"), env))
        deadline = time.monotonic() + 120
        while not all(os.path.exists(c.env["READY"]) for c in children):
            assert time.monotonic() < deadline and all(c.process.poll() is None for c in children)
            time.sleep(0.1)
        time.sleep(0.5)  # rank 0 into its fourth all-reduce

        records = flight_records.collect(children, str(logs), wait_s=30)
    finally:
        for child in children:
            os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()

    assert sorted(records) == [0, 1]
    assert records[0]["default_pg"]["seq"] == 4 and records[0]["default_pg"]["op"] == "gloo:all_reduce"
    assert records[1]["default_pg"] == {"seq": 3, "op": "gloo:all_reduce", "state": "completed", "sizes": [[4]]}
    # torch's own dump, kept beside each rank's log.
    kept = json.loads((logs / "rank-0.flight-recorder.json").read_text())
    assert len(kept["entries"]) == 4 and (logs / "rank-1.flight-recorder.json").exists()
    # The answering thread is not the main one: both ranks were still where they hung.
    assert all(c.process.returncode == -signal.SIGKILL for c in children)

    ranks, message = odd_ranks(records, [0, 1])
    assert ranks == [1]
    assert message == ("flight recorder: rank 1 never entered collective #4 gloo:all_reduce on default_pg, which its "
                       "peers wait in (its last was #3 gloo:all_reduce).")


def test_a_value_the_user_set_for_the_buffer_is_kept():
    mine = flight_records.rank_env({"TORCH_FR_BUFFER_SIZE": "50", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, "/w", "/logs")
    assert "TORCH_FR_BUFFER_SIZE" not in mine and mine["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    ours = flight_records.rank_env({}, "/w", "/logs")
    assert ours["TORCH_FR_BUFFER_SIZE"] == flight_records.BUFFER_ENTRIES
    assert ours["TORCH_FR_DUMP_TEMP_FILE"] == "/logs/flight-recorder-nccl-timeout-rank-"
