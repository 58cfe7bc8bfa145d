"""The specs the resume tests train: small digits jobs whose interrupted runs must end with the
same weights as their clean runs. A fault (tests/helpers/faulty.py) changes when a process dies, never
what is trained."""

from __future__ import annotations

# 1297 training samples / 2 ranks / 32 per batch -> 21 optimizer steps an epoch.
STEPS_PER_EPOCH = 21


def torch_spec(name, storage_dir, loop="jobs.digits_torch:train_loop", fault=None, every=10, **config):
    cfg = {"hidden": 64, "lr": 0.05, "batch_size": 32, **config}
    if fault:
        cfg["fault"] = fault
    return {
        "name": name, "storage": str(storage_dir), "seed": 0,
        "torch": {"train_loop": loop, "max_epochs": 3, "config": cfg},
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": every, "keep_last": 2},
        "failure": {"max_failures": 2},
    }


def lightning_spec(name, storage_dir, model_class="jobs.digits.DigitsClassifier", **model_args):
    return {
        "name": name, "storage": str(storage_dir), "seed": 0,
        "lightning": {
            "model": {"class_path": model_class, "init_args": {"hidden": 64, "lr": 0.002, **model_args}},
            "data": {"class_path": "jobs.digits.DigitsData", "init_args": {"batch_size": 32}},
            "trainer": {"max_epochs": 3},
        },
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": 10, "keep_last": 2},
        "failure": {"max_failures": 2},
    }
