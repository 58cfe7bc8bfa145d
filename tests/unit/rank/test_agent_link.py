"""The socket between a node's agent and its rank children (orchestrator/rank/agent_link.py): only
this user's processes reach it (a file in a 0700 folder, never Linux's abstract namespace, which
every local user can list and connect to; the peer's uid checked), a client that connects and
says nothing holds up no rank, and `close()` leaves no thread, socket or handler of it alive."""

from __future__ import annotations

import gc
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import pytest
from conftest import REPO

from orchestrator.rank import agent_link
from orchestrator.rank.agent_link import LinkServer

# A rank child's part, in a process of its own: connect with the key, make one call, print the
# answer and how long connecting and the call took.
RANK_LIKE = """
import sys, time
from orchestrator.rank.agent_link import AgentLink
from orchestrator.worker_config import LinkAddress
address = LinkAddress(bytes.fromhex(sys.argv[1]).decode(), bytes.fromhex(sys.argv[2]))
began = time.monotonic()
answer = AgentLink(address).begin_attempt(2)
print(answer, round(time.monotonic() - began, 3))
"""
# Seconds a rank-like client may take to connect and be answered on a loaded machine; far less
# than agent_link.HANDSHAKE_S (10), so an answer that came only once an idle client was dropped fails.
SERVED_WITHIN_S = 5.0


class Handler:
    """The agent's answers (session_ranks.Answers in a run): each call kept, answered with its op."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def __call__(self, op, payload):
        self.calls.append((op, payload))
        return f"{op}:{payload}"


@pytest.fixture
def folder():
    """A 0700 folder as the agent's scratch is, in /tmp (a short path every user can traverse up to)."""
    made = tempfile.mkdtemp(prefix="orchestrator-test-link-")
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def server(folder):
    made = LinkServer(folder, Handler())
    yield made
    made.close()


def _rank_like(address, timeout: float = 60) -> tuple[str, float]:
    done = subprocess.run([sys.executable, "-c", RANK_LIKE, address.path.encode().hex(), address.authkey.hex()],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    answer, took = done.stdout.split()
    return answer, float(took)


def _connect(path: str) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    return client


def _listed(path: str) -> bool:
    """Whether the kernel lists a socket bound at `path` (an abstract name shows as @name)."""
    shown = "@" + path[1:] if path.startswith("\0") else path
    with open("/proc/net/unix") as f:
        return any(line.split()[-1] == shown for line in f.readlines()[1:] if len(line.split()) == 8)


@pytest.mark.timeout(120)
def test_a_client_that_connects_and_says_nothing_does_not_hold_up_a_rank_calling_its_agent(server):
    idle = _connect(server.address.path)  # connected, and never answers the key's challenge
    try:
        answer, took = _rank_like(server.address, timeout=90)
        assert answer == "begin:2" and server._handle.calls == [("begin", 2)]
        assert took < SERVED_WITHIN_S, f"the rank was answered only after {took} s"
    finally:
        idle.close()


@pytest.mark.timeout(60)
def test_a_client_that_never_answers_the_challenge_is_dropped_after_the_handshake_limit(server, monkeypatch):
    monkeypatch.setattr(agent_link, "HANDSHAKE_S", 1.0, raising=False)
    idle = _connect(server.address.path)
    idle.settimeout(20)
    try:
        assert b"#CHALLENGE#" in idle.recv(100)  # the agent's challenge: it was heard
        began = time.monotonic()
        try:
            dropped = idle.recv(100) == b""
        except (TimeoutError, socket.timeout):
            dropped = False
        assert dropped and time.monotonic() - began < 10, "the silent client was never dropped"
    finally:
        idle.close()


def test_the_socket_is_a_file_of_this_user_alone_not_a_name_in_the_abstract_namespace(server):
    path = server.address.path
    assert not path.startswith("\0"), "an abstract socket: any local user can list and connect to it"
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    folder = os.stat(os.path.dirname(path))
    assert folder.st_uid == os.geteuid() and stat.S_IMODE(folder.st_mode) == 0o700
    assert _listed(path)
    with open("/proc/net/unix") as f:
        assert not [line for line in f if "@orchestrator-agent" in line and str(os.getpid()) in line]


def test_a_folder_too_deep_for_a_socket_path_gets_a_short_one_of_its_own_removed_at_close(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    made = LinkServer(str(deep), Handler())
    try:
        path = made.address.path
        assert not path.startswith("\0") and len(path.encode()) <= 107
        folder = os.path.dirname(path)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and os.stat(folder).st_uid == os.geteuid()
        assert _rank_like(made.address)[0] == "begin:2"
    finally:
        made.close()
    assert not os.path.exists(folder)


def _as_nobody(path: str, loosen_first: bool) -> str:
    """What a process of user `nobody` gets trying `path`: 'refused: <error>' at connect, or, once
    connected, the first bytes the agent sends it ('' if it is dropped at once)."""
    nobody = pwd.getpwnam("nobody")
    if loosen_first:  # the folder's mode alone no longer keeps other users out: the uid check must
        os.chmod(os.path.dirname(path), 0o755)
        os.chmod(path, 0o777)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but the syscalls, then out
        try:
            os.close(read)
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                client = _connect(path)
                client.settimeout(20)
                outcome = repr(client.recv(20))
            except OSError as exc:
                outcome = f"refused: {type(exc).__name__}"
            os.write(write, outcome.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        outcome = f.read()
    os.waitpid(pid, 0)
    return outcome


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process of another user")
def test_a_process_of_another_user_cannot_reach_the_agent(server):
    assert _as_nobody(server.address.path, loosen_first=False) == "refused: PermissionError"
    assert _as_nobody(server.address.path, loosen_first=True) == "b''"
    # A control: this user's own client, connected the same way, is sent the agent's challenge.
    mine = _connect(server.address.path)
    mine.settimeout(20)
    assert b"#CHALLENGE#" in mine.recv(20)
    mine.close()
    assert server._handle.calls == []


@pytest.mark.timeout(60)
def _fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:  # (the listing's own descriptor, closed by now)
            pass
    return found


def test_close_ends_every_thread_and_the_listening_socket_and_lets_the_handler_go(folder):
    before, fds = set(threading.enumerate()), _fds()
    handler = Handler()
    gone = weakref.ref(handler)
    made = LinkServer(folder, handler)
    path = made.address.path
    del handler
    served = agent_link.AgentLink(made.address)  # a child connected and served, idle between calls
    assert served.begin_attempt(1) == "begin:1"
    silent = _connect(path)  # one that never answers the challenge
    assert _listed(path) and len(set(threading.enumerate()) - before) >= 2
    made.close()
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, f"threads of the closed server still alive: {left}"
    assert not _listed(path), "the listening socket outlived close()"
    del made
    gc.collect()
    assert gone() is None, "the handler (in a run: the agent's answers and the run monitor) outlived close()"
    silent.close()
    served._conn.close()
    assert _fds() == fds
