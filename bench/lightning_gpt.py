"""The GPT job through the orchestrator ÷ the same LightningModule under plain Lightning with torchrun.

Same model (jobs/gpt.py), data, batch, precision and world size, measured in one invocation,
alternating the two for a few rounds and taking the median of the rounds' ratios. Samples/s are
timed on rank 0 by the same callback in both (bench.lightning_gpt_timer), from optimizer step
`--warmup` to the last one, so start-up is not mixed into the ratio. Goal: ratio >= 0.98.

    python bench/lightning_gpt.py [--rounds 2] [--steps 60] [--warmup 15] [--workers 2]
    python bench/lightning_gpt.py --gpu [--workers N]     # NCCL, bf16-mixed, a larger GPT

The baseline is how Lightning users run DDP by hand: `torchrun --nproc_per_node=N script.py`,
with `Trainer(devices=N, strategy="ddp")` (Lightning takes the ranks from torchrun). A third arm,
Ray Train with Lightning as Ray documents it (no orchestrator), separates what Ray costs from
what the orchestrator adds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMER = "bench.lightning_gpt_timer.StepTimer"


def model_args(gpu: bool) -> dict:
    if gpu:  # scaled by the spec only, as jobs/gpt.py's runbook says
        return {"block_size": 256, "n_layer": 8, "n_head": 8, "n_embd": 512, "lr": 0.001, "warmup_steps": 20,
                "max_lr_steps": 1000}
    return {"block_size": 128, "n_layer": 4, "n_head": 4, "n_embd": 128, "lr": 0.003, "warmup_steps": 20,
            "max_lr_steps": 420}


def settings(args) -> dict:
    return {"model": model_args(args.gpu), "block_size": model_args(args.gpu)["block_size"],
            "batch_size": args.batch_size or (64 if args.gpu else 16), "max_steps": args.steps + args.warmup,
            "warmup": args.warmup, "precision": "bf16-mixed" if args.gpu else "32-true", "gpu": args.gpu}


def baseline(args, out: str) -> dict:
    config = json.dumps({**settings(args), "out": out, "workers": args.workers})
    subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.workers}",
                    "--master_port=29544", os.path.join(REPO, "bench", "lightning_gpt_baseline.py"), config],
                   check=True, cwd=REPO, capture_output=True, text=True,
                   env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    with open(out) as f:
        return json.load(f)


def ray_train(args, out: str, storage: str, index: int) -> dict:
    """Ray Train with Lightning as Ray documents it (RayDDPStrategy, RayLightningEnvironment,
    prepare_trainer), without the orchestrator: what Ray itself costs, apart from what we add."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config = {**settings(args), "out": out}
    trainer = TorchTrainer(
        _ray_train_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpu,
                                     resources_per_worker={"CPU": 1, "GPU": 1} if args.gpu else {"CPU": 1}),
        run_config=RunConfig(name=f"ray-gpt-{index}", storage_path=storage))
    ray.init(ignore_reinit_error=True, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    try:
        trainer.fit()
    finally:
        ray.shutdown()
    with open(out) as f:
        return json.load(f)


def _ray_train_loop(s: dict) -> None:
    import lightning.pytorch as pl
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from bench.lightning_gpt_timer import StepTimer
    from jobs.gpt import GPT, TextData

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        accelerator="gpu" if s["gpu"] else "cpu", devices="auto", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], precision=s["precision"], max_steps=s["max_steps"],
        gradient_clip_val=1.0, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[StepTimer(s["warmup"], s["out"])])
    trainer = prepare_trainer(trainer)
    trainer.fit(GPT(**s["model"]), datamodule=TextData(block_size=s["block_size"], batch_size=s["batch_size"]))


def orchestrated(args, out: str, storage: str, index: int) -> dict:
    import orchestrator

    s = settings(args)
    spec = {
        "name": f"gpt-bench-{index}", "storage": storage, "resume_from": "none", "seed": 0,
        "lightning": {
            "model": {"class_path": "jobs.gpt.GPT", "init_args": s["model"]},
            "data": {"class_path": "jobs.gpt.TextData", "init_args": {"block_size": s["block_size"],
                                                                      "batch_size": s["batch_size"]}},
            "trainer": {"max_steps": s["max_steps"], "precision": s["precision"], "gradient_clip_val": 1.0,
                        "limit_val_batches": 0, "num_sanity_val_steps": 0},
            "callbacks": [{"class_path": TIMER, "init_args": {"warmup": s["warmup"], "out": out}}],
        },
        "scaling": {"num_workers": args.workers, "use_gpu": args.gpu,
                    "resources_per_worker": {"CPU": 1, "GPU": 1} if args.gpu else {"CPU": 1}},
        "checkpoint": {"at_epoch_end": False, "every_n_steps": 10 ** 6},
    }
    result = orchestrator.run(spec, console=None)
    assert result.status == "finished", result.error
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None, help="per worker (16 on CPU, 64 on GPUs)")
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker: NCCL and bf16-mixed")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))

    ratios, ray_ratios = [], []
    with tempfile.TemporaryDirectory(prefix="gpt-bench-") as tmp:
        for index in range(args.rounds):
            runs = {}
            # Alternate which goes first: a warm page cache or a busy Ray helper favours neither.
            kinds = ("plain", "ray", "ours") if index % 2 == 0 else ("ours", "ray", "plain")
            for kind in kinds:
                out = os.path.join(tmp, f"{kind}-{index}.json")
                if kind == "plain":
                    runs[kind] = baseline(args, out)
                else:
                    measure = orchestrated if kind == "ours" else ray_train
                    runs[kind] = measure(args, out, os.path.join(tmp, "runs"), index)
            ratio = runs["ours"]["samples_per_s"] / runs["plain"]["samples_per_s"]
            ratios.append(ratio)
            ours, plain, ray_only = runs["ours"], runs["plain"], runs["ray"]
            ray_ratios.append(ray_only["samples_per_s"] / plain["samples_per_s"])
            print(f"round {index + 1}: Ray Train + Lightning alone {ray_only['samples_per_s']:.1f} samples/s "
                  f"({ray_only['cpu_ms_per_step']:.0f} ms CPU a step), ratio to plain {ray_ratios[-1]:.3f}")
            print(f"round {index + 1}: orchestrator {ours['samples_per_s']:.1f} samples/s "
                  f"({ours['cpu_ms_per_step']:.0f} ms CPU a step), plain Lightning {plain['samples_per_s']:.1f} "
                  f"samples/s ({plain['cpu_ms_per_step']:.0f} ms), ratio {ratio:.3f} (loss at the end "
                  f"{ours['loss']:.4f} vs {plain['loss']:.4f})", flush=True)
    ours_to_ray = [ours / ray for ours, ray in zip(ratios, ray_ratios, strict=True)]
    print(f"median ratios: orchestrator / plain Lightning {statistics.median(ratios):.3f}; Ray Train alone / plain "
          f"Lightning {statistics.median(ray_ratios):.3f}; orchestrator / Ray Train alone "
          f"{statistics.median(ours_to_ray):.3f}")


if __name__ == "__main__":
    main()
