"""Runs in each Ray Train worker: a node's agent, which starts the node's K rank children and
restarts them in place (torchelastic's model: agents survive, ranks restart), for every runtime.

    worker.py           the function Ray Train runs in each worker: the agent's entry point
    supervisor.py       the agent: attempts of K children, heartbeats, verdicts, logs, for every kind
    launcher.py         what the agent needs of a kind of rank: a launcher and a liveness
    kinds.py            each kind of job's launcher and liveness: the one place that asks the kind
    rank_start.py       a script's ranks: their command, directory, environment, the stop as SIGTERM
    script_liveness.py  a script's ranks' beats, progress and end, which the agent measures and says
    session_ranks.py    a ctx or Lightning job's ranks: their start, their calls to the agent, their beats
    rank_env.py         the one environment recipe of every rank: threads, niceness, buffering
    children.py         the K child processes of one attempt: torchrun's environment, output, stacks, stopping
    spares.py           the next attempt's rank processes, started ahead of need
    sessions.py         a rank's processes, found by its session and ended with it
    outcome.py          what a rank child's end says, as the agent reports it
    group.py            where an agent stands in its group: its index, node, ranks' address, devices
    echo.py             rank 0's output on its way to the driver's console
    flight_records.py   torch's flight recorder's last collectives of each rank, at a hang
    rank_signals.py     a ctx or Lightning rank's SIGTERM from outside, passed on as the run's stop

The agent knows nothing of torchrun beyond the environment it gives: a script's ranks
(rank/script/bootstrap.py) and the ctx and Lightning harnesses (rank/rank_main.py) run as its children
alike, with no Ray threads beside training.
"""
