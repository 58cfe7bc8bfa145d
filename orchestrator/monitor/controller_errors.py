"""The errors Ray Train's controller ends a run with, at once and without a retry (classifier.py
raises them in its callback; the driver reads their records to say what failed: driver/console.py).
Each pickles with its records: it crosses from the controller to the driver."""

from __future__ import annotations

from orchestrator.errors import OrchestratorError
from orchestrator.failures import FailureRecord


class RunStoppedOnController(OrchestratorError):
    """Raised on Ray Train's controller to end a run the driver is stopping."""


class _EndedOnController(OrchestratorError):
    """Raised on Ray Train's controller to end the run at once, with the records of the ranks that did."""

    def __init__(self, message: str, records: list[FailureRecord] | None = None):
        super().__init__(message)
        self.records = records or []

    def __reduce__(self):
        return (self.__class__, (self.message, self.records))


class UserCodeFailed(_EndedOnController):
    """The training code itself failed, or an error came back at the same step after a restart
    (`repeated` records): retrying cannot help."""


class RestartsExhausted(_EndedOnController):
    """A torchrun script's run used up failure.max_failures with in-place restarts and group restarts
    together (Ray Train counts only the latter)."""


class RunTakenOver(_EndedOnController):
    """A newer driver took the run over (LeaseLost): this one stops, and retrying is not its to do."""
