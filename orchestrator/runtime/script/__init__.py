"""A node's agent and its rank children, supervised in place (torchelastic's model: agents survive, ranks restart).

    supervisor.py     the Ray Train worker of one node (its agent): attempts of K children, heartbeats, verdicts, logs
    children.py       the K child processes of one attempt: torchrun's environment, output, stacks, stopping
    bootstrap.py      what each child runs: the script (or runtime/rank_main.py) as __main__, with the
                      optimizer-step hook and faulthandler; imports neither Ray nor the orchestrator first
    session_ranks.py  what differs for a ctx or Lightning job's ranks: their start, their calls to the agent

The supervisor knows nothing of torchrun beyond the environment it gives: a script's ranks, and
the ctx and Lightning harnesses (runtime/rank_main.py), run as its children alike, with no Ray
threads beside training.
"""
