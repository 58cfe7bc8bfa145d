"""Runs of a spec through the command line, as a user's shell starts them: `orchestrator run
SPEC.yaml --address ...` in a process of its own, its result read back from summary.json.

A driver in the test process would share that process's Ray, imported once for the whole session:
whatever one test's import order made of it would hold for the next test's driver. A process of its
own takes Ray the way `orchestrator run` does for every user.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any, ClassVar

import yaml
from conftest import REPO

from orchestrator import storage
from orchestrator.observe.result import RunResult


def _env() -> dict[str, str]:
    """The test's environment, with tests/helpers/ importable: the specs name loops of its modules."""
    tests = os.path.join(REPO, "tests", "helpers")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}


def _command(spec: dict[str, Any], address: str | None, spec_dir: str, mode: str | None = None) -> list[str]:
    """`orchestrator run` of `spec` (written to `spec_dir`); with `mode`, --local or --ray."""
    path = os.path.join(spec_dir, f"{spec['name']}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return [sys.executable, "-m", "orchestrator", "run", path, *(["--address", address] if address else []),
            *([f"--{mode}"] if mode else [])]


def _result(spec: dict[str, Any], code: int, output: str) -> RunResult:
    result = RunResult.load(storage.resolve(str(spec["storage"])).join(spec["name"]))
    if code != 0 or result is None:
        raise AssertionError(f"`orchestrator run` exited {code}:\n{output[-4000:]}")
    # The suite's runs have even ranks: none may be named a straggler (but the straggler tests',
    # which slow a rank on purpose and say so with a window of their own).
    if "straggler_after_s" not in spec.get("failure", {}):
        assert result.stragglers == [], f"a run with even ranks named a straggler: {result.stragglers}"
    return result


def run_command(spec: dict[str, Any], spec_dir: str, *, address: str | None = None, mode: str | None = None,
                timeout: float = 400) -> subprocess.CompletedProcess:
    """`orchestrator run` of `spec`, to its end: its exit code and output, whatever they are."""
    return subprocess.run(_command(spec, address, spec_dir, mode), capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=_env())


def failure_of(done: subprocess.CompletedProcess) -> str:
    """The one-paragraph error of a run that failed (exit 1): what `error: ` says on stderr."""
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr[done.stderr.index("error: ") + len("error: "):].strip()


def run_spec(spec: dict[str, Any], spec_dir: str, *, address: str | None = None, mode: str | None = None,
             timeout: float = 400, lines: list[str] | None = None) -> RunResult:
    """Run `spec` to its end with the command line; its RunResult (an AssertionError if it failed).
    `lines`, if given, gets what the command printed, a line each."""
    done = run_command(spec, spec_dir, address=address, mode=mode, timeout=timeout)
    output = done.stdout + done.stderr
    if lines is not None:
        lines.extend(output.splitlines())
    return _result(spec, done.returncode, output)


class BackgroundRun:
    """`orchestrator run` of `spec` in the background, while the test plays the failing world."""

    # Every one started, for end_all: a test that failed half-way leaves no run going on a shared cluster.
    _started: ClassVar[list[BackgroundRun]] = []

    def __init__(self, spec: dict[str, Any], spec_dir: str, *, address: str | None = None, mode: str | None = None,
                 console=None):
        self.spec = spec
        self._lines: list[str] = []
        self._process = subprocess.Popen(_command(spec, address, spec_dir, mode), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, cwd=REPO, env=_env())
        BackgroundRun._started.append(self)
        self._reader = threading.Thread(target=self._read, args=(console,), daemon=True)
        self._reader.start()

    @classmethod
    def end_all(cls) -> None:
        """SIGKILL the driver of every run still going (its own process id), and wait for it."""
        for run in cls._started:
            if run._process.poll() is None:
                run._process.kill()
                run._process.wait()
        cls._started.clear()

    def _read(self, console) -> None:
        for line in self._process.stdout:
            self._lines.append(line)
            if console is not None:
                console(line.rstrip("\n"))

    def ended(self) -> bool:
        return self._process.poll() is not None

    def result(self, timeout: float = 400) -> RunResult:
        try:
            code = self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise AssertionError("the run did not end") from None
        self._reader.join(timeout=10)
        return _result(self.spec, code, "".join(self._lines))
