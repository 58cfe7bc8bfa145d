"""Raw Ray Train, for bench/startup.py: ray.init(), a TorchTrainer with 2 workers taking one
optimizer step (bench/startup_job.py), and exit, written as Ray Train's docs write it (Ray's
defaults: dashboard included).

    python bench/startup_raw.py FIRST_STEP_FILE STORAGE_DIR
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from bench.startup_job import raw_train_func

if __name__ == "__main__":
    first_step_file, storage = sys.argv[1], sys.argv[2]
    ray.init()
    TorchTrainer(raw_train_func, train_loop_config={"first_step_file": first_step_file},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=storage)).fit()
    ray.shutdown()
