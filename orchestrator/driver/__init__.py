"""Runs in the driver process alone: the one resume decision, launch, the console, stop signals and
the Ray and torch timeouts a run is given.

    launch.py            the driver: spec, checkpoint choice, Ray or local mode, progress, summary.json
    resume.py            which checkpoint a run starts from, and why (the driver's half of resume_from)
    local.py             local mode: the node's agent in this process, without Ray
    attempt.py           the worker group watched from the driver, to the run's end
    console.py           what the driver prints while a run goes on, and when it fails
    signals.py           how a driver is stopped from outside: Ctrl-C, `ray job stop`, SIGTERM
    failure_timeouts.py  the Ray and torch timeouts set in the driver's environment
"""
