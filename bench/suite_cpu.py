"""The suite's CPU floor: how many core-seconds the tests keep the machine busy, and so the
shortest time any schedule of them (serial, or split over processes) could take on this machine.

    python -m pytest -q -p bench.suite_cpu [--suite-cpu-out FILE] [pytest's own arguments]

With pytest -n (the README's command), the session's figures are the whole machine's as before;
a test's own figures then include what the other workers ran beside it.

Counted machine-wide from /proc/stat, not from the test process's rusage: a Ray run's CPU is spent
in the driver, the warm cluster's daemons and a dozen actor processes, none of them the test
process's children. So run it with the machine to itself; what else runs is counted too, and
the idle rate measured for two seconds before the first test says how much (kernel threads alone
use ~1% of a core here).

At the end it prints, and writes to FILE as JSON lines (one per test, then the session):
- the wall time, the busy core-seconds and the busy fraction (busy / (cores x wall));
- the floor: busy core-seconds / cores, the wall time of a perfect split over every core;
- floor / goal, against the issue's 15 minutes: above 1, no schedule of these tests meets it on
  this machine; only fewer core-seconds (fewer or cheaper runs) or more cores can;
- the tests that use the most core-seconds, with their wall time and busy fraction.
"""

from __future__ import annotations

import json
import os
import time

import pytest

GOAL_S = 15 * 60
BACKGROUND_S = 2.0
TOP = 25


def busy_core_seconds() -> float:
    """Core-seconds every core together has been busy since boot (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user, nice, system, irq, softirq. Not idle or iowait; not steal (the hypervisor's, not
    # ours); guest time is already inside user and nice.
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
    return busy / os.sysconf("SC_CLK_TCK")


class TestCpu:
    """In the process that runs the tests: each test's figures, from its start to its teardown,
    sent with its teardown report (as a user property, which pytest -n carries to the controller)."""

    def __init__(self):
        self.cores = os.cpu_count() or 1
        self.started: dict[str, tuple[float, float]] = {}

    def pytest_runtest_logstart(self, nodeid, location):
        self.started[nodeid] = (time.monotonic(), busy_core_seconds())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        if call.when == "teardown" and item.nodeid in self.started:
            wall0, busy0 = self.started.pop(item.nodeid)
            wall, busy = time.monotonic() - wall0, busy_core_seconds() - busy0
            item.user_properties.append(("suite_cpu", {
                "test": item.nodeid, "wall_s": round(wall, 2), "busy_core_s": round(busy, 2),
                "busy_fraction": round(busy / (self.cores * wall), 3) if wall > 0 else 0.0}))
        yield


class SuiteCpu:
    """In the process that reports (pytest's own, or the controller of pytest -n): the session."""

    def __init__(self, out: str | None):
        self.out = out
        self.cores = os.cpu_count() or 1
        self.rows: list[dict] = []
        before = busy_core_seconds()
        time.sleep(BACKGROUND_S)
        self.background_busy = (busy_core_seconds() - before) / BACKGROUND_S  # cores busy before any test
        self.start = (time.monotonic(), busy_core_seconds())

    def pytest_runtest_logreport(self, report):
        if report.when == "teardown":
            self.rows.extend(row for key, row in report.user_properties if key == "suite_cpu")

    def session(self) -> dict:
        wall0, busy0 = self.start
        wall, busy = time.monotonic() - wall0, busy_core_seconds() - busy0
        floor = busy / self.cores
        return {"session": True, "tests": len(self.rows), "cores": self.cores, "wall_s": round(wall, 1),
                "busy_core_s": round(busy, 1), "busy_fraction": round(busy / (self.cores * wall), 3),
                "background_cores_busy": round(self.background_busy, 3), "floor_s": round(floor, 1),
                "goal_s": GOAL_S, "floor_over_goal": round(floor / GOAL_S, 3)}

    def pytest_terminal_summary(self, terminalreporter):
        total = self.session()
        write = terminalreporter.write_line
        terminalreporter.section("suite CPU (bench/suite_cpu.py)")
        write(f"{'busy core-s':>11} {'wall s':>7} {'busy':>5}  test (the {TOP} that use the most CPU)")
        for row in sorted(self.rows, key=lambda r: -r["busy_core_s"])[:TOP]:
            write(f"{row['busy_core_s']:11.1f} {row['wall_s']:7.1f} {row['busy_fraction']:5.0%}  {row['test']}")
        write(f"{total['tests']} tests: {total['wall_s']:.0f} s wall, {total['busy_core_s']:.0f} busy core-s on "
              f"{total['cores']} cores (busy {total['busy_fraction']:.0%}; {total['background_cores_busy']:.2f} "
              f"cores busy before the first test)")
        write(f"floor={total['floor_s']:.0f} s ({total['floor_s'] / 60:.1f} min) floor_over_goal="
              f"{total['floor_over_goal']:.2f} wall_over_floor={total['wall_s'] / total['floor_s']:.2f}")
        if self.out:
            with open(self.out, "w") as f:
                for row in [*self.rows, total]:
                    f.write(json.dumps(row) + "\n")


def pytest_addoption(parser):
    parser.addoption("--suite-cpu-out", default=None, help="bench.suite_cpu: also write the figures here (JSON lines)")


def pytest_configure(config):
    workers = config.getoption("numprocesses", None)  # pytest -n N: this is the controller
    if not hasattr(config, "workerinput"):  # not a worker of pytest -n
        config.pluginmanager.register(SuiteCpu(config.getoption("--suite-cpu-out")), "suite-cpu")
    if hasattr(config, "workerinput") or not workers:
        config.pluginmanager.register(TestCpu(), "suite-cpu-tests")
