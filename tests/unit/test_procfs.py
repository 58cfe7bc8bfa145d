"""What /proc says of a process (orchestrator/procfs.py): its stat line read as the kernel writes
it (a command name with spaces and parentheses included), its state, session and CPU time, its
environment and threads; and nothing, not an error, for a process that is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orchestrator import procfs

# A stat line as the kernel writes it, for a command named "a) b (c": fields 1 to 22 and a few more.
LINE = "4242 (a) b (c) T 17 4242 4242 0 -1 4194304 120 0 0 0 250 50 0 0 20 0 3 0 987654 1 2 3\n"


def test_a_stat_line_is_read_after_the_commands_last_parenthesis():
    stat = procfs.parse_stat(LINE)
    assert (stat.state, stat.ppid, stat.pgrp, stat.session) == ("T", 17, 4242, 4242)
    assert stat.cpu_ticks == 300 and stat.cpu_seconds == 300 / procfs.TICK
    assert stat.started == "987654"
    assert stat.stopped and not stat.zombie


def test_a_stat_line_cut_short_reads_as_none():
    assert procfs.parse_stat("4242 (python) S 1 2") is None
    assert procfs.parse_stat("") is None


def test_this_process_reads_as_running_in_its_own_session_with_its_threads_and_environment():
    stat = procfs.stat(os.getpid())
    assert stat.ppid == os.getppid() and stat.session == os.getsid(0) and not stat.stopped
    assert os.getpid() in procfs.pids()
    assert os.getpid() in procfs.threads()
    assert procfs.cwd(os.getpid()) == os.getcwd()
    assert f"PATH={os.environ['PATH']}".encode() in procfs.environ(os.getpid())


def test_a_stopped_child_reads_as_stopped_and_an_exited_one_as_a_zombie_until_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not procfs.stat(child.pid).stopped and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procfs.stat(child.pid).stopped and procfs.stat(child.pid).session == child.pid
        os.kill(child.pid, signal.SIGKILL)
        while not procfs.stat(child.pid).zombie and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procfs.stat(child.pid).zombie
    finally:
        child.kill()
        child.wait()
    assert procfs.stat(child.pid) is None


def test_a_gone_process_reads_as_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procfs.stat(child.pid) is None and procfs.environ(child.pid) is None
    assert procfs.cmdline(child.pid) is None and procfs.cwd(child.pid) is None
    assert procfs.open_files(child.pid) == [] and procfs.threads(child.pid) == []


def test_the_kernel_and_pid_namespace_are_named():
    assert procfs.boot_id() and procfs.pid_namespace() == str(os.stat("/proc/self/ns/pid").st_ino)
