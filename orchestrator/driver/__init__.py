"""Runs in the driver process alone: the one resume decision, launch, the console, stop signals and
the Ray and torch timeouts a run is given (failure_timeouts.py)."""
