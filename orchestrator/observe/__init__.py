"""What a run reports: metrics (the monitor's and agents' `ray.util.metrics`), goodput, and
summary.json, the result the driver writes and `orchestrator status` reads."""
