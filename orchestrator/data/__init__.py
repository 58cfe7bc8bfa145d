"""Training data: one global, world-size-independent order of samples per epoch. Runs in the
driver (its input check) and in the ranks (loading).

    order.py    the epoch's global order and each rank's slice of every global batch
    parquet.py  Parquet input, streamed: a map-style dataset over the rows of one or many files
    seeded.py   random augmentations in DataLoader workers that resume exactly
    sources.py  the spec's data sources opened as Parquet, and the driver's check before Ray starts
"""
