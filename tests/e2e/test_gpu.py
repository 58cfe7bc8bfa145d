"""The GPU paths: the GPT job with NCCL and bf16-mixed under each Lightning strategy, saved and
resumed through the store; ddp on Ray (an embedded cluster: Ray Train's workers with NCCL), fsdp and
deepspeed in local mode (a one-node run's default). Skipped where torch sees no CUDA device (CI
has none).

Throughput against plain Lightning on the same GPUs is a benchmark, not a test:
`python bench/lightning_gpt.py --gpu`.
"""

from __future__ import annotations

import math

import pytest
import torch

import orchestrator
from orchestrator.checkpoint import CheckpointStore


def why_no_gpu() -> str | None:
    """What this Python lacks for the GPU tests, and how to get it; None when it has a GPU."""
    if torch.version.cuda is None:
        return (f"needs a CUDA build of torch and a GPU; this torch ({torch.__version__}) is a CPU build. On a GPU "
                "host, install torch from PyTorch's CUDA index first, then the project (README: 'On GPUs')")
    if not torch.cuda.is_available():
        return (f"needs a CUDA GPU (NCCL, bf16); torch {torch.__version__} (CUDA {torch.version.cuda}) sees none: "
                "check nvidia-smi and CUDA_VISIBLE_DEVICES")
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_no_gpu() is not None, reason=why_no_gpu() or "")]


def needs_deepspeed(strategy: str, mode: str):
    if strategy != "deepspeed":
        return pytest.param(strategy, mode, id=strategy)
    import importlib.util

    missing = importlib.util.find_spec("deepspeed") is None
    return pytest.param(strategy, mode, id=strategy, marks=pytest.mark.skipif(
        missing, reason="strategy deepspeed needs DeepSpeed: pip install -e '.[deepspeed]'"))


# Each strategy's path: ddp on Ray, where Ray Train forms its workers' NCCL group; the others as a
# one-node run goes by default, in local mode.
MODES = {"ddp": "ray", "fsdp": "auto", "deepspeed": "auto"}
FIRST_LINE = {"ray": "on Ray (--ray)", "auto": "local mode: one node"}


def gpt_spec(name, storage, strategy, max_steps):
    workers = min(2, torch.cuda.device_count())
    return {
        "name": name, "storage": str(storage), "seed": 0,
        "lightning": {
            "model": {"class_path": "jobs.gpt.GPT",
                      "init_args": {"block_size": 128, "n_layer": 4, "n_head": 4, "n_embd": 256, "lr": 0.003,
                                    "warmup_steps": 10, "max_lr_steps": 200}},
            "data": {"class_path": "jobs.gpt.TextData", "init_args": {"block_size": 128, "batch_size": 32}},
            "trainer": {"max_steps": max_steps, "precision": "bf16-mixed", "strategy": strategy,
                        "gradient_clip_val": 1.0, "limit_val_batches": 4, "val_check_interval": 20},
        },
        "scaling": {"num_workers": workers, "use_gpu": True, "resources_per_worker": {"CPU": 1, "GPU": 1}},
        "checkpoint": {"every_n_steps": 10},
    }


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("strategy", "mode"), [needs_deepspeed(s, m) for s, m in MODES.items()])
def test_the_gpt_job_trains_on_gpus_with_nccl_and_bf16_and_resumes_from_its_checkpoint(tmp_path, strategy, mode):
    said: list[str] = []
    first = orchestrator.run(gpt_spec("gpt", tmp_path, strategy, 30), mode=mode, console=said.append)
    assert first.status == "finished", first.error
    assert said[0].startswith(FIRST_LINE[mode]), said[:3]
    assert math.isfinite(first.metrics["loss"]) and first.metrics["loss"] < math.log(100)

    again = orchestrator.run(gpt_spec("gpt", tmp_path, strategy, 50), mode=mode, console=said.append)
    assert again.status == "finished", again.error
    assert again.resumed_from["step"] == 30 and again.global_step == 50
    newest = CheckpointStore.for_run(again.run_dir).committed()[-1]
    assert newest.step == 50 and newest.manifest.strategy == strategy
