"""A torchrun script's ranks, supervised in place (torchelastic's model: agents survive, workers restart).

    supervisor.py  the Ray Train worker of one node: rounds of K children, heartbeats, verdicts, logs
    children.py    the K child processes of one round: torchrun's environment, output, stacks, stopping
    bootstrap.py   what each child runs: the script as __main__, with the optimizer-step hook and
                   faulthandler; imports neither Ray nor the orchestrator before the script runs

The supervisor knows nothing of torchrun beyond the environment it gives: the ctx and Lightning
harnesses could run as its children too, restarting in place, with no Ray threads beside training.
"""
