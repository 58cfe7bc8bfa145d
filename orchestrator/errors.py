"""One root for every error the orchestrator raises on purpose, in two kinds and two outcomes.

- `UserError`: something the person running the job can fix (a bad spec, a missing file, a wrong
  flag, a misused `ctx` call): the CLI prints its message alone and exits 2; a rank that raises
  one is not retried.
- `InfrastructureError`: the world failed (a node, the network, storage, a side group that did not
  form): a rank that raises one is retried against failure.max_failures.
- `TrainingFailed` (exit 1) and `RunStopped` (130/143) are how a run ended; `LeaseLost` says a
  newer driver took the run over.
Messages follow one shape: what value, why it is wrong, how to fix it. Errors defined next to the
code that raises them (checkpoint/, data/, failures.py...) derive from these; tests/unit/test_errors.py
checks that every exception class of the package does.
"""

from __future__ import annotations

import difflib


class OrchestratorError(Exception):
    """Root of all orchestrator errors; survives pickling across Ray actors."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (self.__class__, (self.message,))

    def __str__(self) -> str:
        return self.message


class UserError(OrchestratorError):
    """A mistake in the spec, the arguments or the environment that the user can fix."""


class ContextMisuse(UserError):
    """An orchestrator call made in a way the run cannot honour (`ctx.track`, `ctx.step`...); the
    message names the call and the fix."""


class InfrastructureError(OrchestratorError):
    """Something outside the user's code and spec failed; trying again may help. The message says
    what failed and what to check."""


class SpecError(UserError):
    """The job spec is invalid. The message names the field path, the bad value and the fix."""


class CheckpointError(UserError):
    """A checkpoint asked for by the user is missing, partial, corrupt or unsafe to load."""


class TrainingFailed(OrchestratorError):
    """Training started but did not finish (a worker raised, or failures exceeded the budget)."""


class RunStopped(OrchestratorError):
    """The run was stopped from outside (Ctrl-C, `ray job stop`, SIGTERM) before it finished.

    Nothing committed is lost: the same command resumes from the newest committed checkpoint.
    """

    def __init__(self, message: str, signal_name: str = "SIGINT"):
        super().__init__(message)
        self.signal_name = signal_name

    def __reduce__(self):
        return (self.__class__, (self.message, self.signal_name))

class LeaseLost(OrchestratorError):
    """A newer driver took the run over (checkpoint/lease.py); the writer that gets this must stop writing."""


def nearest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""
