"""Runs in the driver: its connection to Ray (an existing cluster, an embedded one, the warm one of
`orchestrator up`), the environment it keeps Ray in (loopback), capacity, and its records. The
embedded cluster's `ray start` runs under reaper.py, a process of its own."""
