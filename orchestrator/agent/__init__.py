"""Runs in each Ray Train worker: a node's agent, which starts the node's K rank children and
restarts them in place (torchelastic's model: agents survive, ranks restart), for every runtime.

    worker.py          the function Ray Train runs in each worker: the agent's entry point
    group.py           where the agent stands in its group: Ray Train's worker context, or local mode's
    supervisor.py      the agent: attempts of K children, heartbeats, verdicts, logs
    children.py        the K child processes of one attempt: torchrun's environment, output, stacks, stopping
    rank_start.py      what a script's rank is started with: command, directory, environment
    session_ranks.py   what differs for a ctx or Lightning job's ranks: their start, their calls to the agent
    spares.py          the next attempt's rank processes, started ahead of need
    sessions.py        a rank's processes, found by its session and ended with it
    outcome.py         what a rank child's end says, as the agent reports it
    echo.py            rank 0's output on its way to the driver's console, in batches
    flight_records.py  torch's flight recorder, taken from each rank at a hang verdict
    rank_signals.py    a ctx or Lightning rank's SIGTERM from outside, passed on as the run's stop

The agent knows nothing of torchrun beyond the environment it gives: a script's ranks
(rank/script/bootstrap.py) and the ctx and Lightning harnesses (rank/rank_main.py) run as its children
alike, with no Ray threads beside training.
"""
