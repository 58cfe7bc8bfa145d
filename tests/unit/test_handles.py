"""The run monitor's handle in local mode (orchestrator/handles.py): called as a Ray actor is,
`.remote()` then `get`, one call at a time, an exception handed to the caller."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator import handles


class Counter:
    def __init__(self):
        self.value = 0

    def add(self, n: int) -> int:
        value = self.value
        time.sleep(0.001)  # a call interleaved with another would lose an update here
        self.value = value + n
        return self.value

    def fail(self) -> None:
        raise KeyError("no such rank")


def test_calls_return_their_values_one_at_a_time_as_an_actor_runs_them():
    handle = handles.InProcess(Counter())
    threads = [threading.Thread(target=lambda: [handles.get(handle.add.remote(1)) for _ in range(20)])
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert handles.get(handle.add.remote(0)) == 80
    assert handles.get([handle.add.remote(1), handle.add.remote(2)]) == [81, 83]


def test_an_exception_reaches_the_caller_at_get_not_at_the_call():
    handle = handles.InProcess(Counter())
    done = handle.fail.remote()  # fire and forget, as an actor call is
    with pytest.raises(KeyError, match="no such rank"):
        handles.get(done)


def test_private_names_are_not_calls():
    with pytest.raises(AttributeError):
        handles.InProcess(Counter())._target_value  # noqa: B018 - the attribute access is the test
