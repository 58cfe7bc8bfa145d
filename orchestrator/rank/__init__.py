"""Runs in each rank child of a node's agent (a process with torchrun's environment and no Ray).

    script/         a torchrun script's rank (and a spare waiting to become one): bootstrap.py runs it as __main__
    rank_main.py    a ctx or Lightning job's rank: reads its config, runs torch/ or lightning/
    session.py      what the two harnesses share: identity, the group's resume point, saving, reporting
    torch/          the plain-PyTorch path: train_loop(ctx) and its TrainState (train_state.py)
    lightning/      the Lightning path: an unchanged LightningModule under Lightning's own loop, its
                    state in Lightning's checkpoint dict (with the same Progress), not a TrainState
    agent_link.py   how a rank reaches the run monitor: through its agent, over a Unix socket
    heartbeat.py, cadence.py, collectives.py, identity.py, rng.py, snapshot.py, sharding.py, ...
"""
