#!/usr/bin/env bash
# Install the project into a Python with no registry in reach, from the device bundle
# (bench/device_bundle.sh): Ray and what the image lacks come from the bundle, the rest (torch,
# Lightning, pyarrow, ...) must already be there. bench/gpu.sh runs it first on the GPU machine.
#
#     bash bench/device_install.sh            # PYTHON=... to choose the interpreter; DEVICE_BUNDLE=... the folder
#
# It installs `-e ".[deepspeed]"` with `pip install --no-index --find-links BUNDLE`, so pip checks
# every requirement of the project against the bundle and the image, and puts the `orchestrator`
# and `ray` commands beside the interpreter. Nothing is installed when Ray and the project
# already import. Where the interpreter has no pip (an image made with uv), it runs the bundle's
# pip wheel (`python pip-*.whl/pip`). Exit status: pip's, or 2 with a line saying what is missing.
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3); fi
fi
BUNDLE=${DEVICE_BUNDLE:-.whl}

if "$PY" -c "import ray.train.torch, orchestrator.cli, deepspeed" >/dev/null 2>&1 \
        && [ -x "$(dirname "$PY")/orchestrator" ]; then
    echo "device_install: $("$PY" -c 'import ray; print("ray", ray.__version__)') and the project already import; nothing installed"
    exit 0
fi
if ! ls "$BUNDLE"/ray-*.whl >/dev/null 2>&1; then
    echo "device_install: no Ray wheel in $BUNDLE/, and this Python ($PY) cannot import Ray and the project." \
         "Build the bundle where a registry is in reach (bash bench/device_bundle.sh --python-version" \
         "$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')), and carry $BUNDLE with the working tree."
    exit 2
fi
if "$PY" -m pip --version >/dev/null 2>&1; then
    PIP=("$PY" -m pip)
else
    wheel=$(ls "$BUNDLE"/pip-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        echo "device_install: $PY has no pip, and $BUNDLE/ holds no pip wheel to run instead; rebuild the bundle"
        exit 2
    fi
    echo "device_install: $PY has no pip; using the bundle's $(basename "$wheel")"
    PIP=("$PY" "$wheel/pip")
fi
started=$(date +%s)
"${PIP[@]}" install --quiet --disable-pip-version-check --no-index --find-links "$BUNDLE" -e ".[deepspeed]" || exit $?
echo "device_install: installed from $BUNDLE/ in $(( $(date +%s) - started )) s:" \
     "$("$PY" -c 'import ray, torch, lightning; print(f"ray {ray.__version__}, torch {torch.__version__}, lightning {lightning.__version__}")')"
