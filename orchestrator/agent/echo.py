"""Rank 0's output on its way from its node's agent to the driver's console, in batches.

Best effort: past BACKLOG lines held (a script printing faster than the console shows), the
oldest are dropped, and the next batch begins with a note saying how many; the rank's log
keeps every line."""

from __future__ import annotations

import threading
from collections.abc import Callable

from orchestrator.protocol import Output

BACKLOG = 20_000


class Echo:
    def __init__(self, send: Callable[[Output], None], backlog: int = BACKLOG):
        self._send, self._backlog = send, backlog
        self._lines: list[str] = []
        self._dropped = 0
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        """One line of rank 0's output (from the thread that copies its pipe)."""
        with self._lock:
            self._lines.append(line)
            if len(self._lines) > self._backlog:
                drop = len(self._lines) - self._backlog // 2
                del self._lines[:drop]
                self._dropped += drop

    def flush(self) -> None:
        """Send what is held, as one Output event."""
        with self._lock:
            lines, self._lines = self._lines, []
            dropped, self._dropped = self._dropped, 0
        if dropped:
            lines.insert(0, f"[orchestrator: {dropped} line(s) of rank 0's output not shown here, printed faster "
                            f"than the console shows them; they are in its log, rank-0.log]")
        if lines:
            self._send(Output(rank=0, lines=lines))
