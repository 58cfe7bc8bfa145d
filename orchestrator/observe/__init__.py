"""What a run reports: metrics (the monitor's and agents' `ray.util.metrics`), goodput, and
summary.json, the result the driver writes and `orchestrator status` reads.

    metrics.py        the run's metrics for Prometheus, Grafana and Ray's dashboard
    local_metrics.py  a local run's own Prometheus endpoint, with the same series
    goodput.py        how much of the wall time went into steps whose work reached the final weights
    result.py         the typed outcome of a run, and summary.json, its form on disk
    history.py        one file per driver of a run, for `orchestrator report`
"""
