"""What each rank of a torchrun script runs: the script itself, as `__main__`, plus four things.

    python .../bootstrap.py (SCRIPT | -m MODULE) [ARGS...]

- Progress: torch's public global optimizer hook counts optimizer steps, and the median time
  between consecutive ones, into a small file the node's agent reads every second (the heartbeat
  the hang watchdog judges; the step time goodput counts), with the rank's own work in a step
  (_StepWork: what tells a slow rank from its peers, monitor/stragglers.py).
- Liveness beside the steps: a daemon thread looks at the main thread's Python stack once a
  second and notes in the same file when it last moved, so that a script that never steps an
  optimizer (evaluation, preprocessing, a hand-written update) is judged by whether it still runs.
- Stacks on a hang verdict: faulthandler dumps every thread's Python stack into this rank's log
  on ORCHESTRATOR_STACK_SIGNAL (the agent sends it, with SIGCONT, once the attempt is judged
  hung), and the rank then ends by that signal, from within the handler: a frozen rank that is
  continued for its dump takes no step and writes no checkpoint past the verdict.
- The flight recorder on a hang verdict: torch's record of the rank's collectives, written by a thread
  on a signal every thread blocks from the start (agent/spares.py), so a rank waiting in one answers.
- The outcome: an uncaught exception is printed as Python prints it, classified with the same
  rules as the other paths (orchestrator/failures.py) and written as JSON for the agent. A
  `sys.exit(N)` with N != 0 is the script's own word: restarted, as torchrun restarts it.

It is run by path, not as `-m orchestrator...`, so that nothing is imported before the script
but the standard library: no Ray, and torch only once the script imports it. The process dies
with its agent (PR_SET_PDEATHSIG), so a lost Ray worker leaves no rank behind.

    python .../bootstrap.py (--spare | --first) MODULE[,MODULE...] -m orchestrator.rank.rank_main

is a spare (spares.py): a ctx or Lightning rank of the next attempt (--spare), or of a local run's
first (--first). It imports those modules at niceness 19, a next attempt's as a session too
(rank/spare.py: the ranks or the command beside it keep their cores; the handover gives its
priority back) and waits for its attempt's environment, one JSON line on its stdin, then goes on
as a rank started afresh would (no line: it ends), with what Python and Lightning took from its
start-up environment taken again from that one.
"""

import collections
import faulthandler
import json
import os
import runpy
import signal
import sys
import threading
import time


def _load_beside(name: str):
    """A standard-library module of orchestrator/rank/ (agent_contract.py, spare.py, stop_signal.py),
    loaded by path: importing the package would load far more than the standard library."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name)
    found = importlib.util.spec_from_file_location(f"orchestrator_{name[:-3]}", path)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


# What this file and the node's agent agree on: the beat file's layout, the variables, the marks.
_CONTRACT = _load_beside("agent_contract.py")
BEAT_LAYOUT, STACK_OFFSET, WORK_OFFSET = _CONTRACT.BEAT_LAYOUT, _CONTRACT.STACK_OFFSET, _CONTRACT.WORK_OFFSET
BEAT_FILE_VAR, FR_SIGNAL_VAR, FR_FILE_VAR = _CONTRACT.BEAT_FILE_VAR, _CONTRACT.FR_SIGNAL_VAR, _CONTRACT.FR_FILE_VAR
FAILURE_FILE_VAR, FAILING_SUFFIX = _CONTRACT.FAILURE_FILE_VAR, _CONTRACT.FAILING_SUFFIX

# Steps whose own work the median is taken over, and the steps the top-level modules are found in.
WORK_KEPT = 16
LEARN_STEPS = 3
# Steps whose intervals the median is taken over, and seconds between its updates.
INTERVALS_KEPT = 64
MEDIAN_EVERY_S = 0.5
# Seconds between looks at the main thread's stack, and the frames compared.
STACK_LOOK_S = 1.0
STACK_DEPTH = 32


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the supervisor still ends its children itself
        return
    if os.getppid() != int(os.environ.get(_CONTRACT.AGENT_PID_VAR, os.getppid())):
        os._exit(1)  # the supervisor died before the prctl took hold


def _take_niceness() -> None:
    """The niceness of the user's shell, as under torchrun, rather than the one Ray gives its
    workers (15); lowering it needs the privilege to (root, CAP_SYS_NICE), else it stays."""
    wanted = os.environ.get(_CONTRACT.NICENESS_VAR)
    if wanted is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(wanted))
    except (OSError, ValueError):
        pass


def _open_beat_file(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    now = time.monotonic()
    os.pwrite(fd, BEAT_LAYOUT.pack(0, now, 0.0, now, 0.0), 0)
    return fd


def _watch_stack(fd: int) -> None:
    """Note when the main thread's Python stack last moved (a thread of its own, once a second)."""
    main = threading.main_thread().ident
    last = None

    def look() -> None:
        nonlocal last
        while True:
            time.sleep(STACK_LOOK_S)
            frame = sys._current_frames().get(main)
            here = []
            while frame is not None and len(here) < STACK_DEPTH:
                here.append((id(frame.f_code), frame.f_lasti))
                frame = frame.f_back
            del frame
            if here != last:
                last = here
                os.pwrite(fd, _CONTRACT.SECONDS.pack(time.monotonic()), STACK_OFFSET)

    threading.Thread(target=look, name="orchestrator-liveness", daemon=True).start()


class _StepWork:
    """The rank's own work in each optimizer step: from the end of the previous step to the end of
    the last top-level module forward before this one (loading the batch, the forward, the loss,
    the backward of accumulated micro-batches). Its peers never wait inside it: under DDP every
    rank takes the same time a step, and a slow rank shows only here, where the others are quicker
    and wait in the gradients' all-reduce instead.

    torch's public global forward hooks time every module for the first LEARN_STEPS steps, which
    finds the top-level ones (the model or its DDP wrapper, the loss); then hooks on those modules
    alone do, so that a model of thousands of modules pays two calls a step. Only the main
    thread's forwards count (a module run in a helper thread is not the training step).

    On a GPU the forward returns before its kernels run, and the CPU waits for its peers where it
    next reads a result (`loss.item()`): the work is timed by CUDA events on the rank's stream
    instead, from the end of one step to the end of the next forward, once both completed. Where
    the events fail, nothing is reported (0): a wrong measure would name the wrong rank."""

    def __init__(self) -> None:
        self.main = threading.main_thread().ident
        self.depth = 0
        self.forward_end = 0.0
        self.step_end: float | None = None
        self.samples: collections.deque = collections.deque(maxlen=WORK_KEPT)
        self.tops: dict[int, object] | None = {}  # None once they are hooked
        self.handles: list = []
        self.steps = 0
        # torch.cuda once CUDA is in use (False where its events failed), the events of the last
        # step's end and of the forward after it, and pairs not completed yet.
        self.cuda = None
        self.step_event = self.forward_event = None
        self.pending: collections.deque = collections.deque(maxlen=8)

    def pre(self, module, args) -> None:
        if threading.get_ident() == self.main:
            if self.depth == 0 and self.tops is not None:
                self.tops[id(module)] = module
            self.depth += 1

    def post(self, module, args, output) -> None:
        if threading.get_ident() == self.main:
            self.depth = max(0, self.depth - 1)
            if self.depth == 0:
                self.forward_end = time.monotonic()
                if self.cuda:
                    self.forward_event = self._event()

    def hook_every_module(self, module_module) -> None:
        self.handles = [module_module.register_module_forward_pre_hook(self.pre),
                        module_module.register_module_forward_hook(self.post, always_call=True)]

    def stepped(self, now: float) -> float:
        """At the end of an optimizer step: the median of the recent steps' own work (0: not known)."""
        torch = sys.modules.get("torch")
        if self.cuda is None and torch is not None and torch.cuda.is_initialized():
            self.cuda, self.samples = torch.cuda, collections.deque(maxlen=WORK_KEPT)
        if self.cuda:
            self._gpu_samples()
        elif self.cuda is None and self.step_end is not None and self.forward_end > self.step_end:
            self.samples.append(self.forward_end - self.step_end)
        self.step_end = now
        self.steps += 1
        if self.tops and self.steps >= LEARN_STEPS:
            for handle in self.handles:
                handle.remove()
            self.handles = [handle for module in self.tops.values() for handle in (
                module.register_forward_pre_hook(self.pre), module.register_forward_hook(self.post, always_call=True))]
            self.tops, self.depth = None, 0
        return sorted(self.samples)[len(self.samples) // 2] if self.samples and self.cuda is not False else 0.0

    def _event(self):
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _gpu_samples(self) -> None:
        try:
            if self.step_event is not None and self.forward_event is not None:
                self.pending.append((self.step_event, self.forward_event))
            self.step_event, self.forward_event = self._event(), None
            while self.pending and self.pending[0][1].query():
                start, end = self.pending.popleft()
                self.samples.append(start.elapsed_time(end) / 1000)
        except Exception:  # noqa: BLE001 - no measure rather than a wrong one, and never the script's failure
            self.cuda = False


def _count_optimizer_steps(beat_fd: list) -> None:
    """Register the global optimizer and module hooks once torch is imported (by the script, not
    by us): they count into the beat file beat_fd[0] (a spare's is opened once the agent hands it
    an attempt)."""
    steps = [0]
    intervals: collections.deque = collections.deque(maxlen=INTERVALS_KEPT)
    timing = {"last": 0.0, "median": 0.0, "computed": 0.0}
    work = _StepWork()

    def stepped(optimizer, args, kwargs) -> None:
        fd = beat_fd[0]
        if fd is None:
            return
        now = time.monotonic()
        steps[0] += 1
        if steps[0] > 1:
            intervals.append(now - timing["last"])
            if now - timing["computed"] >= MEDIAN_EVERY_S or len(intervals) < 4:
                timing["median"], timing["computed"] = sorted(intervals)[len(intervals) // 2], now
        timing["last"] = now
        own = work.stepped(now)
        os.pwrite(fd, _CONTRACT.STEP_LAYOUT.pack(steps[0], now, timing["median"]), 0)
        os.pwrite(fd, _CONTRACT.SECONDS.pack(own), WORK_OFFSET)

    hooks = {"torch.optim.optimizer": lambda module: module.register_optimizer_step_post_hook(stepped),
             "torch.nn.modules.module": work.hook_every_module}

    class _Finder:
        """Hooks torch the moment the script imports it (an import hook, removed after)."""

        def find_spec(self, name, path=None, target=None):
            if name not in hooks:
                return None
            hook = hooks.pop(name)
            import importlib.util

            sys.meta_path.remove(self)  # the module's own spec, found without this finder
            try:
                spec = importlib.util.find_spec(name)
            finally:
                if hooks:  # the other module is still to come
                    sys.meta_path.insert(0, self)
            loader = spec.loader
            original = loader.exec_module

            def exec_module(module):
                original(module)
                hook(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())


def _write_failure(exc: BaseException, target: str) -> None:
    """The failure file: the JSON of the error's FailureRecord (failures.py), which the agent reads back."""
    path = os.environ.get(FAILURE_FILE_VAR)
    if not path:
        return
    try:
        record = _classified(exc, target)
    except Exception as problem:  # noqa: BLE001 - the exit status still says it failed
        record = {"kind": "user", "error": f"{type(exc).__name__}: {exc}", "where": "",
                  "note": f"(could not be classified: {problem})"}
    with open(path + ".partial", "w") as f:
        json.dump(record, f)
    os.replace(path + ".partial", path)


def _classified(exc: BaseException, target: str) -> dict:
    """The record of `exc` as JSON keeps it (FailureRecord.to_dict). A script's own exit status is
    written without the package: a script that ends by sys.exit loads none of it."""
    if isinstance(exc, SystemExit):
        # The script's own choice (some exit non-zero on purpose to be restarted): torchrun
        # restarts it, and so does its agent, within the restarts allowed.
        return {"kind": "exit", "error": f"the script exited with status {exc.code} (sys.exit)", "where": "",
                "signature": ""}
    from orchestrator.failures import WorkerFailure

    # A ctx rank (rank/rank_main.py) notes the step it failed at: a restart that brings the
    # same error back at the same step is the data's (monitor/attempts.py).
    step = getattr(exc, "orchestrator_step", None)
    return WorkerFailure.from_exception(exc, rank=int(os.environ.get("RANK", "0")), step=step).record.to_dict()


def _wait_as_spare(modules: list[str], first: bool, beat_fd: list) -> None:
    """A spare: the optimizer hook in place, `modules` imported (rank/spare.py, loaded by path as
    this file is run), then the attempt's environment from the agent (without one it ends there)."""
    _count_optimizer_steps(beat_fd)
    spare = _load_beside("spare.py")
    spare.become(spare.wait(modules, session_too=not first))  # it ends in there if no attempt comes


def _answer_flight_recorder() -> None:
    """On FR_SIGNAL_VAR's signal, torch's flight-recorder dump (its tutorial's call) into FR_FILE_VAR."""
    if not os.environ.get(FR_SIGNAL_VAR):
        return
    wanted = {int(os.environ[FR_SIGNAL_VAR])}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)  # before any thread: all inherit it

    def answer() -> None:
        while signal.sigwait(wanted):  # the file is read now: a spare's comes with its rank's environment
            dist, text = sys.modules.get("torch.distributed"), b"{}"
            try:
                if dist is not None and dist.is_available() and dist.is_initialized():
                    c10d = sys.modules["torch._C._distributed_c10d"]
                    text = (getattr(c10d, "_dump_fr_trace_json", None) or c10d._dump_nccl_trace_json)(True, False)
            except Exception as exc:  # noqa: BLE001 - the agent reads what went wrong instead
                text = json.dumps({"error": repr(exc)})
            with open(os.environ[FR_FILE_VAR] + ".tmp", "wb") as f:
                f.write(text if isinstance(text, bytes) else text.encode())
            os.replace(os.environ[FR_FILE_VAR] + ".tmp", os.environ[FR_FILE_VAR])
    threading.Thread(target=answer, name="orchestrator-flight-recorder", daemon=True).start()


def main(argv: list[str]) -> int:
    spare, first = None, argv[:1] == ["--first"]
    if argv[:1] in (["--spare"], ["--first"]) and len(argv) > 1:
        spare, argv = [m for m in argv[1].split(",") if m], argv[2:]
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print("usage: bootstrap.py [--spare | --first MODULES] (SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr)
        return 2
    _die_with_parent()
    _take_niceness()
    if argv == ["-m", "orchestrator.rank.rank_main"]:  # a ctx or Lightning rank: SIGTERM from outside stops
        _load_beside("stop_signal.py").install(then=_answer_flight_recorder)  # the run; both masks before any thread
    else:
        _answer_flight_recorder()
    beat_fd: list = [None]
    if spare is not None:
        _wait_as_spare(spare, first, beat_fd)
    stack_signal = int(os.environ.get(_CONTRACT.STACK_SIGNAL_VAR, signal.SIGUSR2))
    # chain: after the dump, the signal's default action (the end of the process) runs, before
    # the main thread runs another line of the script.
    faulthandler.register(stack_signal, file=sys.stderr, all_threads=True, chain=True)
    if os.environ.get(BEAT_FILE_VAR):
        if spare is None:
            _count_optimizer_steps(beat_fd)
        beat_fd[0] = _open_beat_file(os.environ[BEAT_FILE_VAR])
        _watch_stack(beat_fd[0])
    # Python's own start-up for `python SCRIPT` / `python -m MODULE`: argv, and sys.path[0].
    if argv[0] == "-m":
        target, module = argv[1], argv[1]
        sys.argv = [target, *argv[2:]]
        sys.path[0] = os.getcwd()
    else:
        target, module = os.path.abspath(argv[0]), None
        sys.argv = [argv[0], *argv[1:]]
        sys.path[0] = os.path.dirname(target)
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code in (None, 0):
            _returned()
            return 0
        _write_failure(exc, target)
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 - printed as Python would, then classified
        import traceback

        traceback.print_exception(exc)
        sys.stderr.flush()
        _write_failure(exc, target)
        return 1
    _returned()
    return 0


def mark_failing(exc: BaseException | None) -> None:
    """Say, beside the failure file, that the rank's training raised `exc` and its process is ending,
    with the error's record written now: the agent gives the rank failure.hang_timeout_s to end
    (Lightning's on_exception hooks and teardown, a logger marking its run failed), then ends it and
    reports this error, never a hang (agent/supervisor.py). None takes the mark back (rank/session.py:
    a checkpoint commit to wait for first). Called by the rank's own code as the exception leaves."""
    path = os.environ.get(FAILURE_FILE_VAR)
    try:
        if path and exc is None:
            os.remove(path + FAILING_SUFFIX)
        elif path:
            _write_failure(exc, "")
            open(path + FAILING_SUFFIX, "w").close()
    except OSError:  # the agent then judges the rank as before: by its heartbeat
        pass


def _returned() -> None:
    """The script ran to its end: a crash after this (a library's teardown at exit) is no failure."""
    if os.environ.get(FAILURE_FILE_VAR):
        open(os.environ[FAILURE_FILE_VAR] + _CONTRACT.RETURNED_SUFFIX, "w").close()


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
