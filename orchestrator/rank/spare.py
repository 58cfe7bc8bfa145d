"""A spare's wait (agent/spares.py): its rank's modules imported at the lowest priority, its
attempt's environment taken the moment it comes. Standard library only: script/bootstrap.py loads
it by path, as it is run itself (nothing of the package is imported before a rank's own code).

A spare imports what its rank will (torch, Lightning, the harness) while the ranks or the command
beside it train or start, so it must not take their cores. Three things make its priority right:
- Linux's niceness is per thread: lowered on the main thread before the imports, every thread
  they start inherits it, and the handover takes it back on each.
- Where autogroups are on (most distributions' default), the scheduler shares the CPUs between
  sessions first, and a thread's niceness only weighs it within its session: a spare, a session
  of its own, lowers its session's niceness too, or it takes a full session's share from the ranks
  beside it. A local run's first ranks, started ahead beside the command's own start, do not:
  their imports are as much the way to the first step as the command's.
- The handover may come while the spare still imports (a restart soon after the last): a thread
  that reads stdin from the start gives the rank's priority back at once, so that no rank starts
  at niceness 19 (under load, it would beat too late for the hang watchdog).
It lowers its priority only where it may take it back (root, CAP_SYS_NICE, RLIMIT_NICE).

Handed its attempt, the spare becomes its rank (`become`): the rank's environment in place of the
one it started with, and what Python and Lightning took from that one at their start taken again,
so that a rank made from a spare is one started afresh (its stdout's buffering, Lightning's rank).
"""

import importlib
import json
import os
import sys
import threading


def _load_procfs():
    """orchestrator/procfs.py by its path (this module is loaded so: the package is not imported)."""
    import importlib.util

    if "orchestrator_procfs" in sys.modules:
        return sys.modules["orchestrator_procfs"]
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "procfs.py")
    found = importlib.util.spec_from_file_location("orchestrator_procfs", path)
    module = sys.modules["orchestrator_procfs"] = importlib.util.module_from_spec(found)  # (its dataclass asks)
    found.loader.exec_module(module)
    return module


if __package__:
    from orchestrator import procfs
else:
    procfs = _load_procfs()

# A spare's niceness, its threads' and its session's, until its handover.
SPARE_NICENESS = 19
# Lightning's modules that set rank_zero_only.rank from the environment as they are imported.
LIGHTNING_RANK_ZERO = ("lightning.fabric.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                       "lightning.pytorch.utilities.rank_zero", "pytorch_lightning.utilities.rank_zero")


def wait(modules: list[str], session_too: bool = True, stdin=None) -> dict[str, str]:
    """Import `modules` humbly (`session_too`: as a session as well); the attempt's environment once
    the agent sends it. At the end of stdin (the spare was not needed) the process ends, at once."""
    niceness, session = os.getpriority(os.PRIO_PROCESS, 0), session_niceness() if session_too else None
    humble = may_lower_to(niceness)
    if humble:
        os.setpriority(os.PRIO_PROCESS, 0, SPARE_NICENESS)
        if session is not None:
            set_session_niceness(SPARE_NICENESS)
    # Started once lowered, so that a handover at once is not undone by the lowering.
    handover = Handover(sys.stdin if stdin is None else stdin, (niceness, session) if humble else None)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank's own import, after the handover, says what is wrong
            break
    handover.arrived.wait()
    handover.give_back()  # again: a thread an import started while the handover gave it back
    return json.loads(handover.line)


def become(env: dict[str, str]) -> None:
    """This process as its rank: `env` its environment, and what its start took from the spare's."""
    os.environ.clear()
    os.environ.update(env)
    # sys.path as the rank's own PYTHONPATH makes it (a local run's first spares start before it is known).
    sys.path[1:1] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    # Python buffers stdout into a pipe unless PYTHONUNBUFFERED said otherwise at its start: line by
    # line, as the rank's says, so that a killed rank's last lines are in its log (the same object:
    # what the imports hold writes so too).
    if os.environ.get("PYTHONUNBUFFERED") and not getattr(sys.stdout, "write_through", True):
        sys.stdout.reconfigure(line_buffering=True)
    # Lightning reads the rank as it is imported: 0 for a spare, on every rank until `fit` sets it
    # (rank-zero-only code in a model's __init__ would run on each). Fabric's own rule, again.
    modules = [sys.modules[name] for name in LIGHTNING_RANK_ZERO if name in sys.modules]
    get_rank = next((m._get_rank for m in modules if hasattr(m, "_get_rank")), None)
    if get_rank is not None:
        rank = get_rank() or 0
        for module in modules:
            module.rank_zero_only.rank = rank


class Handover:
    """Reads the one line the agent sends, and gives the spare its rank's priority the moment it comes."""

    def __init__(self, stdin, niceness: tuple[int, int | None] | None):
        self.niceness = niceness  # the rank's and its session's; None: never lowered, nothing to give back
        self.line = ""
        self.arrived = threading.Event()
        threading.Thread(target=self._read, args=(stdin,), name="orchestrator-spare-handover", daemon=True).start()

    def _read(self, stdin) -> None:
        try:
            line = stdin.readline()
        except (OSError, ValueError):
            line = ""
        if not line.strip():
            os._exit(0)  # not needed: the rest of its imports would be a waste of a core
        self.give_back()
        self.line = line
        self.arrived.set()

    def give_back(self) -> None:
        if self.niceness is None:
            return
        niceness, session = self.niceness
        if session is not None:
            set_session_niceness(session)
        # The main thread first: a thread it starts from now on inherits the rank's niceness.
        main = threading.main_thread().native_id
        for tid in [main, *(t for t in procfs.threads() if t != main)]:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            except OSError:
                pass  # a thread that just ended


def session_niceness() -> int | None:
    """This process's session's niceness (its scheduler autogroup's), or None without autogroups."""
    return procfs.autogroup_niceness()


def set_session_niceness(niceness: int) -> None:
    """The niceness of this process's session (its scheduler autogroup); without autogroups in
    the kernel, the threads' own niceness is all there is."""
    procfs.set_autogroup_niceness(niceness)


def may_lower_to(niceness: int) -> bool:
    """Whether this process may take `niceness` back after raising it: CAP_SYS_NICE, or RLIMIT_NICE."""
    caps = procfs.effective_capabilities()
    if caps is None:
        return False
    try:
        import resource

        return bool(caps & (1 << procfs.CAP_SYS_NICE)) or 20 - resource.getrlimit(resource.RLIMIT_NICE)[0] <= niceness
    except (ImportError, OSError, ValueError):
        return False
