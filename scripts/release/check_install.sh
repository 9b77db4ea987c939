#!/usr/bin/env bash
# Install cyctx as a user would, into environments that already hold a cuda-bindings, with
# pip's defaults, and check that it works there and that pip left that cuda-bindings alone.
#
#   bash scripts/release/check_install.sh SDIST
#
# For each case: a fresh venv; `pip install cuda-bindings==X` (what torch/CuPy/cuda.core
# environments hold); `pip install <checkout or sdist>`; then: the same cuda-bindings version
# as before, `pip check` clean, `cyctx --version`, a guard on the simulated driver, and
# `cyctx doctor --simulate` exiting 0. Plus `pip install "<checkout>[cu12]"` in an empty
# venv, which must give a CUDA 12 cyctx.
set -euo pipefail
cd "$(dirname "$0")/../.."
SDIST=$(realpath "${1:?usage: check_install.sh SDIST}")
PY=${PYTHON:-python3}
WORK=$PWD/build/check-install
rm -rf "$WORK"
mkdir -p "$WORK"

PROBE=$PWD/scripts/release/guard_probe.py

check_case() {  # $1: label, $2: cuda-bindings spec to preinstall ("" for none), $3: what to pip install
    local label=$1 pre=$2 target=$3 venv="$WORK/venv" before after
    echo "== $label"
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    if [ -n "$pre" ]; then
        "$venv/bin/python" -m pip install -q "cuda-bindings==$pre" 2>&1 | grep -v "^WARNING: Location" || true
        before=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("cuda-bindings"))')
    fi
    "$venv/bin/python" -m pip install -q "$target" 2>&1 | grep -v "^WARNING: Location" || true
    after=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("cuda-bindings"))')
    if [ -n "$pre" ] && [ "$before" != "$after" ]; then
        echo "FAIL: pip moved cuda-bindings from $before to $after"; exit 1
    fi
    "$venv/bin/python" -m pip check
    "$venv/bin/cyctx" --version
    (cd "$WORK" && "$venv/bin/python" "$PROBE")
    (cd "$WORK" && "$venv/bin/cyctx" doctor --simulate >/dev/null) || { echo "FAIL: cyctx doctor --simulate"; exit 1; }
    echo "ok: cuda-bindings ${after}"
}

check_case "checkout, environment with cuda-bindings 12.9" "12.9.*" "$PWD"
check_case "sdist, environment with cuda-bindings 13.0" "13.0.*" "$SDIST"
check_case "checkout, environment with cuda-bindings 13.3" "13.3.*" "$PWD"
check_case "sdist, environment with cuda-bindings 13.5" "13.5.*" "$SDIST"
check_case "checkout [cu12], empty environment" "" "$PWD[cu12]"
"$WORK/venv/bin/python" -c 'import importlib.metadata as m, sys; v = m.version("cuda-bindings"); print("cu12 extra gave cuda-bindings", v); sys.exit(not v.startswith("12."))'
rm -rf "$WORK"
echo "check_install: all cases passed"
