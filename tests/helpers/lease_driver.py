"""A driver of the lease tests in a process of its own: `python tests/helpers/lease_driver.py RUN_URI OUT [options]`.

It waits for `--go` (when given), tries to take the run's lease and writes the outcome to OUT/result
(whole, by rename): "won GENERATION NONCE" or "busy MESSAGE" (or "error ..." when it failed). A
winner then holds the lease until it is killed, and writes OUT/lost once its lease records the
loss (and OUT/on_lost, from the callback, with `--on-lost`).

Options:
  --beat S         start the heartbeat, one beat every S seconds
  --on-lost        give the heartbeat a callback that writes the LeaseLost message to OUT/on_lost
  --hostname NAME  set this process's hostname first (only in a UTS namespace of its own)
  --seen-as NAME   report NAME as this process's hostname (socket.gethostname), as a driver on another host
                   that shares the storage would, without a namespace: other drivers cannot check its pid
  --clock-ahead S  this driver's wall clock runs S seconds ahead
  --stalling       its storage stalls every write while OUT/stall exists (and says so in OUT/stalled):
                   a slow disk or object store, so that a heartbeat hangs between its check and its write
Only the API that the lease has had from the start is used, so the same driver runs on any version.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import pyarrow.fs as pafs
from local_fs_handler import LocalThroughPython


def write_whole(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


class StallingFS(LocalThroughPython):
    """The local filesystem, seen through pyarrow's Python filesystem: every write waits while the
    `stall` file exists. Not a LocalFileSystem, so the lease treats it as an object store."""

    def __init__(self, stall: str, stalled: str):
        super().__init__()
        self.stall, self.stalled = stall, stalled

    def before_write(self, path: str) -> None:
        if os.path.exists(self.stall):
            write_whole(self.stalled, "stalled")
            while os.path.exists(self.stall):
                time.sleep(0.01)

    def open_output_stream(self, path, metadata):
        self.before_write(path)
        self.local.create_dir(os.path.dirname(path), recursive=True)  # an object store has no folders to make
        return self.local.open_output_stream(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_uri")
    parser.add_argument("out")
    parser.add_argument("--go")
    parser.add_argument("--beat", type=float)
    parser.add_argument("--on-lost", action="store_true")
    parser.add_argument("--hostname")
    parser.add_argument("--seen-as")
    parser.add_argument("--clock-ahead", type=float, default=0.0)
    parser.add_argument("--stalling", action="store_true")
    args = parser.parse_args()
    if args.hostname:
        socket.sethostname(args.hostname)
    if args.seen_as:
        socket.gethostname = lambda: args.seen_as

    from orchestrator.checkpoint.lease import RunBusy, RunLease
    from orchestrator.run_dir import RunDir
    from orchestrator.storage import Location

    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    if args.stalling:
        fs = pafs.PyFileSystem(StallingFS(out("stall"), out("stalled")))
        run_dir = RunDir(Location(fs, args.run_uri, args.run_uri))
    else:
        run_dir = RunDir.at(args.run_uri)
    write_whole(out("ready"), "ready")
    while args.go and not os.path.exists(args.go):
        time.sleep(0.01)
    try:
        lease = RunLease.acquire(run_dir, now=lambda: time.time() + args.clock_ahead)
        if args.beat is not None:
            if args.on_lost:
                lease.start_heartbeat(args.beat, on_lost=lambda exc: write_whole(out("on_lost"), str(exc)))
            else:
                lease.start_heartbeat(args.beat)
        outcome = f"won {lease.generation} {lease.holder.nonce}"
    except RunBusy as exc:
        write_whole(out("result"), f"busy {exc}")
        return
    except BaseException as exc:  # the test reads what went wrong, and the driver still fails
        write_whole(out("result"), f"error {type(exc).__name__}: {exc}")
        raise
    write_whole(out("result"), outcome)
    while lease.lost is None:
        time.sleep(0.01)
    write_whole(out("lost"), str(lease.lost))
    time.sleep(600)


if __name__ == "__main__":
    sys.exit(main())
