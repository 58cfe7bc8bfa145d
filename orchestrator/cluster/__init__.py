"""Runs in the driver: its connection to Ray (an existing cluster, an embedded one, the warm one of
`orchestrator up`), the environment it keeps Ray in (loopback), capacity, and its records.

    connection.py   connecting to Ray: an existing cluster, or an embedded one that cleans up after itself
    environment.py  keeping the driver's Ray on loopback, decided before Ray is imported
    own_address.py  every process of a run's job names its own cluster in RAY_ADDRESS
    capacity.py     what a run's workers need from the cluster, and how many its nodes hold
    warm.py         `orchestrator up` / `down`: a warm local cluster kept between runs
    records.py      the driver's records of the clusters it started and of itself
    reaper.py       the keeper an embedded cluster's `ray start` runs under (a process of its own)
"""
