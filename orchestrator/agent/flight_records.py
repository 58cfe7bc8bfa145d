"""torch's flight recorder, taken from each rank on a hang verdict: what each rank's recent
collectives were, so that the verdict can name the rank whose last one differs from its peers'
(monitor/collectives.py), the usual culprit of a hang inside a collective.

Every rank child records its collectives (TORCH_FR_BUFFER_SIZE entries, gloo's and NCCL's; a
value the user set is kept). On a hang verdict, before the stacks, the agent signals each live
rank (a stopped one answers nothing, and its stack is what tells), and the rank's bootstrap
(rank/script/bootstrap.py) writes torch's dump. The agent keeps each dump beside the rank's log,
`<run>/logs/rank-N.flight-recorder.json` (read with `python -m torch.distributed.flight_recorder.fr_trace`
or as JSON), and hands the monitor each process group's last collective per rank.

With NCCL, torch also dumps by itself when its watchdog times a collective out
(TORCH_NCCL_DUMP_ON_TIMEOUT), to `<run>/logs/flight-recorder-nccl-timeout-rank-N`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from typing import Any

from orchestrator.rank.agent_contract import FR_FILE_VAR, FR_SIGNAL_VAR

# The signal each rank's bootstrap answers with its dump (real-time: queued, never merged, and
# used by nothing else in a training process).
FR_SIGNAL = signal.SIGRTMIN + 5
BUFFER_ENTRIES = "2000"
DUMP_NAME = "flight-recorder.json"

log = logging.getLogger("orchestrator.worker")


def rank_env(base_env: dict[str, str], where: str, log_dir: str | None) -> dict[str, str]:
    """What a rank child needs for its flight recorder; a value the user set wins."""
    env = {FR_SIGNAL_VAR: str(int(FR_SIGNAL)), FR_FILE_VAR: os.path.join(where, DUMP_NAME)}
    if "TORCH_FR_BUFFER_SIZE" not in base_env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in base_env:
        env["TORCH_FR_BUFFER_SIZE"] = BUFFER_ENTRIES
    if log_dir and "TORCH_FR_DUMP_TEMP_FILE" not in base_env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in base_env:
        env["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(log_dir, "flight-recorder-nccl-timeout-rank-")
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", base_env.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"))
    return env


def collect(children: list, log_dir: str | None, wait_s: float = 10.0) -> dict[int, dict[str, Any]]:
    """Each live, running child's dump, asked for at once and awaited up to `wait_s`: rank ->
    {process group: its last collective} (summarize). Each dump is copied beside its log.

    A dump takes tens of milliseconds; the wait is long for a loaded machine, and only a rank that
    cannot answer makes the verdict wait."""
    asked = {}
    for child in children:
        path = child.env.get(FR_FILE_VAR)
        if child.process.poll() is not None or child.stopped() or not path:
            continue
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        try:
            os.kill(child.process.pid, FR_SIGNAL)
            asked[child.rank] = path
        except ProcessLookupError:
            continue
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank, path in list(asked.items()):
            if os.path.exists(path):
                del asked[rank]
                try:
                    with open(path) as f:
                        found[rank] = summarize(json.load(f))
                except (OSError, ValueError):
                    log.warning("rank %d's flight record at %s could not be read", rank, path)
                    continue
                if log_dir:
                    try:
                        shutil.copyfile(path, os.path.join(log_dir, f"rank-{rank}.flight-recorder.json"))
                    except OSError:  # a lost run directory costs the copy, never the verdict
                        pass
    for rank in sorted(asked):
        log.warning("rank %d gave no flight record within %.0f s of the signal", rank, wait_s)
    return found


def summarize(dump: dict[str, Any]) -> dict[str, Any]:
    """Per process group, the newest collective the rank recorded: its sequence number, the
    operation, its state (scheduled, started, completed) and its input sizes."""
    last: dict[str, dict[str, Any]] = {}
    for entry in dump.get("entries") or []:
        if entry.get("is_p2p"):
            continue  # point-to-point operations are numbered apart, per pair
        group = (entry.get("process_group") or ["?", "?"])[1] or str(entry.get("pg_id"))
        seq = int(entry.get("collective_seq_id") or 0)
        if group not in last or seq >= last[group]["seq"]:
            # gloo leaves the state at "scheduled"; a retired entry's work is done either way.
            state = "completed" if entry.get("retired") else entry.get("state")
            last[group] = {"seq": seq, "op": entry.get("profiling_name", "?"), "state": state,
                           "sizes": entry.get("input_sizes")}
    return last
