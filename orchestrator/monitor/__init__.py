"""Runs in Ray actors beside the driver (a local run: in its process): the run monitor and Ray Train's controller.

    actor.py              the run monitor actor (started by the driver from the failure spec): events,
                          heartbeats, the typed protocol
    attempts.py           the in-place restarts of every rank, decided in the monitor
    watchdog.py           hang detection from the ranks' heartbeats, in the monitor
    collectives.py        at a hang, the rank whose last collective differs from its peers'
    stragglers.py         the rank whose own work a step stays above its peers', named from the same beats
    series.py             each rank's steps over time, for `orchestrator report`
    classifier.py         classifies each failure of a worker group
    group_failure.py      the one handler of a failed group: Ray Train's controller callback (it runs
                          in Ray Train's controller actor) and local mode's agent loop call it
    controller_errors.py  the errors the controller ends a run with, which the driver reads
"""
