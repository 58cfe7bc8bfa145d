"""How a driver is stopped from outside: Ctrl-C, `ray job stop`, a scheduler's SIGTERM.

Ray Train answers SIGINT during `fit()` by aborting its controller and worker group. SIGTERM,
which `ray job stop` and most schedulers send, would otherwise end the driver on the spot,
before it can write summary.json; here it takes the same path as SIGINT. Either way the run is
reported as stopped (not failed), and the next run resumes from the newest committed checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


class StopSignals:
    """Remembers which stop signal arrived while installed; SIGTERM is forwarded as SIGINT."""

    def __init__(self) -> None:
        self.received: str | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        # Python delivers signals to the main thread only; a driver run from another thread
        # (a notebook's worker thread, a test) keeps the process's own handling.
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum, frame) -> None:
        self.received = "SIGTERM"
        # Whatever handles SIGINT now (Ray Train's abort during fit(), else KeyboardInterrupt) acts.
        os.kill(os.getpid(), signal.SIGINT)

    def stopped_by(self, error: BaseException | None) -> str | None:
        """The signal that ended the run, or None if it ended on its own (finished or failed)."""
        if self.received:
            return self.received
        # Ray Train's SIGINT handler ends fit() with SystemExit after aborting the workers.
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            return "SIGINT"
        return None


EXIT_CODES = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM}
