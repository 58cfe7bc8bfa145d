"""How a rank child of a node's agent reaches the run monitor: through its agent, over a socket.

A rank child (rank/rank_main.py) has no Ray in it, so it cannot call the monitor's actor. Its
`AgentLink` has a client's methods (send an event, send one and wait, begin an attempt, beat) and
sends each call to the agent (agent/supervisor.py) over a Unix socket; the agent's
`LinkServer` makes the actor call and sends back the answer. Every call is answered, in the order
made, so one rank's events reach the monitor in the order it sent them.

Only the agent and its children know the socket's key (the children's config file, readable by
this user alone), and the messages are protocol.py's dataclasses.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from orchestrator.errors import InfrastructureError
from orchestrator.protocol import AttemptBegun, Beat, BeatReply, Event
from orchestrator.worker_config import LinkAddress

# Seconds a call that waits for the monitor may take, and one
# that the agent answers at once.
CALL_TIMEOUT_S = 60.0
QUICK_S = 10.0
SEND, SEND_AND_WAIT, BEGIN, BEAT, PREEMPTION = "send", "send_and_wait", "begin", "beat", "preemption"


class AgentLink:
    """The run monitor's client in a rank child, through its agent."""

    def __init__(self, address: LinkAddress):
        self._conn = Client(address.path, family="AF_UNIX", authkey=address.authkey)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def send(self, event: Event) -> None:
        self._call(SEND, event, QUICK_S)

    def send_and_wait(self, event: Event, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self._call(SEND_AND_WAIT, event, timeout_s)

    def begin_attempt(self, world_size: int) -> AttemptBegun:
        return self._call(BEGIN, world_size, QUICK_S)

    def beat(self, attempt: int, beat: Beat, timeout_s: float) -> BeatReply:
        return self._call(BEAT, (attempt, beat), timeout_s)

    def preemption_notice(self) -> object | None:
        """Ray Train's notice that a node of the group is about to be preempted, as the agent has it."""
        return self._call(PREEMPTION, None, QUICK_S)

    def _call(self, op: str, payload: Any, timeout_s: float) -> Any:
        # The heartbeat thread and the training thread share the connection: one call at a time,
        # and an answer that came too late for its call is skipped by the next one.
        with self._lock:
            call = next(self._ids)
            self._conn.send((call, op, payload))
            while True:
                if not self._conn.poll(timeout_s):
                    raise TimeoutError(f"the node's agent did not answer {op} within {timeout_s:.0f} s")
                answered, ok, value = self._conn.recv()
                if answered == call:
                    break
        if not ok:
            raise InfrastructureError(f"the node's agent could not pass on {op}: {value}")
        return value


class LinkServer:
    """The agent's end: one thread per child connection, each call answered by `handle(op, payload)`."""

    def __init__(self, folder: str, handle: Callable[[str, Any], Any]):
        # Linux's abstract namespace: no file, so no limit from a deep TMPDIR (a socket's path
        # has at most 107 bytes); the key keeps other processes out.
        name = f"orchestrator-agent-{os.getpid()}-{os.urandom(6).hex()}"
        path = "\0" + name if sys.platform.startswith("linux") else os.path.join(folder, "agent.sock")
        self.address = LinkAddress(path, os.urandom(32))
        self._listener = Listener(self.address.path, family="AF_UNIX", authkey=self.address.authkey)
        self._handle = handle
        self._closed = False
        threading.Thread(target=self._accept, name="orchestrator-agent-link", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:  # noqa: BLE001 - closed, or a connection without the key: not a child of ours
                continue
            threading.Thread(target=self._serve, args=(conn,), name="orchestrator-agent-link-child",
                             daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    call, op, payload = conn.recv()
                except (EOFError, OSError):
                    return  # the child ended
                try:
                    answer = (call, True, self._handle(op, payload))
                except Exception as exc:  # noqa: BLE001 - the child's call fails, with the cause
                    answer = (call, False, f"{type(exc).__name__}: {exc}")
                try:
                    conn.send(answer)
                except OSError:
                    return
