"""How a rank child of a node's agent reaches the run monitor: through its agent, over a socket.

A rank child (rank/rank_main.py) has no Ray in it, so it cannot call the monitor's actor. Its
`AgentLink` has a client's methods (send an event, send one and wait, begin an attempt, beat) and
sends each call to the agent (agent/supervisor.py) over a Unix socket; the agent's
`LinkServer` makes the actor call and sends back the answer. Every call is answered, in the order
made, so one rank's events reach the monitor in the order it sent them.

Only this user's processes can reach the socket: it is a file in the agent's scratch folder
(0700), and each connection's peer must run as this user (SO_PEERCRED) and answer the challenge of
the socket's key (the children's config file, readable by this user alone) within HANDSHAKE_S, on
a thread of its own, so that a client that says nothing holds up no other. `LinkServer.close()`
ends its every thread and connection and removes the socket. The messages are protocol.py's
dataclasses.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any

from orchestrator.errors import InfrastructureError
from orchestrator.processes import is_alive
from orchestrator.protocol import AttemptBegun, Beat, BeatReply, Event
from orchestrator.worker_config import LinkAddress

# Seconds a call that waits for the monitor may take, and one
# that the agent answers at once.
CALL_TIMEOUT_S = 60.0
QUICK_S = 10.0
# Seconds a new connection has to answer the key's challenge (and take the agent's) before it is dropped.
HANDSHAKE_S = 10.0
# Seconds close() waits for each of its threads to end (one in a monitor call is left to finish it).
CLOSE_WAIT_S = 5.0
# The most bytes a Unix socket's path may have (sun_path's 108, less the closing NUL); a deeper
# scratch folder (a long TMPDIR) gets the socket a folder of its own, SHORT_PREFIX<pid>-*, in SHORT_BASE.
MAX_SOCKET_PATH = 107
SHORT_BASE, SHORT_PREFIX = "/tmp", "orchestrator-link-"
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
    """The agent's end: a socket in `folder` (this user's alone, 0700, as the agent's scratch is),
    one thread per child connection, each call answered by `handle(op, payload)`."""

    def __init__(self, folder: str, handle: Callable[[str, Any], Any]):
        path = os.path.join(folder, "agent.sock")
        self._own_folder = _short_folder() if len(os.fsencode(path)) > MAX_SOCKET_PATH else None
        if self._own_folder is not None:
            path = os.path.join(self._own_folder, "agent.sock")
        self.address = LinkAddress(path, os.urandom(32))
        self._handle = handle
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(path)
        os.chmod(path, 0o600)
        self._socket.listen(64)
        self._closed = False
        self._lock = threading.Lock()
        self._served: dict[threading.Thread, socket.socket] = {}
        self._acceptor = threading.Thread(target=self._accept, name="orchestrator-agent-link", daemon=True)
        self._acceptor.start()

    def close(self) -> None:
        """Every thread of this server ended, its connections closed, its socket removed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            served = dict(self._served)
        _shut(self._socket)  # wakes the accept thread (closing the socket would not)
        self._acceptor.join(CLOSE_WAIT_S)
        self._socket.close()
        for connection in served.values():
            _shut(connection)  # wakes a thread waiting for its child's next call
        for thread in served:
            thread.join(CLOSE_WAIT_S)
        if self._own_folder is not None:
            shutil.rmtree(self._own_folder, ignore_errors=True)
        else:
            try:
                os.remove(self.address.path)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # (out of file descriptors, a client gone before its accept): again
                continue
            if not _same_user(connection):
                connection.close()
                continue
            connection.setblocking(True)
            thread = threading.Thread(target=self._serve, args=(connection,), name="orchestrator-agent-link-child",
                                      daemon=True)
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._served[thread] = connection
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            conn = self._greet(connection)
            if conn is not None:
                with conn:
                    self._answer(conn)
        finally:
            with self._lock:
                self._served.pop(threading.current_thread(), None)
            connection.close()

    def _greet(self, connection: socket.socket) -> Connection | None:
        """The connection once its peer has answered the key's challenge and taken ours within
        HANDSHAKE_S (what multiprocessing's Listener does inside accept()); None if it did not."""
        _set_timeout(connection, HANDSHAKE_S)
        conn = Connection(os.dup(connection.fileno()))  # (a copy: `connection` stays to shut it down)
        try:
            deliver_challenge(conn, self.address.authkey)
            answer_challenge(conn, self.address.authkey)
        except (OSError, EOFError, AuthenticationError):
            conn.close()
            return None
        _set_timeout(connection, 0.0)  # a child may be silent for long between calls
        return conn

    def _answer(self, conn: Connection) -> None:
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


def _same_user(connection: socket.socket) -> bool:
    """Whether the peer runs as this process's user (SO_PEERCRED, Linux's; elsewhere the folder's
    mode alone keeps other users out)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    size = struct.calcsize("3i")
    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size))
    return uid == os.geteuid()


def _set_timeout(connection: socket.socket, seconds: float) -> None:
    """The kernel's limit on each read and write of the socket (0: none). Connection reads and
    writes the file descriptor itself, where Python's socket timeout does not apply."""
    value = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        connection.setsockopt(socket.SOL_SOCKET, option, value)


def _shut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected (its peer left), or closed already
        pass


def _short_folder() -> str:
    """A folder of this process's own (0700) under SHORT_BASE, after removing those of processes
    that are gone (killed before their close())."""
    for name in os.listdir(SHORT_BASE):
        pid = name[len(SHORT_PREFIX):].split("-", 1)[0] if name.startswith(SHORT_PREFIX) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not is_alive(int(pid)):
            shutil.rmtree(os.path.join(SHORT_BASE, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SHORT_PREFIX}{os.getpid()}-", dir=SHORT_BASE)
