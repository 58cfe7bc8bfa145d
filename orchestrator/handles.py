"""The run monitor's handle, as a Ray actor's or in this process: one way to call it.

On Ray the monitor is an actor (monitor/actor.py) and `monitor.push.remote(event)` returns an
ObjectRef. In local mode (driver/local.py) the node's agent runs in the command's own process
and the monitor is a plain object behind `InProcess`: `.remote()` runs the method at once, one
call at a time (as an actor runs its calls), and returns its outcome. `get` takes either.
"""

from __future__ import annotations

import threading
from typing import Any


class Done:
    """The outcome of an in-process call: its value, or the exception it raised (raised by `get`)."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _Method:
    def __init__(self, handle: InProcess, name: str):
        self._handle, self._name = handle, name

    def remote(self, *args: Any, **kwargs: Any) -> Done:
        return self._handle.call(self._name, args, kwargs)


class InProcess:
    """An object called as an actor is: `handle.method.remote(...)`, its calls one at a time."""

    def __init__(self, target: Any):
        self._target = target
        self._lock = threading.Lock()

    def call(self, name: str, args: tuple, kwargs: dict) -> Done:
        with self._lock:
            try:
                return Done(getattr(self._target, name)(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - handed to the caller's get(), as Ray does
                return Done(error=exc)

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def __repr__(self) -> str:
        return f"InProcess({self._target!r})"


def get(refs: Any, timeout: float | None = None) -> Any:
    """ray.get for an actor's ObjectRef(s); the value of an in-process call (or a list of them)."""
    if isinstance(refs, Done):
        return refs.result()
    if isinstance(refs, list) and all(isinstance(r, Done) for r in refs):
        return [r.result() for r in refs]
    import ray

    return ray.get(refs, timeout=timeout)
