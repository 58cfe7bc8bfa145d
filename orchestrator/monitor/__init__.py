"""Runs in Ray actors beside the driver, never in it: the run monitor and Ray Train's controller.

    actor.py       the run monitor actor (started by the driver): events, heartbeats, the typed protocol
    attempts.py    the in-place restarts of every rank, decided in the monitor
    watchdog.py    hang detection from the ranks' heartbeats, in the monitor
    stragglers.py  the rank whose own work a step stays above its peers', named from the same beats
    classifier.py     classifies each failure of a worker group
    group_failure.py  the one handler of a failed group: Ray Train's controller callback (it runs
                      in Ray Train's controller actor) and local mode's agent loop call it
"""
