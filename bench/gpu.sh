#!/usr/bin/env bash
# Every GPU test and GPU benchmark, in one command, within 9 minutes on one GPU machine:
#
#     bash bench/gpu.sh            # from anywhere; it runs in the repository root
#
# On the GPU machine (no registry, no Ray in its image), carry the device bundle along: build it
# here with `bash bench/device_bundle.sh` (.whl/, git-ignored), then one device call with
# carry [".whl"] runs `bash bench/gpu.sh`. Step 0 installs from it when Ray is missing.
#
# 0. install   bash bench/device_install.sh: Ray, the project and its deepspeed extra from .whl/
#              with pip --no-index (nothing when they already import).
# 1. tests     python -m pytest -q -m slow tests/e2e/test_gpu.py: the GPT job with NCCL and bf16-mixed under
#              Lightning ddp, fsdp and deepspeed, saved and resumed through the store.
# 2. torchrun  orchestrator torchrun --gpu --nproc_per_node N (N = GPUs, at most 2) of
#              tests/helpers/torchrun_seed.py (NCCL; it calls torch.cuda.set_device(LOCAL_RANK)): must finish,
#              and every rank's cuda_device (its --env_out JSON) must equal its LOCAL_RANK.
# 3. gpt       python bench/lightning_gpt.py --gpu, one short round: samples/s of the orchestrator ÷
#              plain Lightning under torchrun (and ÷ Ray Train alone).
# 4. restarts  python bench/torchrun.py --gpu: parts a (steps/s ÷ plain torchrun) and b (in-place
#              restart after a SIGKILLed rank ÷ plain torchrun's).
#
# With one GPU every step runs one rank (NCCL cannot put two ranks on one device), and the summary
# says that NCCL between two ranks was not checked. Each step runs under `timeout`, within what is
# left of the budget ($GPU_BENCH_BUDGET_S, default 540 s: a device call may take 600). The summary
# lists every step (PASS / FAIL / SKIP) with its figures; the exit status is 1 if any step failed.
# Without nvidia-smi, a GPU, or a CUDA build of torch, it prints why and exits 0 without running
# anything. Python: $PYTHON, else .venv/bin/python, else python3. Output of every step:
# $GPU_BENCH_LOGS (default: a temp folder, printed at the end).
set -u -o pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3); fi
fi
# The commands pip puts beside the interpreter (orchestrator, ray) come first, as in its venv.
export PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"
export PYTHON=$PY
TOTAL_S=${GPU_BENCH_BUDGET_S:-540}
START=$(date +%s)
SUMMARY=()
FAILED=0

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "bench/gpu.sh: skipped: no nvidia-smi on this machine (no NVIDIA driver, so no GPU to test)"
    exit 0
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench/gpu.sh: skipped: nvidia-smi finds no GPU"
    exit 0
fi
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null)
if [ -z "$GPUS" ] || [ "$GPUS" -lt 1 ]; then
    echo "bench/gpu.sh: skipped: torch ($("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not importable')) sees no CUDA device; install a CUDA build of torch"
    exit 0
fi
NPROC=$(( GPUS < 2 ? GPUS : 2 ))
LOGS=${GPU_BENCH_LOGS:-$(mktemp -d /tmp/gpu-bench-XXXXXX)}
mkdir -p "$LOGS"
echo "bench/gpu.sh: $(nvidia-smi -L | head -n 2 | tr '\n' ' ')-> $NPROC rank(s)/worker(s); logs in $LOGS"

left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }

# step NAME BUDGET_S COMMAND...: runs it under timeout (its budget, or what is left), output to
# $LOGS/NAME.log and to the terminal; records PASS/FAIL.
step() {
    local name=$1 budget=$2
    shift 2
    local remaining
    remaining=$(left)
    if [ "$remaining" -lt 20 ]; then
        SUMMARY+=("FAIL  $name: not started, the 10 minutes are used up")
        FAILED=1
        return 1
    fi
    [ "$budget" -gt "$remaining" ] && budget=$remaining
    echo
    echo "=== $name (at most ${budget} s): $*"
    local t0=$(date +%s) code
    timeout -k 10 "$budget" "$@" 2>&1 | tee "$LOGS/$name.log"
    code=${PIPESTATUS[0]}
    local took=$(( $(date +%s) - t0 ))
    if [ "$code" -eq 0 ]; then
        SUMMARY+=("PASS  $name (${took} s)")
        return 0
    fi
    if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        SUMMARY+=("FAIL  $name: timed out after ${took} s")
    else
        SUMMARY+=("FAIL  $name: exit status $code after ${took} s (log: $LOGS/$name.log)")
    fi
    FAILED=1
    return 1
}

figure() { SUMMARY+=("      $1"); }

# 0. Ray and the project, from the bundle when the image lacks them; nothing else can run without.
if ! step install 120 bash bench/device_install.sh; then
    echo
    echo "=== bench/gpu.sh summary ($(( $(date +%s) - START )) s; logs in $LOGS)"
    for line in "${SUMMARY[@]}"; do echo "$line"; done
    exit 1
fi
figure "$(grep -E '^device_install: (installed|.*already import)' "$LOGS/install.log" | tail -n 1)"
if [ "$NPROC" -lt 2 ]; then
    SUMMARY+=("SKIP  nccl-two-ranks: one GPU here, and NCCL puts one rank on a device: every step ran 1 rank;"
              "      NCCL between two ranks (all-reduce across GPUs, DDP gradient sync) needs a machine with 2 GPUs")
fi

# 1. The GPU tests.
if step tests 240 "$PY" -m pytest -q -m slow -p no:cacheprovider tests/e2e/test_gpu.py; then
    if ! grep -qE '[0-9]+ passed' "$LOGS/tests.log"; then
        SUMMARY[${#SUMMARY[@]}-1]="FAIL  tests: no GPU test ran although torch sees $GPUS GPU(s)"
        FAILED=1
    fi
    figure "$(grep -E '[0-9]+ (passed|failed|skipped)' "$LOGS/tests.log" | tail -n 1)"
fi

# 2. orchestrator torchrun --gpu: NCCL, one GPU a rank, cuda_device == LOCAL_RANK.
RUNS=$(mktemp -d /tmp/gpu-torchrun-XXXXXX)
if step torchrun 80 "$PY" -m orchestrator torchrun --gpu --nproc_per_node "$NPROC" --max_restarts 0 \
        --storage "$RUNS" --name seed tests/helpers/torchrun_seed.py --work_dir '{run_dir}/work' --epochs 2 \
        --env_out "$RUNS/env"; then
    if check=$("$PY" - "$RUNS" "$NPROC" 2>&1 <<'EOF'
import json, os, sys
runs, nproc = sys.argv[1], int(sys.argv[2])
seen = {}
for name in sorted(os.listdir(os.path.join(runs, "env"))):
    with open(os.path.join(runs, "env", name)) as f:
        entry = json.load(f)
    seen[int(entry["RANK"])] = entry
problems = [f"ranks {sorted(seen)}, expected {list(range(nproc))}"] if sorted(seen) != list(range(nproc)) else []
for rank, entry in sorted(seen.items()):
    if entry["cuda_device"] != int(entry["LOCAL_RANK"]):
        problems.append(f"rank {rank}: cuda_device {entry['cuda_device']} != LOCAL_RANK {entry['LOCAL_RANK']} "
                        f"(CUDA_VISIBLE_DEVICES={entry.get('CUDA_VISIBLE_DEVICES')})")
with open(os.path.join(runs, "seed", "work", "final.json")) as f:
    final = json.load(f)
with open(os.path.join(runs, "seed", "summary.json")) as f:
    summary = json.load(f)
if summary.get("status") != "finished":
    problems.append(f"summary.json status {summary.get('status')!r}")
devices = ", ".join(f"rank {r}: cuda:{e['cuda_device']} (CUDA_VISIBLE_DEVICES={e.get('CUDA_VISIBLE_DEVICES')})"
                    for r, e in sorted(seen.items()))
print(f"{len(seen)} rank(s) on NCCL, {devices}; world_size {final['world_size']}, weights {final['sha256'][:12]}")
if problems:
    print("; ".join(problems))
    sys.exit(1)
EOF
    ); then
        figure "$check"
    else
        SUMMARY+=("FAIL  torchrun: $check")
        FAILED=1
    fi
fi
rm -rf "$RUNS"

# 3. The GPT job against plain Lightning on the GPUs (one short round).
if [ -f bench/lightning_gpt.py ]; then
    if step gpt 130 "$PY" bench/lightning_gpt.py --gpu --workers "$NPROC" --rounds 1 --steps 40 --warmup 10; then
        figure "$(grep -E '^round 1: orchestrator' "$LOGS/gpt.log" | tail -n 1)"
        figure "$(grep -E '^median ratios' "$LOGS/gpt.log" | tail -n 1)"
    fi
else
    SUMMARY+=("SKIP  gpt: bench/lightning_gpt.py is not there")
fi

# 4. torchrun scripts on the GPUs: steps/s and the in-place restart against plain torchrun.
if step restarts 140 "$PY" bench/torchrun.py --gpu --timeout 90; then
    while IFS= read -r line; do figure "$line"; done < <(grep -E '^\| [ab] \|' "$LOGS/restarts.log")
fi

echo
echo "=== bench/gpu.sh summary ($(( $(date +%s) - START )) s; logs in $LOGS)"
for line in "${SUMMARY[@]}"; do echo "$line"; done
exit "$FAILED"
