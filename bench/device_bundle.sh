#!/usr/bin/env bash
# Fill the device bundle (.whl/, git-ignored): every wheel the GPU machine's image lacks, Ray
# slimmed under the 64 MiB a device call carries. bench/device_bundle.py says what goes in.
#
#     bash bench/device_bundle.sh [--python-version 3.12] [--out .whl] [--arch x86_64]
#
# Then, on the GPU machine (the device tool, carry [".whl"]): bash bench/gpu.sh
# Python: $PYTHON, else .venv/bin/python, else python3 (it needs pip, the registry, and torch to
# build DeepSpeed's wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
exec "$PY" bench/device_bundle.py "$@"
