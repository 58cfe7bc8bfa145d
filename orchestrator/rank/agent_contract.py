"""What a rank child and its node's agent agree on: the beat file's layout, the variables the agent
sets for each rank, the marks beside a rank's failure file, and the exit status of a rank that ends
itself on the run monitor's order.

Standard library only, and no import of the package: script/bootstrap.py loads it by its path (in a
user's torchrun script process, before the script's own imports); the agent's modules import it as
`orchestrator.rank.agent_contract`.
"""

import struct

# The beat file a rank's bootstrap writes and its agent reads every second: optimizer steps taken,
# time.monotonic() of the last one, the median seconds between consecutive steps (0 before the
# second), time.monotonic() of the stack's last move, the median seconds of the rank's own work in
# a step (0 before it is known).
BEAT_LAYOUT = struct.Struct("<qdddd")
# Its parts as the bootstrap writes them: the first three at each optimizer step, at offset 0; the
# stack's last move and the work a step, one number each, at their offsets.
STEP_LAYOUT, SECONDS = struct.Struct("<qdd"), struct.Struct("<d")
STACK_OFFSET, WORK_OFFSET = 24, 32

# The variables: the rank's beat file; its failure file (the JSON of an uncaught exception, a
# FailureRecord's, failures.py); the signal that dumps its stacks on a hang verdict; its agent's
# pid (the rank dies with it); the niceness it takes; its flight recorder's signal and file.
BEAT_FILE_VAR = "ORCHESTRATOR_BEAT_FILE"
FAILURE_FILE_VAR = "ORCHESTRATOR_FAILURE_FILE"
STACK_SIGNAL_VAR = "ORCHESTRATOR_STACK_SIGNAL"
AGENT_PID_VAR = "ORCHESTRATOR_SUPERVISOR_PID"
NICENESS_VAR = "ORCHESTRATOR_NICENESS"
FR_SIGNAL_VAR, FR_FILE_VAR = "ORCHESTRATOR_FR_SIGNAL", "ORCHESTRATOR_FR_FILE"

# Beside the failure file: the rank's training raised and its process is on its way out (the
# agent beats "finishing" for it and ends it after its grace); the script ran to its end (a crash
# after it, in the interpreter's teardown, is no failure); the rank was sent SIGTERM from outside,
# once and again (stop_signal.py: the run's stop).
FAILING_SUFFIX = ".failing"
RETURNED_SUFFIX = ".returned"
STOP_SUFFIX, STOP_AGAIN_SUFFIX = ".stop", ".stop-again"

# Exit status of a rank that ends itself because the run monitor said so (a stop's grace run out,
# the run taken over): its agent takes it as that order, never as the rank's failure.
HANG_EXIT_CODE = 75
