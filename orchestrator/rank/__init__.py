"""Runs in each rank child of a node's agent (a process with torchrun's environment and no Ray).

    script/          a torchrun script's rank (and a spare waiting to become one): script/bootstrap.py runs it
    rank_main.py     a ctx or Lightning job's rank: reads its config, runs torch/ or lightning/
    session.py       what the two harnesses share: identity, the group's resume point, saving, reporting
    train_state.py   what makes a resume exact: Progress, and the plain-torch path's TrainState
    torch/           the plain-PyTorch path: train_loop(ctx)
    lightning/       the Lightning path: an unchanged LightningModule under Lightning's own loop, its
                     state in Lightning's checkpoint dict (with the same Progress), not a TrainState
    sharding.py      FSDP on the plain-torch path, and a sharded state resharded to another world size
    snapshot.py      the in-memory copy of the state, the only part of an async save the loop waits for
    cadence.py       when to checkpoint: every N steps or seconds, and at a coming preemption
    agent_link.py    how a rank reaches the run monitor: through its agent, over a Unix socket
    heartbeat.py     what the training thread is doing, sent every second
    agent_contract.py what a rank and its agent agree on: the beat file, variables, failure marks, exit status
    collectives.py   small CPU collectives for the orchestrator's own coordination
    identity.py      who this rank is, from torchrun's variables; its devices
    rng.py           seeding, and each rank's random state captured and restored
    fingerprint.py   one hash of a model's weights, to compare runs
    metric_values.py metrics as plain floats
    batches.py       helpers over a batch of any shape
    scratch.py       a rank's scratch folders in the machine's temporary directory
    build_lock.py    a rank waiting on torch's extension build lock that no build holds
    stop_signal.py   SIGTERM from outside: the run's stop, not the rank's end
    spare.py         a spare's wait for its attempt (loaded by path by the bootstrap)
"""
