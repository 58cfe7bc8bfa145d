"""The torchrun path's logic without Ray: the command's flags, the environment each rank gets, the
run monitor's verdict on a round of ranks, and the bootstrap a rank's script runs under."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

import pytest
from conftest import REPO, run_cli, wait_for

from orchestrator.agent.children import BOOTSTRAP, LocalRanks, Placement
from orchestrator.cli import build_parser
from orchestrator.cli.torchrun import spec_from_args
from orchestrator.errors import SpecError, UserError
from orchestrator.failures import FailureRecord
from orchestrator.monitor.attempts import SETTLE_S, InPlaceAttempts
from orchestrator.protocol import FAIL, FINISH, RESTART, WAIT, AttemptState, Verdict, cause_order
from orchestrator.spec import resolve_spec

SEED = os.path.join("tests", "helpers", "torchrun_seed.py")


def _spec(*argv: str) -> dict:
    return spec_from_args(build_parser().parse_args(["torchrun", *argv]))


# --- the command ------------------------------------------------------------------------------


def test_torchruns_flags_in_both_spellings_become_the_spec_and_the_scripts_arguments_stay_untouched():
    spec = _spec("--nnodes", "2", "--nproc-per-node", "4", "--max_restarts", "5", "--env", "NCCL_DEBUG=INFO",
                 SEED, "--work_dir", "{run_dir}/work", "--nproc_per_node", "9", "-m", "x")
    assert re.fullmatch(r"torchrun_seed-[0-9a-f]{8}", spec["name"])  # the script's name and its path's hash
    assert spec["script"] == {"path": SEED, "args": ["--work_dir", "{run_dir}/work", "--nproc_per_node", "9", "-m", "x"],
                              "nproc_per_node": 4}
    assert spec["scaling"]["num_workers"] == 2 and spec["failure"] == {"max_failures": 5}
    assert spec["env"] == {"NCCL_DEBUG": "INFO"}
    job = resolve_spec(spec)
    # One Ray Train worker per node, holding its K ranks' CPUs.
    assert job.kind == "script" and job.scaling.num_workers == 2
    assert job.scaling.resources_per_worker == {"CPU": 4.0}


def test_an_elastic_node_range_and_a_module_and_rendezvous_flags_are_taken():
    spec = _spec("--nnodes=1:3", "--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv-endpoint", "head:29500",
                  "--standalone", "-m", "tests.helpers.torchrun_seed", "--epochs", "1")
    assert spec["scaling"]["num_workers"] == [1, 3]
    assert spec["script"]["module"] == "tests.helpers.torchrun_seed"
    assert re.fullmatch(r"torchrun_seed-[0-9a-f]{8}", spec["name"])
    job = resolve_spec(spec)
    assert (job.scaling.min_workers, job.scaling.num_workers) == (1, 3)


@pytest.mark.parametrize("argv, words", [
    (["--nproc_per_node", "many", SEED], ["--nproc_per_node 'many'", "whole number"]),
    (["--nnodes", "3:1", SEED], ["--nnodes '3:1'", "MIN:MAX"]),
    (["--env", "NOEQUALS", SEED], ["--env 'NOEQUALS'", "KEY=VALUE"]),
    (["--no-python", SEED], ["--no-python", "not supported"]),
])
def test_a_bad_flag_is_a_user_error_naming_it(argv, words):
    with pytest.raises(UserError) as caught:
        _spec(*argv)
    assert all(word in str(caught.value) for word in words), caught.value


def test_a_missing_script_or_module_is_refused_naming_where_it_was_looked_for():
    with pytest.raises(SpecError, match=r"'nope\.py' is not a file \(looked for .*nope\.py\)"):
        resolve_spec(_spec("nope.py"))
    with pytest.raises(SpecError, match=r"no module 'no_such_pkg.train' can be imported"):
        resolve_spec(_spec("-m", "no_such_pkg.train"))


@pytest.mark.parametrize("argv, words", [
    (["torchrun", "--nproc_per_node", "2", "missing_train.py", "--lr", "1"],
     ["'missing_train.py' is not a file", "Fix:"]),
    (["torchrun", "--nproc_per_node", "0", SEED], ["--nproc_per_node '0'", "Fix:"]),
    (["torchrun", "--bogus", SEED], ["unrecognized arguments: --bogus"]),
    # Only the script is missing: the script's arguments are optional.
    (["torchrun", "--nproc_per_node", "2"], ["no training script", "SCRIPT", "Fix:"]),
])
def test_bad_input_exits_2_with_one_paragraph_and_no_traceback_before_ray_starts(argv, words):
    done = run_cli(*argv, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(word in errors[0] for word in words), done.stderr
    assert "Traceback" not in done.stderr and "Ray" not in done.stdout


# --- the environment of a rank ----------------------------------------------------------------


def test_each_rank_gets_torchruns_variables_for_its_place_in_the_world():
    placement = Placement(group_rank=1, group_world_size=2, local_world_size=3, master_addr="10.0.0.1",
                          master_port=29511, attempt=3, max_restarts=5, run_id="seed")
    env = placement.torchrun_env(local_rank=2)
    assert env == {
        "RANK": "5", "LOCAL_RANK": "2", "GROUP_RANK": "1", "ROLE_RANK": "5", "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "6",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5", "TORCHELASTIC_RUN_ID": "seed", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "ORCHESTRATOR_ATTEMPT": "3",
    }


# --- the verdict on an attempt -----------------------------------------------------------------


def _attempts(max_restarts=3, workers=2) -> InPlaceAttempts:
    attempts = InPlaceAttempts(max_restarts)
    assert attempts.new_group(workers) == 1  # the run's first attempt
    return attempts


def test_a_signal_death_restarts_every_rank_at_once_and_counts_the_restart():
    attempts = _attempts()
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 1, "kind": "infrastructure", "decisive": True, "error": "killed by SIGKILL"}), 10.0)
    verdict = attempts.verdict(1, 10.0)
    assert verdict.action == RESTART and verdict.failure.rank == 1 and verdict.restarts == 1
    assert verdict.attempt == 2
    # Every node asking about that attempt hears the same; the next attempt starts clean.
    assert attempts.verdict(1, 99.0) == verdict
    assert attempts.state() == AttemptState(attempt=2, restarts=1, max_restarts=3)
    assert attempts.verdict(2, 11.0) == Verdict(WAIT)


def test_a_peers_communication_error_waits_for_the_bug_that_caused_it_and_the_bug_decides():
    attempts = _attempts()
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 0, "kind": "infrastructure", "error": "Connection closed by peer"}), 10.0)
    assert attempts.verdict(1, 10.0 + SETTLE_S / 2) == Verdict(WAIT)
    attempts.report(1, 1, FailureRecord.from_dict({"rank": 3, "kind": "user", "error": "ValueError: bad batch"}), 10.0 + SETTLE_S / 2)
    verdict = attempts.verdict(1, 10.0 + SETTLE_S / 2)
    assert verdict.action == FAIL and verdict.failure.rank == 3


def test_a_communication_error_alone_restarts_after_the_settling_time():
    attempts = _attempts()
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 0, "kind": "infrastructure", "error": "Connection reset by peer"}), 10.0)
    assert attempts.verdict(1, 10.0 + SETTLE_S + 0.01).action == RESTART


def test_restarts_in_place_and_of_the_group_share_one_budget():
    attempts = _attempts(max_restarts=2)
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 0, "kind": "hang", "decisive": True, "error": "stopped answering"}), 1.0)
    assert attempts.verdict(1, 1.0).action == RESTART
    assert attempts.new_group(2) == 3  # Ray Train replaced a lost node: the second restart, attempt 3
    assert attempts.restarts == 2 and attempts.exhausted
    attempts.report(3, 1, FailureRecord.from_dict({"rank": 2, "kind": "infrastructure", "decisive": True, "error": "killed"}), 5.0)
    verdict = attempts.verdict(3, 5.0)
    assert verdict.action == FAIL and verdict.exhausted


def test_a_scripts_own_nonzero_exit_restarts_in_place_as_under_torchrun_after_waiting_for_a_peers_bug():
    attempts = _attempts()
    exit_3 = FailureRecord.from_dict({"rank": 1, "kind": "exit", "decisive": False, "error": "the script exited with status 3 (sys.exit)"})
    attempts.report(1, 0, exit_3, 10.0)
    assert attempts.verdict(1, 10.0) == Verdict(WAIT)  # a peer's bug may be why it exited
    # Rank 0 then loses its peer in a collective: the consequence, not the cause.
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 0, "kind": "infrastructure", "error": "Connection closed by peer"}), 10.1)
    verdict = attempts.verdict(1, 10.0 + SETTLE_S + 0.01)
    assert verdict.action == RESTART and verdict.failure == exit_3 and verdict.restarts == 1


def test_late_reports_of_a_decided_attempt_are_ignored_and_a_replaced_group_is_told_so():
    attempts = _attempts()
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 0, "kind": "infrastructure", "decisive": True, "error": "killed"}), 1.0)
    decided = attempts.verdict(1, 1.0)
    assert decided.action == RESTART
    # Node 1's report of the same attempt arrives after the verdict: it changes neither that
    # verdict nor the next attempt's.
    attempts.report(1, 1, FailureRecord.from_dict({"rank": 3, "kind": "user", "error": "ValueError"}), 1.5)
    assert attempts.verdict(1, 2.0) == decided
    assert attempts.failures == [] and attempts.verdict(2, 2.0) == Verdict(WAIT)
    # Ray Train replaced the group: a supervisor of the old one asking about its attempt is told to stop.
    attempts.new_group(2)
    assert attempts.verdict(2, 3.0) == Verdict(FAIL, reason="this worker group was replaced")


def test_an_error_a_restart_in_place_brings_back_at_the_same_step_is_the_datas_and_fails_the_run():
    # Exact resume replays the same batch: a storage-looking error (one with a signature) at the
    # same step again is deterministic, so the second time it is the user's, not a third restart.
    attempts = _attempts()
    damaged = {"rank": 1, "kind": "infrastructure", "error": "ParquetReadError: row group 5", "step": 42,
               "signature": "abc123", "decisive": False}
    attempts.report(1, 1, FailureRecord.from_dict(damaged), 1.0)
    assert attempts.verdict(1, 1.0 + SETTLE_S + 0.01).action == RESTART
    attempts.report(2, 1, FailureRecord.from_dict(dict(damaged, step=43)), 5.0)  # another step: a hiccup again, restarted
    assert attempts.verdict(2, 5.0 + SETTLE_S + 0.01).action == RESTART
    attempts.report(3, 1, FailureRecord.from_dict(damaged), 9.0)
    verdict = attempts.verdict(3, 9.0)
    assert verdict.action == FAIL and verdict.failure.kind == "user" and verdict.failure.repeated
    assert "same step (42)" in verdict.failure.note


def test_a_run_another_driver_took_over_is_not_restarted_in_place():
    # A rank's commit found the lease another driver's: no restart would be this driver's to make.
    attempts = _attempts()
    attempts.report(1, 0, FailureRecord.from_dict({"rank": 0, "kind": "infrastructure", "decisive": False, "error": "Connection closed by peer"}),
                  1.0)
    attempts.report(1, 1, FailureRecord.from_dict({"rank": 1, "kind": "taken_over", "decisive": True, "error": "LeaseLost: generation 2"}), 1.1)
    verdict = attempts.verdict(1, 1.1)
    assert verdict.action == FAIL and verdict.failure.kind == "taken_over" and attempts.restarts == 0


def test_an_attempt_finishes_when_every_node_reports_its_ranks_exited_0():
    attempts = _attempts(workers=2)
    attempts.report(1, 0, None, 1.0)
    assert attempts.verdict(1, 1.0) == Verdict(WAIT)
    attempts.report(1, 1, None, 2.0)
    assert attempts.verdict(1, 2.0) == Verdict(FINISH)


# --- the bootstrap ----------------------------------------------------------------------------


def _bootstrap(tmp_path, source: str, *args: str, env: dict | None = None, wait: bool = True):
    script = tmp_path / "train.py"
    script.write_text(source)
    files = {"ORCHESTRATOR_BEAT_FILE": str(tmp_path / "beat"), "ORCHESTRATOR_FAILURE_FILE": str(tmp_path / "failure.json")}
    process = subprocess.Popen([sys.executable, BOOTSTRAP, str(script), *args], cwd=REPO, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, **files, **(env or {}), "RANK": "3"})
    if not wait:
        return process, files
    out, _ = process.communicate(timeout=60)
    return process.returncode, out, files


def test_the_script_runs_as_main_with_its_own_argv_and_file_and_no_ray_beside_it(tmp_path):
    code, out, _ = _bootstrap(tmp_path, (
        "import sys, json\n"
        "print(json.dumps({'name': __name__, 'argv': sys.argv, 'file': __file__, 'path0': sys.path[0],\n"
        "                  'ray': 'ray' in sys.modules, 'orchestrator': 'orchestrator' in sys.modules}))\n"),
        "--lr", "0.1", "{literal}")
    seen = json.loads(out.strip().splitlines()[-1])
    assert code == 0
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["--lr", "0.1", "{literal}"]
    assert seen["file"].endswith("train.py") and seen["path0"] == str(tmp_path)
    assert not seen["ray"] and not seen["orchestrator"]


def test_a_scripts_uncaught_exception_is_printed_classified_and_placed_at_its_line(tmp_path):
    code, out, files = _bootstrap(tmp_path, "def load():\n    raise KeyError('labels')\n\nload()\n")
    assert code == 1
    assert "Traceback (most recent call last)" in out and "KeyError: 'labels'" in out
    with open(files["ORCHESTRATOR_FAILURE_FILE"]) as f:
        record = json.load(f)
    assert record["kind"] == "user" and record["error"] == "KeyError: 'labels'"
    assert record["where"].endswith("train.py:2 in load")


def test_a_scripts_own_exit_status_is_kept_and_recorded(tmp_path):
    code, _, files = _bootstrap(tmp_path, "import sys\nsys.exit(3)\n")
    assert code == 3
    with open(files["ORCHESTRATOR_FAILURE_FILE"]) as f:
        # The script's own word, not a bug: restarted as torchrun restarts it (attempts.py).
        assert json.load(f) == {"kind": "exit", "error": "the script exited with status 3 (sys.exit)",
                                "where": "", "signature": ""}
    os.remove(files["ORCHESTRATOR_FAILURE_FILE"])
    assert not os.path.exists(files["ORCHESTRATOR_FAILURE_FILE"] + ".returned")
    code, _, files = _bootstrap(tmp_path, "import sys\nsys.exit(0)\n")
    assert code == 0 and not os.path.exists(files["ORCHESTRATOR_FAILURE_FILE"])
    # Ran to its end: a crash in the interpreter's teardown after this is not a failure of the script.
    assert os.path.exists(files["ORCHESTRATOR_FAILURE_FILE"] + ".returned")


def test_optimizer_steps_are_counted_through_torchs_global_hook_and_stacks_dump_on_the_signal(tmp_path):
    process, files = _bootstrap(tmp_path, (
        "import time, torch\n"
        "p = torch.nn.Parameter(torch.zeros(1))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "for _ in range(5):\n"
        "    opt.step()\n"
        "print('stepped', flush=True)\n"
        "def wait_here():\n"
        "    time.sleep(60)\n"
        "wait_here()\n"), wait=False)
    try:
        assert process.stdout.readline().strip() == "stepped"
        with open(files["ORCHESTRATOR_BEAT_FILE"], "rb") as f:
            steps, last = struct.unpack("<qd", f.read(16))
        assert steps == 5 and 0 <= time.monotonic() - last < 30
        time.sleep(0.5)
        process.send_signal(signal.SIGUSR2)
        # Every thread's stack (the bootstrap's liveness thread's too); the main thread's is the one asked for.
        dump = [process.stdout.readline() for _ in range(8)]
        assert any('train.py", line 8 in wait_here' in line for line in dump), dump
        # The dump is the hang verdict's: the rank ends by the signal right after it, taking no
        # further step (its restart follows).
        assert process.wait(timeout=10) == -signal.SIGUSR2
    finally:
        process.kill()
        process.wait()


def test_a_stopped_ranks_stack_is_taken_where_it_stopped_before_it_runs_on(tmp_path):
    """A SIGSTOPped rank is continued so that it can dump its stacks; its other threads run on too,
    and whichever thread took the signal, the named line must be where the main thread stopped,
    not where it got to after. (Five busy threads make a wrong thread likely on every try.)"""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, threading, time\n"
        "def spin():\n"
        "    while True:\n"
        "        sum(range(100))\n"
        "for _ in range(5):\n"
        "    threading.Thread(target=spin, daemon=True).start()\n"
        "def stuck_here():\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "def moved_on():\n"
        "    time.sleep(0.1)\n"
        "while True:\n"
        "    stuck_here()\n"
        "    moved_on()\n")
    placement = Placement(group_rank=0, group_world_size=1, local_world_size=1, master_addr="127.0.0.1",
                          master_port=29500, attempt=1, max_restarts=0, run_id="stacks")
    for _ in range(5):  # the rank ends with its dump (bootstrap.py): a new one each try
        ranks = LocalRanks([str(script)], cwd=str(tmp_path), base_env=dict(os.environ), placement=placement,
                           scratch=str(tmp_path / "scratch"), log_dir=str(tmp_path / "logs"))
        try:
            wait_for(ranks.children[0].stopped, timeout=30)
            assert ranks.dump_stacks(wait_s=10) == {0: "train.py:8 in stuck_here"}
            # ...and it ran no further: it ended by the dump's signal.
            assert ranks.children[0].process.wait(timeout=10) == -signal.SIGUSR2
        finally:
            ranks.stop()


# --- the spec's script: section -----------------------------------------------------------------


def test_a_spec_with_a_script_section_holds_its_nodes_ranks_resources_and_a_gpu_each():
    job = resolve_spec({"name": "s", "script": {"path": SEED, "args": ["--lr", 0.1], "nproc_per_node": 4},
                        "scaling": {"num_workers": [1, 2], "use_gpu": True}})
    assert job.kind == "script" and job.script.args == ["--lr", "0.1"] and job.ranks_per_worker == 4
    assert job.scaling.resources_per_worker == {"CPU": 4.0, "GPU": 4.0}
    assert (job.scaling.min_workers, job.scaling.num_workers) == (1, 2)
    own = resolve_spec({"name": "s", "script": {"module": "tests.helpers.torchrun_seed"},
                        "scaling": {"resources_per_worker": {"CPU": 1}}})
    assert own.scaling.resources_per_worker == {"CPU": 1}


@pytest.mark.parametrize("script, extra, words", [
    ({"path": SEED, "module": "x"}, {}, ["both of 'path' and 'module'", "Fix:"]),
    ({}, {}, ["neither of 'path' and 'module'"]),
    ({"path": SEED, "nproc_per_node": 0}, {}, ["script.nproc_per_node", "at least 1"]),
    ({"path": SEED, "args": [["nested"]]}, {}, ["script.args[0]", "must be a string"]),
    ({"path": SEED}, {"torch": {"train_loop": "jobs.digits_torch:train_loop", "max_epochs": 1}},
     ["both 'torch:' and 'script:'", "exactly one"]),
    ({"path": SEED}, {"data": {"train": {"path": "x.parquet"}}}, ["both 'script:' and 'data:'", "reads its own data"]),
    ({"path": SEED}, {"scaling": {"global_batch_size": 64}}, ["scaling.global_batch_size", "sizes its own batches"]),
])
def test_a_bad_script_section_names_the_field_and_the_fix(script, extra, words):
    with pytest.raises(SpecError) as caught:
        resolve_spec({"name": "s", "script": script, **extra})
    assert all(word in str(caught.value) for word in words), caught.value


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a niceness needs the privilege (root here, CAP_SYS_NICE)")
def test_a_rank_takes_the_users_niceness_instead_of_the_one_ray_gives_its_workers(tmp_path):
    script = tmp_path / "nice.py"
    script.write_text("import os\nprint(os.nice(0))\n")
    done = subprocess.run([sys.executable, BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ORCHESTRATOR_NICENESS": "2"}, preexec_fn=lambda: os.nice(15))
    assert done.stdout.strip() == "2", done.stdout + done.stderr



# --- rank 0's output on its way to the console ---------------------------------------------------


def test_rank_0s_output_is_held_bounded_until_the_driver_takes_it_and_then_forgotten():
    """A script printing for a day costs the run monitor no memory: it holds at most a bounded
    backlog (the oldest lines dropped and counted), and nothing once the driver took it."""
    from orchestrator.monitor.actor import OutputBuffer

    buffer = OutputBuffer(held=100)
    buffer.add([f"line {i}" for i in range(60)])
    assert buffer.take() == ([f"line {i}" for i in range(60)], 0)
    assert buffer.take() == ([], 0)
    for start in range(0, 250, 50):  # the console fell behind: 250 lines, 100 held
        buffer.add([f"line {i}" for i in range(start, start + 50)])
    lines, dropped = buffer.take()
    assert lines == [f"line {i}" for i in range(150, 250)] and dropped == 150


def test_of_two_ranks_of_one_node_that_ended_the_signal_death_is_the_cause_not_its_peers_lost_connection():
    """The agent may see rank 0's lost connection and rank 1's SIGKILL in one look: it reports
    rank 1's, as the monitor would choose between nodes."""
    peer = FailureRecord.from_dict({"rank": 0, "kind": "infrastructure", "decisive": False, "error": "Connection closed by peer"})
    killed = FailureRecord.from_dict({"rank": 1, "kind": "infrastructure", "decisive": True, "error": "killed by SIGKILL"})
    exited = FailureRecord.from_dict({"rank": 2, "kind": "exit", "decisive": False, "error": "exited with status 3"})
    assert min([peer, killed, exited], key=cause_order) == killed
    assert min([peer, exited], key=cause_order) == exited
    # Of two errors alike, the one that does not say a peer went away is the cause, whatever its rank.
    reset = FailureRecord.from_dict({"rank": 1, "kind": "infrastructure", "decisive": False, "error": "ConnectionResetError: the NIC failed"})
    assert min([peer, reset], key=cause_order) == reset
