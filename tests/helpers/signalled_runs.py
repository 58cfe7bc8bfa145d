"""`orchestrator run` in the background, as a user's shell starts it, for the tests that signal
its process (SIGTERM, SIGKILL, SIGSTOP and SIGCONT) and read what it prints while it runs. With
`prefix`, the command runs under another (`unshare --uts ...`: a driver seen as another host's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Any

from cli_runs import _command, _env
from conftest import REPO

# Where the test may rename the host of a command: a UTS namespace of its own (root), or a user
# namespace mapping this user to root, which may make one.
_UTS_NAMESPACES = (["unshare", "--uts"], ["unshare", "--user", "--map-root-user", "--uts"])


def another_host(hostname: str) -> list[str] | None:
    """A prefix that runs a command with `hostname` as its host's name (its own UTS namespace),
    as a driver on another machine sharing the storage; None where no namespace can be made."""
    if shutil.which("unshare") is None:
        return None
    for unshare in _UTS_NAMESPACES:
        prefix = [*unshare, "sh", "-c", f'hostname {hostname} && exec "$@"', "sh"]
        try:
            done = subprocess.run([*prefix, "hostname"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == hostname:
            return prefix
    return None


class SignalledRun:
    """One `orchestrator run` of `spec` in a process of its own; its output is read as it comes."""

    def __init__(self, spec: dict[str, Any], spec_dir: str, *, prefix: list[str] | None = None):
        self.lines: list[str] = []
        self.process = subprocess.Popen([*(prefix or []), *_command(spec, None, spec_dir)], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=REPO, env=_env())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def send(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def first_line(self) -> str:
        return next(line for line in self.lines if not line.startswith("run name: "))

    def line(self, predicate, timeout: float) -> str:
        """The first line printed that `predicate` accepts, waiting up to `timeout` seconds for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in list(self.lines) if predicate(line)), None)
            if found is not None:
                return found
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError("no such line; the run printed:\n" + "\n".join(self.lines[-60:]))

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        """Its exit status and everything it printed, once it ended (SIGKILLed if it does not within `timeout`)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("the run did not end:\n" + "\n".join(self.lines[-60:])) from None
        self._reader.join(timeout=10)
        return code, "\n".join(self.lines)

    def kill(self) -> None:
        """SIGKILL it (by its own pid), whatever it is doing, and reap it; a stopped one too."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
