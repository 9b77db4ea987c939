#!/usr/bin/env bash
# cyctx's context-leak checker (pytest --cyctx-check-contexts) over peers' own test suites, under
# pytest-xdist (-n 4), on the GPU machine: CuPy 14.2.0's CUDA tests and the installed
# numba-cuda's driver tests.
#
#   bash scripts/gpu/peer_leak_check.sh prepare CUPY_GIT_DIR     (on a machine with a package index)
#       copies CuPy 14.2.0's tests/cupy_tests/cuda_tests (with tests/conftest.py and its pytest
#       settings) from a git clone of cupy/cupy into peer_tests/cupy-14.2.0, and downloads the
#       wheels of pytest-xdist and execnet (pure Python) into peer_tests/wheels (git-ignored);
#   bash scripts/gpu/peer_leak_check.sh run                       (on the GPU machine, no network)
#       installs what is missing (cyctx from wheelhouse/, pytest-xdist and execnet from
#       peer_tests/wheels), then runs, each file of CuPy's CUDA tests in its own pytest run
#       (a hang costs that file only) until about 3 minutes are used, and numba-cuda's
#       cudadrv tests in one run of at most 3 minutes, all with
#       `-n 4 -p no:benchmark --cyctx-check-contexts`; logs to $OUT (or /tmp/cyctx-peer).
#
# The files are run, not edited; pytest-benchmark is turned off (it turns itself off under xdist
# with a warning). What the checker reports is printed at the end: each run's outcome line and
# its "cyctx: ..." section (leaks first, then the notes of retains taken and kept).
set -uo pipefail
cd "$(dirname "$0")/../.."
CUPY_TAG=v14.2.0
DEST=peer_tests/cupy-${CUPY_TAG#v}
WHEELS=peer_tests/wheels
XDIST_WHEELS="pytest-xdist==3.8.0 execnet==2.1.2"
# Files that take a few seconds first; test_device.py last (it hangs on a one-GPU machine
# in CuPy's own tests, checker or not).
CUPY_FILES="test_stream.py test_runtime.py test_driver.py test_graph.py test_memory.py
test_pinned_memory.py test_profile.py test_nvtx.py test_memory_hook.py test_texture.py
test_cublas.py test_curand.py test_cufft.py test_cusolver.py test_cusparse.py test_nvrtc.py
test_compiler.py test_compiler_cache.py test_cutensor.py test_nccl.py memory_hooks_tests
test_device.py"
CUPY_BUDGET_S=${CUPY_BUDGET_S:-180}   # no new CuPy file starts after this
PER_FILE_S=60
NUMBA_S=${NUMBA_S:-180}
PYTEST_ARGS="-p no:cacheprovider -p no:benchmark -q -rN -n 4 --cyctx-check-contexts"

prepare() {
    local git_dir=${1:?usage: peer_leak_check.sh prepare CUPY_GIT_DIR (a git clone of cupy/cupy)}
    rm -rf "$DEST"; mkdir -p "$DEST"
    git --git-dir="$git_dir" archive "$CUPY_TAG" tests/conftest.py tests/cupy_tests/__init__.py \
        tests/cupy_tests/cuda_tests | tar -x -C "$DEST" || { echo "cannot read $CUPY_TAG" >&2; exit 1; }
    # CuPy's pytest settings (markers, warning filters) are in its pyproject.toml: only that table.
    git --git-dir="$git_dir" show "$CUPY_TAG:pyproject.toml" \
        | awk '/^\[tool.pytest.ini_options\]/{f=1; print; next} /^\[/{f=0} f' > "$DEST/pyproject.toml"
    rm -rf "$WHEELS"; mkdir -p "$WHEELS"
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary :all: -d "$WHEELS" $XDIST_WHEELS || exit 1
    du -sh "$DEST" "$WHEELS"; ls "$WHEELS"
}

section() {  # a log's outcome line and the checker's report
    grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$1" | tail -1
    if grep -q '^=* *cyctx: ' "$1"; then
        sed -n '/^=* *cyctx: /,$p' "$1" \
            | grep -Ev '^(=+ )?[0-9]+ (passed|failed|errors?|skipped)|^pytest exit status|short test summary'
    else
        echo "(no cyctx report: the run did not finish)"
    fi
}

run() {
    local out=${OUT:-/tmp/cyctx-peer} start f log status numba_dir
    mkdir -p "$out"
    [ -d "$DEST" ] && [ -d "$WHEELS" ] || { echo "no $DEST or $WHEELS: run 'prepare' first" >&2; exit 1; }
    if ! (cd /tmp && python3 -c "import cyctx" 2>/dev/null); then
        python3 -m pip install -q --no-index --no-deps wheelhouse/cyctx-*-cp312-cp312-*.whl || exit 1
    fi
    if ! (cd /tmp && python3 -c "import xdist, execnet" 2>/dev/null); then
        python3 -m pip install -q --no-index --no-deps "$WHEELS"/*.whl || exit 1
    fi
    {
        nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
        (cd /tmp && python3 -c "import cupy, cyctx, pytest, xdist; print('cupy', cupy.__version__, '| cyctx', cyctx.__version__, '| pytest', pytest.__version__, '| xdist', xdist.__version__)")
        (cd /tmp && python3 -c "import numba_cuda; print('numba-cuda', numba_cuda.__version__)" 2>&1 | tail -1)
        echo "each run: python3 -m pytest $PYTEST_ARGS FILE"
    } | tee "$out/peer-env.log"

    start=$SECONDS
    for f in $CUPY_FILES; do
        if (( SECONDS - start > CUPY_BUDGET_S )); then echo "cupy: $f and after not run (time)"; continue; fi
        [ -e "$DEST/tests/cupy_tests/cuda_tests/$f" ] || { echo "cupy: no $f"; continue; }
        log="$out/peer-cupy-${f%.py}.log"
        # shellcheck disable=SC2086
        (cd "$DEST" && timeout "$PER_FILE_S" python3 -m pytest $PYTEST_ARGS \
            "tests/cupy_tests/cuda_tests/$f") > "$log" 2>&1
        status=$?
        echo "pytest exit status $status$( ((status == 124)) && echo " (stopped after $PER_FILE_S s)")" >> "$log"
        echo "=== cupy $f: exit $status, $((SECONDS - start)) s so far"
    done

    numba_dir=$(cd /tmp && python3 -c "import os, numba.cuda.tests.cudadrv as m; print(os.path.dirname(m.__file__))" 2>/dev/null)
    log="$out/peer-numba-cudadrv.log"
    if [ -n "$numba_dir" ]; then
        echo "numba-cuda driver tests: $numba_dir" > "$log"
        # shellcheck disable=SC2086
        (cd /tmp && timeout "$NUMBA_S" python3 -m pytest $PYTEST_ARGS "$numba_dir") >> "$log" 2>&1
        status=$?
        echo "pytest exit status $status$( ((status == 124)) && echo " (stopped after $NUMBA_S s)")" >> "$log"
        echo "=== numba-cuda cudadrv: exit $status"
    else
        echo "numba-cuda: numba.cuda.tests.cudadrv is not importable" | tee "$log"
    fi

    echo; echo "##### what the checker reported"
    for log in "$out"/peer-cupy-*.log "$out"/peer-numba-cudadrv.log; do
        echo "----- $(basename "$log" .log)"
        section "$log"
        tail -1 "$log"
    done
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu/peer_leak_check.sh prepare [CUPY_GIT_DIR] | run" >&2; exit 2 ;;
esac
