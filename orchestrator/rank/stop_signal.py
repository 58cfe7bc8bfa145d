"""SIGTERM sent to a ctx or Lightning rank from outside: the run's stop, not the rank's end.

Slurm's time limit and `scancel`, systemd's stop, earlyoom: they signal every process of the job,
the ranks as well as the command. A rank that died of it was restarted in place in the middle of
the stop; one that let Lightning end its fit on it (SIGTERMException, a SystemExit) ended as
finished, without a stop checkpoint. Here a rank's SIGTERM is the run's stop, as the command's
own is (driver/signals.py): the rank marks it beside its failure file (STOP_SUFFIX), its agent
tells the run monitor (agent/rank_signals.py), the driver takes it as a SIGTERM of its own, and
every rank checkpoints at the step they agree on and ends. A second one marks STOP_AGAIN_SUFFIX:
the driver's "stop at once". One SIGTERM to the ranks and one to the command are one stop.

Only the sender tells this SIGTERM from the one its agent ends the rank with (a restart in
place, the run's end), and a Python handler is not told the sender (and runs only between the
main thread's bytecodes, not while it waits in a collective). So SIGTERM is blocked in every
thread, from before the bootstrap starts any, and one thread takes it with sigwaitinfo, which
names the sender. A SIGTERM from the agent, or once the agent is gone, ends the rank as before.
What the rank forks (DataLoader workers) inherits the mask and a waiter of its own: it ends at a
SIGTERM from its agent, its parent or itself, and carries on through one from outside, which its
rank is stopping for. What the rank executes (a subprocess) inherits the mask alone: it is ended
by the agent's SIGKILL after its grace (agent/sessions.py), or by its own ending.

A torchrun script's rank gets none of this: it receives SIGTERM as under torchrun and handles it
itself. Standard library only: script/bootstrap.py loads it by path, before the rank's imports.
"""

import importlib.util
import os
import signal
import sys
import threading


def _contract():
    """rank/agent_contract.py, loaded by path as this file is (script/bootstrap.py)."""
    found = importlib.util.spec_from_file_location(
        "orchestrator_agent_contract", os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent_contract.py"))
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


# Beside a rank's failure file: it was sent SIGTERM from outside once, and again; and the variables
# that name that file and the rank's agent.
_CONTRACT = _contract()
STOP_SUFFIX, STOP_AGAIN_SUFFIX = _CONTRACT.STOP_SUFFIX, _CONTRACT.STOP_AGAIN_SUFFIX
FAILURE_FILE_VAR, AGENT_PID_VAR = _CONTRACT.FAILURE_FILE_VAR, _CONTRACT.AGENT_PID_VAR
_TERM = {signal.SIGTERM}


def install(then=lambda: None) -> None:
    """In a ctx or Lightning rank's process, before it starts any thread (each inherits the mask).
    `then` runs with SIGTERM blocked, before this module's own thread starts: whatever else blocks
    a signal of its own (the flight recorder's, bootstrap.py) sets it before any thread exists,
    or a thread without it would take that signal with its default action (the process's end)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _TERM)
    then()
    os.register_at_fork(after_in_child=lambda: _start(rank=False))
    _start(rank=True)


def _start(rank: bool) -> None:
    threading.Thread(target=_take, args=(rank, os.getppid()), name="orchestrator-sigterm", daemon=True).start()


def _take(rank: bool, parent: int) -> None:
    asked = 0
    while True:
        sender = signal.sigwaitinfo(_TERM).si_pid
        failure_file = os.environ.get(FAILURE_FILE_VAR)
        agent = int(os.environ.get(AGENT_PID_VAR) or (parent if rank else 0))
        # A spare not handed its rank yet (no failure file), or an agent gone (the sweeper ends what it left).
        if sender == agent or os.getppid() != parent or not failure_file:
            _end()
        if not rank:
            if sender in (parent, os.getpid()):  # its rank ends it (a DataLoader's shutdown, Pool.terminate)
                _end()
            continue
        asked += 1
        print(f"[orchestrator] rank {os.environ.get('RANK', '?')} was sent SIGTERM (by pid {sender}): "
              + ("the run stops at the next step its ranks agree on, with a last checkpoint" if asked == 1 else
                 "again: the run stops at once"), file=sys.stderr, flush=True)
        _mark(failure_file + (STOP_SUFFIX if asked == 1 else STOP_AGAIN_SUFFIX))


def _mark(path: str) -> None:
    try:
        open(path, "w").close()
    except OSError:  # the scratch folder is gone: the agent is ending the ranks already
        pass


def _end() -> None:
    """End the process by SIGTERM, as its default action would have; by SIGKILL where a handler
    (Lightning's, the user's) would take it instead."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _TERM)  # this thread alone: the signal comes here
        os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGKILL)
