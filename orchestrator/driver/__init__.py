"""Runs in the driver: the one resume decision, launch, the run monitor and its hang watchdog,
the console, signals, recovery settings and preflight checks (doctor)."""
