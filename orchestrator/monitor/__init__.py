"""Runs in Ray actors beside the driver, never in it (in local mode, objects in the command's
process): the run monitor and Ray Train's controller callback.

    actor.py        the run monitor actor (started by the driver): events, heartbeats, the typed protocol
    attempts.py     the in-place restarts of every rank, decided in the monitor
    watchdog.py     hang detection from the ranks' heartbeats, in the monitor
    stragglers.py   the rank whose own work a step stays above its peers', named from the same beats
    series.py       each rank's steps over time, for `orchestrator report`
    collectives.py  the rank whose last collective differs from its peers', at a hang
    classifier.py   Ray Train's controller callback: classifies each failure of a worker group
                    (it runs in Ray Train's controller actor)
"""
