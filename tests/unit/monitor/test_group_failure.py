"""One handler decides what a failed worker group means (monitor/group_failure.py), for Ray Train's
controller callback and for a local run's agent alike: it classifies with the run monitor's view,
records the decision with the monitor, and a decision that ends the run ends it in both."""

from __future__ import annotations

import logging

import pytest

from orchestrator import handles
from orchestrator.failures import INFRASTRUCTURE, USER
from orchestrator.monitor.controller_errors import UserCodeFailed
from orchestrator.monitor.actor import RunMonitor
from orchestrator.monitor.group_failure import GroupFailureCallback, handle
from orchestrator.protocol import Failure
from orchestrator.spec.model import FailureSpec

HANG_TIMEOUT_S = 30.0


def _monitor() -> handles.InProcess:
    failure = FailureSpec(hang_timeout_s=HANG_TIMEOUT_S, max_failures=3, straggler_ratio=0.0, straggler_after_s=0.0)
    return handles.InProcess(RunMonitor.__ray_actor_class__(failure, "group"))


def _bug() -> ValueError:
    try:
        int("x")
    except ValueError as exc:
        return exc


def test_a_group_failure_is_recorded_with_the_monitor_and_a_users_error_ends_the_run():
    monitor = _monitor()
    decision = handle(monitor, {0: _bug()}, HANG_TIMEOUT_S)
    assert decision.kind == USER and type(decision.end) is UserCodeFailed
    (recorded,) = [e for e in handles.get(monitor.events_since.remote(0)) if isinstance(e, Failure)]
    assert recorded.classification == USER and recorded.ranks[0].rank == 0


def test_a_lost_connection_is_the_infrastructures_and_leaves_the_retry_to_the_caller():
    decision = handle(_monitor(), {1: ConnectionResetError("Connection reset by peer")}, HANG_TIMEOUT_S)
    assert decision.kind == INFRASTRUCTURE and decision.end is None


def test_the_callback_ends_the_run_as_the_handler_decides_even_without_a_monitor(caplog):
    callback = GroupFailureCallback(None, HANG_TIMEOUT_S)  # every call to it fails, as to a dead actor's handle
    with caplog.at_level(logging.WARNING, logger="orchestrator.monitor.classifier"):
        with pytest.raises(UserCodeFailed, match=r"^rank 0: ValueError: invalid literal"):
            callback.after_exception(None, {0: _bug()})
    assert "could not record the failure with the run monitor" in caplog.text
    assert callback.after_exception(None, {1: ConnectionResetError("Connection reset by peer")}) is None
