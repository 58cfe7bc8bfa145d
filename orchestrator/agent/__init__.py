"""Runs in each Ray Train worker: a node's agent, which starts the node's K rank children and
restarts them in place (torchelastic's model: agents survive, ranks restart), for every runtime.

    worker.py         the function Ray Train runs in each worker: the agent's entry point
    supervisor.py     the agent: attempts of K children, heartbeats, verdicts, logs
    children.py       the K child processes of one attempt: torchrun's environment, output, stacks, stopping
    rank_start.py     what a script's rank is started with: command, directory, environment
    session_ranks.py  what differs for a ctx or Lightning job's ranks: their start, their calls to the agent
    spares.py         the next attempt's rank processes, started ahead of need
    sessions.py       a rank's processes, found by its session and ended with it
    outcome.py        what a rank child's end says, as the agent reports it

The agent knows nothing of torchrun beyond the environment it gives: a script's ranks
(rank/script/bootstrap.py) and the ctx and Lightning harnesses (rank/rank_main.py) run as its children
alike, with no Ray threads beside training.
"""
