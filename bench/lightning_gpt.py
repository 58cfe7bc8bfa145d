"""The GPT job through the orchestrator ÷ the same LightningModule under plain Lightning with torchrun.

Same model (jobs/gpt.py), data, batch, precision and world size, measured in one invocation,
alternating the two for a few rounds and taking the median of the rounds' ratios. Samples/s are
timed on rank 0 by the same callback in both (bench.lightning_gpt_timer), from optimizer step
`--warmup` to the last one, so start-up is not mixed into the ratio. Goal: ratio >= 0.98.

    python bench/lightning_gpt.py [--rounds 2] [--steps 60] [--warmup 15] [--workers 2]
    python bench/lightning_gpt.py --gpu [--workers N]     # NCCL, bf16-mixed, a larger GPT

The baseline is how Lightning users run DDP by hand: `torchrun --nproc_per_node=N script.py`,
with `Trainer(devices=N, strategy="ddp")` (Lightning takes the ranks from torchrun).
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

    ratios = []
    with tempfile.TemporaryDirectory(prefix="gpt-bench-") as tmp:
        for index in range(args.rounds):
            runs = {}
            # Alternate which goes first: a warm page cache or a busy Ray helper favours neither.
            for kind in (("plain", "ours") if index % 2 == 0 else ("ours", "plain")):
                out = os.path.join(tmp, f"{kind}-{index}.json")
                runs[kind] = (baseline(args, out) if kind == "plain"
                              else orchestrated(args, out, os.path.join(tmp, "runs"), index))
            ratio = runs["ours"]["samples_per_s"] / runs["plain"]["samples_per_s"]
            ratios.append(ratio)
            print(f"round {index + 1}: orchestrator {runs['ours']['samples_per_s']:.1f} samples/s, plain Lightning "
                  f"{runs['plain']['samples_per_s']:.1f} samples/s, ratio {ratio:.3f} (loss at the end "
                  f"{runs['ours']['loss']:.4f} vs {runs['plain']['loss']:.4f})", flush=True)
    print(f"median ratio (orchestrator / plain Lightning): {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
