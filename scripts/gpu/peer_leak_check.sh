#!/usr/bin/env bash
# cyctx's context-leak checker (pytest --cyctx-check-contexts) over a peer's own test files:
# CuPy's CUDA tests of the release installed on the GPU machine.
#
#   bash scripts/gpu/peer_leak_check.sh prepare [CUPY_GIT_DIR]   (here, with the network or a mirror)
#       copies CuPy 14.2.0's test files (tests/conftest.py, the CUDA tests and its pytest
#       settings) from a git clone of cupy/cupy into peer_tests/cupy-14.2.0 (git-ignored, ~150 KB);
#   bash scripts/gpu/peer_leak_check.sh run                       (on the GPU machine, no network)
#       runs them with the checker on the real driver, with the installed cupy and cyctx (a
#       wheel from wheelhouse/ is installed first when cyctx is not), and writes the logs to
#       $OUT (or /tmp/cyctx-peer).
#
# The files are run, not edited; what the checker reports is in each log's summary, under
# "cyctx: ... left the CUDA context state changed" and "retains taken and kept".
set -uo pipefail
cd "$(dirname "$0")/../.."
CUPY_TAG=v14.2.0
DEST=peer_tests/cupy-${CUPY_TAG#v}
FILES="tests/conftest.py tests/cupy_tests/__init__.py tests/cupy_tests/cuda_tests/__init__.py
tests/cupy_tests/cuda_tests/test_device.py tests/cupy_tests/cuda_tests/test_stream.py
tests/cupy_tests/cuda_tests/test_runtime.py tests/cupy_tests/cuda_tests/test_driver.py
tests/cupy_tests/cuda_tests/test_graph.py tests/cupy_tests/cuda_tests/test_memory.py
tests/cupy_tests/cuda_tests/test_pinned_memory.py tests/cupy_tests/cuda_tests/test_profile.py"

prepare() {
    local git_dir=${1:-/work/.mirror/cupy+cupy/repo}
    rm -rf "$DEST"; mkdir -p "$DEST"
    for f in $FILES; do
        mkdir -p "$DEST/$(dirname "$f")"
        git --git-dir="$git_dir" show "$CUPY_TAG:$f" > "$DEST/$f" || { echo "missing $f at $CUPY_TAG" >&2; exit 1; }
    done
    # CuPy's pytest settings (markers, warning filters) are in its pyproject.toml: only that table.
    git --git-dir="$git_dir" show "$CUPY_TAG:pyproject.toml" \
        | awk '/^\[tool.pytest.ini_options\]/{f=1; print; next} /^\[/{f=0} f' > "$DEST/pyproject.toml"
    du -sh "$DEST"
}

run() {
    local out=${OUT:-/tmp/cyctx-peer} status
    mkdir -p "$out"
    [ -d "$DEST" ] || { echo "no $DEST: run 'prepare' first (peer_tests/ must be in the checkout)" >&2; exit 1; }
    if ! (cd /tmp && python3 -c "import cyctx" 2>/dev/null); then
        python3 -m pip install -q --no-index --no-deps wheelhouse/cyctx-*-cp312-cp312-*.whl || exit 1
    fi
    {
        nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
        python3 -c "import cupy, cyctx; print('cupy', cupy.__version__, '| cyctx', cyctx.__version__)"
        echo "command: python3 -m pytest -p no:cacheprovider -q -rN --cyctx-check-contexts tests/cupy_tests/cuda_tests"
    } | tee "$out/peer-cupy.log"
    (cd "$DEST" && timeout 540 python3 -m pytest -p no:cacheprovider -q -rN --cyctx-check-contexts \
        tests/cupy_tests/cuda_tests) >> "$out/peer-cupy.log" 2>&1
    status=$?
    echo "pytest exit status $status" >> "$out/peer-cupy.log"
    # The summary: what the checker said (it comes after pytest's summary info) and the outcome.
    sed -n '/^=* *cyctx: /,$p' "$out/peer-cupy.log" | tail -80
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu/peer_leak_check.sh prepare [CUPY_GIT_DIR] | run" >&2; exit 2 ;;
esac
