"""The driver's side of a SIGTERM sent to the ranks (orchestrator/driver/signals.py `adopt`): the
stop a rank passed on is the driver's own first SIGTERM, its grace and its exit status; the
scheduler's SIGTERM to the command as well is that same stop, not a second one; a second SIGTERM,
to the command or to a rank, stops at once. Real signals, sent to this process."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.driver.signals import DEFAULT_GRACE_S, StopSignals


@pytest.fixture
def signals(monkeypatch):
    monkeypatch.delenv("ORCHESTRATOR_STOP_GRACE_S", raising=False)
    monkeypatch.delenv("RAY_JOB_STOP_WAIT_TIME_S", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    stops: list[str] = []
    found = StopSignals(on_stop=lambda deadline, by: stops.append(by))
    with found.installed():
        yield found, stops


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # handled in this (main) thread before kill returns to Python code


def test_a_rank_sent_sigterm_and_then_the_command_is_one_stop_and_a_second_sigterm_stops_at_once(signals):
    found, stops = signals
    found.adopt("rank 1 was sent SIGTERM")
    assert found.received == "SIGTERM" and not found.immediate and stops == ["rank 1 was sent SIGTERM"]
    assert found.grace_left() == pytest.approx(DEFAULT_GRACE_S, abs=5)
    found.adopt("rank 1 was sent SIGTERM")  # asked again at the driver's next poll: nothing new
    _sigterm()  # the scheduler's SIGTERM, reaching the command too
    assert not found.immediate and stops == ["rank 1 was sent SIGTERM"]
    _sigterm()
    assert found.immediate and found.stopped_by(None) == "SIGTERM"


def test_the_commands_own_sigterm_then_a_ranks_is_one_stop_and_a_ranks_second_stops_at_once(signals):
    found, stops = signals
    _sigterm()
    found.adopt("rank 0 was sent SIGTERM")
    assert stops == [""] and not found.immediate
    found.adopt("rank 0 was sent SIGTERM", again=True)
    assert found.immediate and stops == [""]
