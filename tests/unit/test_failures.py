"""Classification a GPU cluster needs (no Ray cluster): an error that comes back at the same step
after a restart is the user's data; a damaged Parquet row group is named; GPU hardware faults are
retried and name the node to drain; a run taken over by a newer driver is taken over, not a bug; a
DataLoader worker killed by SIGKILL (the OOM killer) is retried, naming the rank, the node and the fix.

The exceptions are real: pyarrow's error reading a damaged file, torch.AcceleratorError with
CUDA's own text, LeaseLost from a real takeover of a run directory, torch's own error for a
DataLoader worker the test kills. Failures go through Ray Train's controller callback's decision
(monitor/classifier.py), with the run monitor's view of where each rank ran."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import threading
import time
from dataclasses import asdict

import pytest
import ray.train
import torch
from classify_jobs import damage_row_group, write_rows

from orchestrator import failures as faults
from orchestrator import storage
from orchestrator.checkpoint.lease import RunLease
from orchestrator.data import parquet
from orchestrator.data.parquet import Column, ParquetDataset, ParquetSource
from orchestrator.driver.console import RunWatcher, describe_failure
from orchestrator.driver.resume import ResumeChoice
from orchestrator.failures import (
    INFRASTRUCTURE,
    USER,
    FailureRecord,
    WorkerFailure,
    classify,
)
from orchestrator.monitor.actor import RunMonitor
from orchestrator.monitor.classifier import classify_failure, describe_ray_error
from orchestrator.monitor.controller_errors import RunTakenOver, UserCodeFailed
from orchestrator.observe.result import RunResult, write_summary
from orchestrator.protocol import Failure, RankStarted
from orchestrator.run_dir import RunDir
from orchestrator.spec import FailureSpec, validate

# What torch appends to every CUDA error's first line (c10/cuda/CUDAException.cpp).
CUDA_SUFFIX = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
               "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
               "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def _raised(function):
    try:
        function()
    except BaseException as exc:  # noqa: BLE001 - the test wants the exception with its traceback
        return exc
    raise AssertionError("did not raise")


def _throw(exc: BaseException):
    raise exc


def _cuda_error(text: str, code: int) -> torch.AcceleratorError:
    """A CUDA error as torch raises it: AcceleratorError with CUDA's text and its cudaError_t."""
    exc = torch.AcceleratorError(f"CUDA error: {text}{CUDA_SUFFIX}")
    exc.error_code = code
    return exc


def _view(places: dict[int, tuple[str, str, int]]) -> dict:
    """What the run monitor tells Ray Train's controller of a group whose ranks started at
    `places` (rank -> node id, host, pid): from a real RunMonitor (the object inside the actor)."""
    monitor = RunMonitor.__ray_actor_class__(FailureSpec(hang_timeout_s=30.0, max_failures=-1))
    attempt = monitor.begin_group(len(places)).attempt
    for rank, (node_id, hostname, pid) in places.items():
        monitor.push(RankStarted(rank=rank, attempt=attempt, world_size=len(places), node_id=node_id,
                                 hostname=hostname, pid=pid))
    return monitor.failure_context()


@pytest.fixture
def damaged(tmp_path) -> str:
    path = write_rows(tmp_path / "ids.parquet", 400, row_group=50)
    damage_row_group(path, 5)
    return path


def _read(path, rows):
    return ParquetDataset(ParquetSource(path, [Column("id", "id"), Column("x", "x")])).__getitems__(rows)


# --- 1. the same error at the same step after a restart ---------------------------------------------

def test_a_damaged_row_group_raises_an_oserror_without_errno_naming_the_file_and_the_row_group(damaged):
    assert _read(damaged, [1, 249, 300])["id"].tolist() == [1, 249, 300]  # the other row groups read
    exc = _raised(lambda: _read(damaged, [260]))
    assert isinstance(exc, parquet.ParquetReadError) and isinstance(exc, OSError) and exc.errno is None
    text = str(exc)
    assert f"row group 5 of '{damaged}'" in text and "Couldn't deserialize thrift" in text and "Fix:" in text
    assert "\n" not in text
    # A first occurrence may be a storage hiccup: retried, like any OSError without errno.
    assert classify(exc) == INFRASTRUCTURE
    # Through a DataLoader worker process, it reaches the training loop as the same type.
    dataset = ParquetDataset(ParquetSource(damaged, [Column("id", "id")]))
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=[list(range(256, 264))],
                                         collate_fn=ParquetDataset.collate, num_workers=1)
    again = _raised(lambda: next(iter(loader)))
    assert isinstance(again, parquet.ParquetReadError) and f"row group 5 of '{damaged}'" in str(again)


def test_the_same_error_at_the_same_step_after_a_restart_is_the_users_and_a_hiccup_is_retried(damaged):
    def failure(step, read=lambda: _read(damaged, [260])):
        record = pickle.loads(pickle.dumps(WorkerFailure.from_exception(_raised(read), rank=0, step=step))).record
        record.node_id = "node-a"
        return record

    first = failure(31)
    assert first.kind == INFRASTRUCTURE and first.step == 31 and first.signature
    assert "row group 5 of" in first.error

    again = failure(31)  # the restarted group replays step 31 and fails the same way
    faults.mark_repeats([again], [first])
    assert again.kind == USER and again.repeated and "same step (31)" in again.note and "data" in again.note
    assert faults.overall([again], None, False) == USER

    later = failure(57)  # the same error, elsewhere in training: still possibly a hiccup
    other = FailureRecord(**{**asdict(failure(31)), "signature": "0123456789abcdef"})  # another error at 31
    unknown = failure(None)  # raised before the group trained: no step to compare
    faults.mark_repeats([later, other, unknown], [first])
    assert [r.kind for r in (later, other, unknown)] == [INFRASTRUCTURE] * 3
    assert faults.overall([later, other], None, False) == INFRASTRUCTURE
    # Errors of the program itself carry no signature: they fail at once, on their own.
    bug = WorkerFailure.from_exception(_raised(lambda: int("seven")), rank=0, step=31).record
    assert bug.kind == USER and not bug.signature
    # An errno says what failed: a missing file is the user's at once, EIO or a network error is
    # retried every time (until failure.max_failures), never judged by its step.
    assert WorkerFailure.from_exception(FileNotFoundError(errno.ENOENT, "gone"), 0, step=3).record.kind == USER
    for error in (OSError(errno.EIO, "Input/output error"), TimeoutError("timed out")):
        record = WorkerFailure.from_exception(error, 0, step=3).record
        assert record.kind == INFRASTRUCTURE and not record.signature


def test_a_repeated_failure_is_told_as_the_datas_not_as_a_bug_in_the_training_code(tmp_path, damaged):
    record = WorkerFailure.from_exception(_raised(lambda: _read(damaged, [260])), rank=0, step=31).record
    faults.mark_repeats([record], [FailureRecord(0, INFRASTRUCTURE, "", signature=record.signature, step=31)])
    job = validate({"name": "damaged", "torch": {"train_loop": "classify_jobs:train_loop", "max_epochs": 1}})
    run_dir = storage.resolve(str(tmp_path / "damaged"))
    error = ray.train.ControllerError(UserCodeFailed(record.describe(), [record]))
    result = RunResult(name="damaged", status="failed", run_dir=run_dir.uri, world_size=1, global_step=31,
                       epochs=0, restarts=1)
    message = describe_failure(job, error, run_dir, result, None)
    assert message.startswith("run 'damaged' failed on attempt 2: rank 0: ParquetReadError: data.train.path: "
                              f"row group 5 of '{damaged}'")
    assert "same step (31)" in message and "the data" in message and "error in the training code" not in message
    line = RunWatcher(None, job, print)._format(Failure(classification=USER, ranks=[record]))
    assert "came back at the same step" in line and "error in the training code" not in line


# --- 2. GPU hardware faults ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, code, kind", [
    ("uncorrectable ECC error encountered", 214, INFRASTRUCTURE),
    ("unspecified launch failure", 719, INFRASTRUCTURE),
    ("uncorrectable NVLink error detected during the execution", 220, INFRASTRUCTURE),
    ("unknown error", 999, INFRASTRUCTURE),
    ("device-side assert triggered", 710, USER),  # e.g. an index out of range in an embedding
    ("an illegal memory access was encountered", 700, USER),
    ("an illegal instruction was encountered", 715, USER),
    ("misaligned address", 716, USER),
])
def test_gpu_hardware_faults_are_retried_and_the_programs_own_cuda_errors_are_not(text, code, kind):
    exc = _raised(lambda: _throw(_cuda_error(text, code)))
    record = WorkerFailure.from_exception(exc, rank=3).record
    assert record.kind == kind
    assert record.error == f"AcceleratorError: CUDA error: {text}"  # not the advice lines after it
    assert (record.fault == faults.GPU) == (kind == INFRASTRUCTURE)
    # The same text in a plain RuntimeError (an extension's own check) is classified alike.
    assert classify(RuntimeError(f"CUDA error: {text}{CUDA_SUFFIX}")) == kind


def test_out_of_memory_and_a_lost_gpu_as_the_driver_says_it():
    assert classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == USER
    assert classify(RuntimeError("NVML_SUCCESS == r INTERNAL ASSERT FAILED: GPU is lost")) == INFRASTRUCTURE


def test_a_gpu_fault_names_the_node_and_how_to_drain_it(tmp_path):
    failure = WorkerFailure.from_exception(_cuda_error("uncorrectable ECC error encountered", 214), rank=1, step=40)
    node = "5f3a9c0e7d21" + "0" * 44
    # Ray Train's controller classifies it, knowing where rank 1 ran (monitor/classifier.py).
    decision = classify_failure({1: failure}, _view({1: (node, "gpu-node-7", 4242)}), hang_timeout_s=30)
    assert decision.kind == INFRASTRUCTURE and decision.end is None
    record = decision.records[0]
    assert f"on node {node} (host gpu-node-7)" in record.note
    assert f"ray drain-node --node-id {node} --reason DRAIN_NODE_REASON_PREEMPTION" in record.note
    job = validate({"name": "ecc", "torch": {"train_loop": "classify_jobs:train_loop", "max_epochs": 1},
                    "failure": {"max_failures": 1}})
    event = decision.event()
    line = RunWatcher(None, job, print)._format(event)
    assert "host gpu-node-7" in line and f"--node-id {node}" in line and "restarting" in line
    # After the last retry, the run's message still names the node to drain.
    run_dir = storage.resolve(str(tmp_path / "ecc"))
    result = RunResult(name="ecc", status="failed", run_dir=run_dir.uri, world_size=2, global_step=40, epochs=0,
                       restarts=1, failures=[{k: v for k, v in event.to_record().items() if k != "kind"}])
    error = ray.train.WorkerGroupError("worker group failed", {1: WorkerFailure.from_exception(
        _cuda_error("uncorrectable ECC error encountered", 214), rank=1)})
    message = describe_failure(job, error, run_dir, result, None)
    assert "uncorrectable ECC error encountered" in message and f"ray drain-node --node-id {node}" in message


def test_a_gpu_fault_at_the_same_step_is_the_nodes_unless_another_node_raised_it_too():
    def fault(node):
        record = WorkerFailure.from_exception(_cuda_error("unspecified launch failure", 719), rank=0, step=12).record
        record.node_id = node
        return record

    before = fault("node-a")
    same_node, other_node = fault("node-a"), fault("node-b")
    faults.mark_repeats([same_node, other_node], [before])
    assert same_node.kind == INFRASTRUCTURE and not same_node.repeated  # the GPU is still broken
    assert other_node.kind == USER and other_node.repeated  # it follows the step: the program's


def test_errors_that_reach_the_controller_unwrapped_are_classified_alike():
    record = describe_ray_error(0, _cuda_error("uncorrectable ECC error encountered", 214), hang_timeout_s=30)
    assert record.kind == INFRASTRUCTURE and record.fault == faults.GPU
    assert record.error == "AcceleratorError: CUDA error: uncorrectable ECC error encountered"


# --- 3. another driver took the run over ----------------------------------------------------------

def _lease_lost(tmp_path):
    """LeaseLost as the first driver's writers get it, after a second driver took the run over."""
    run_dir = RunDir.of(str(tmp_path / "runs"), "taken")
    first = RunLease.acquire(run_dir)
    first.release()
    newer = RunLease.acquire(run_dir)
    return run_dir, newer, _raised(first.check)


def test_a_run_taken_over_by_another_driver_is_taken_over_not_a_bug_in_the_training_code(tmp_path):
    run_dir, newer, lost = _lease_lost(tmp_path)
    holder = f"generation 2 now holds it (host {newer.holder.host}, pid {newer.holder.pid})"

    def background_write_failed():  # how the checkpoint writer hands its error to the training thread
        raise RuntimeError(f"a background checkpoint write failed: LeaseLost: {lost}") from lost

    record = pickle.loads(pickle.dumps(WorkerFailure.from_exception(_raised(background_write_failed), 0, 20))).record
    assert record.kind == faults.TAKEN_OVER and record.error.startswith("LeaseLost: ") and holder in record.error
    peer = FailureRecord(1, INFRASTRUCTURE, "RuntimeError: Connection closed by peer")
    assert faults.overall([record, peer], None, False) == faults.TAKEN_OVER

    job = validate({"name": "taken", "torch": {"train_loop": "classify_jobs:train_loop", "max_epochs": 1}})
    line = RunWatcher(None, job, print)._format(Failure(classification=faults.TAKEN_OVER,
                                                        ranks=[record, peer]))
    assert "another driver took the run over" in line and "error in the training code" not in line
    error = ray.train.ControllerError(RunTakenOver(record.describe(), [record]))
    result = RunResult.from_events(job, run_dir.location, [Failure(classification=faults.TAKEN_OVER,
                                                                    ranks=[record])],
                                   ResumeChoice(None, None, "fresh run"), wall_seconds=1.0, error=error)
    message = describe_failure(job, error, run_dir.location, result, None)
    assert message.startswith("run 'taken' stopped on this driver: another driver took the run over")
    assert holder in message and "error in the training code" not in message and "Fix:" in message
    # The run directory is the newer driver's: its summary.json is not this driver's to write.
    assert result.status == faults.TAKEN_OVER
    write_summary(run_dir.location, result)
    assert not storage.exists(run_dir.summary)
    newer.release()


# --- 4. a DataLoader worker killed by the kernel's OOM killer ---------------------------------------

# torch's texts (torch/csrc/DataLoader.cpp: "is killed by signal: " and strsignal(3); a bus error adds advice).
LOADER_KILLED = "DataLoader worker (pid 1234) is killed by signal: Killed. "
LOADER_SEGFAULT = "DataLoader worker (pid 1234) is killed by signal: Segmentation fault. "
LOADER_BUS_ERROR = ("DataLoader worker (pid 1234) is killed by signal: Bus error. It is possible that dataloader's "
                    "workers are out of shared memory. Please try to raise your shared memory limit.")
CPU_NODE = ("7c1e9a" * 9 + "00", "cpu-node-3", 5151)
MEMORY_FIXES = ("num_workers", "prefetch_factor", "data.<source>.batch_size", "data.<source>.window",
                "scaling.resources_per_worker", "nodes with more memory")


class _Stalls(torch.utils.data.Dataset):
    """Sample 0 is the loader worker's own pid; every later one takes a minute (it is killed meanwhile)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index:
            time.sleep(60)
        return os.getpid()


def _kill_a_loader_worker(sig: signal.Signals, timeout: float = 0) -> RuntimeError:
    """torch's own error for a DataLoader worker killed by `sig` while the loop waits for its batch."""
    batches = iter(torch.utils.data.DataLoader(_Stalls(), batch_size=1, num_workers=1, timeout=timeout))
    try:
        os.kill(int(next(batches)[0]), sig)
        next(batches)
    except RuntimeError as exc:  # torch's SIGCHLD handler may raise it at any line after the kill
        return exc
    raise AssertionError("the loader did not notice its worker's death")


def _in_a_training_thread(function):
    """Call `function` as a Ray Train worker runs the training loop: in a thread other than the main
    one, where torch's SIGCHLD handler never acts (torch installs it only from the main thread; one
    an earlier loader of this process installed is set aside meanwhile)."""
    done = []
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        thread = threading.Thread(target=lambda: done.append(function()))
        thread.start()
        thread.join()
    finally:
        signal.signal(signal.SIGCHLD, previous)
    return done[0]


def _memory_job():
    return validate({"name": "oom", "torch": {"train_loop": "classify_jobs:train_loop", "max_epochs": 1}})


def test_a_dataloader_worker_killed_by_sigkill_is_the_nodes_memory_retried_naming_the_rank_node_and_fix():
    exc = _raised(lambda: _throw(RuntimeError(LOADER_KILLED)))
    failure = WorkerFailure.from_exception(exc, rank=2, step=40)
    # Retried every time (until failure.max_failures): memory use differs from attempt to attempt.
    assert failure.kind == INFRASTRUCTURE and failure.record.fault == faults.MEMORY and not failure.record.signature
    assert failure.record.error == f"RuntimeError: {LOADER_KILLED.strip()}"

    decision = classify_failure({2: failure}, _view({2: CPU_NODE}), hang_timeout_s=30)
    assert decision.kind == INFRASTRUCTURE and decision.end is None
    note = decision.records[0].note
    assert note.startswith("a DataLoader worker of rank 2 was killed by SIGKILL, most likely by the kernel's OOM "
                           f"killer: node {CPU_NODE[0]} (host cpu-node-3) ran out of memory")
    assert all(fix in note for fix in MEMORY_FIXES), note
    line = RunWatcher(None, _memory_job(), print)._format(decision.event())
    assert line.startswith(f"failure (infrastructure): rank 2 (node {CPU_NODE[0][:12]}, host cpu-node-3, pid 5151)")
    assert "OOM killer" in line and line.endswith("restarting from the newest committed checkpoint")

    # Where the controller does not know the rank's node, the note says where to look.
    unplaced = classify_failure({2: failure}, _view({}), hang_timeout_s=30).records[0].note
    assert "rank 2 was killed by SIGKILL" in unplaced and "its node (unknown here" in unplaced
    # The same error reaching the controller unwrapped (pickled, without its traceback) is classified alike.
    unwrapped = describe_ray_error(2, pickle.loads(pickle.dumps(RuntimeError(LOADER_KILLED))), hang_timeout_s=30)
    assert unwrapped.kind == INFRASTRUCTURE and unwrapped.fault == faults.MEMORY


@pytest.mark.parametrize("text", [LOADER_SEGFAULT, LOADER_BUS_ERROR])
def test_a_dataloader_worker_killed_by_another_signal_is_the_users_and_not_retried(text):
    failure = WorkerFailure.from_exception(_raised(lambda: _throw(RuntimeError(text))), rank=2, step=40)
    assert failure.kind == USER and not failure.record.fault
    decision = classify_failure({2: failure}, _view({2: CPU_NODE}), hang_timeout_s=30)
    assert decision.kind == USER and isinstance(decision.end, UserCodeFailed) and not decision.records[0].note
    assert decision.end.message.startswith(f"rank 2: RuntimeError: {text.strip()}")


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "training thread"])
def test_a_real_dataloader_worker_sigkilled_is_classified_as_memory_and_one_segfaulted_as_the_users(in_thread):
    # In the main thread torch's SIGCHLD handler names the signal; in a training thread (as in a Ray
    # Train worker) torch says only "exited unexpectedly", after the loader's timeout (else 5 s).
    kill = (lambda sig: _in_a_training_thread(lambda: _kill_a_loader_worker(sig, timeout=1))) if in_thread \
        else _kill_a_loader_worker
    killed = kill(signal.SIGKILL)
    assert faults.dataloader_worker_signal(killed) == signal.SIGKILL
    failure = WorkerFailure.from_exception(killed, rank=1, step=3)
    assert failure.kind == INFRASTRUCTURE and failure.record.fault == faults.MEMORY
    assert failure.record.error.startswith("RuntimeError: DataLoader worker (pid")
    assert "Killed" in failure.record.error  # torch's "killed by signal: Killed." or our "(killed by SIGKILL: Killed)"
    note = classify_failure({1: failure}, _view({1: CPU_NODE}), hang_timeout_s=30).records[0].note
    assert "rank 1 was killed by SIGKILL" in note and "cpu-node-3" in note

    segfault = WorkerFailure.from_exception(kill(signal.SIGSEGV), rank=1, step=3)
    assert segfault.kind == USER and not segfault.record.fault
    assert "Segmentation fault" in segfault.record.error
