#!/usr/bin/env bash
# cyctx on a GPU machine: the release wheel installed (no rebuild, no dependencies) into the
# machine's own Python, whose torch/CuPy/cuda.core stack holds its own cuda-bindings, and
# checked there. What each part measures: scripts/gpu/README.md.
#
#   bash scripts/gpu/run.sh [PART ...]      (no PART: all; `peers` only when named)
#
# PART: machine, install, suite, differential, downstream, bench, launch, stress, doctor,
# pools, peers. Every part but `machine` installs the wheel first (once). Writes each part's
# output under $OUT (default /tmp/cyctx-gpu) and everything printed to $OUT/run.log; with
# PACK=1 also all of $OUT as one archive, $OUT/run.tgz.
#
# Needs, from the repository root: wheelhouse/ with the cp312 cyctx wheel (and the downstream
# example's wheel for `downstream`), and .whl/ (git-ignored: the machine has no package index)
# with the wheels the parts install into /tmp, leaving the machine's Python as it is:
# nvidia-cuda-runtime and nvidia-cuda-profiler-api of the machine's cuda-bindings minor (the
# headers the benchmarks compile against); cuda-bindings 12.9 and nvidia-cuda-runtime-cu12 12.9
# (the CUDA 12 suite); nvidia-cuda-runtime-cu11 11.8 (the doctor's demo); pytest-xdist and
# execnet in .whl/xdist where the machine has no xdist (the suite on 8 workers); test
# dependencies the machine lacks in .whl/extra (greenlet); dask[distributed] in .whl/dask
# (`pools`, when the machine has no dask); pyperf (the benchmarks' harness, `bench`, when the
# machine has none; it needs no psutil on Linux); peer_tests/ from `peer_leak_check.sh prepare`
# (`peers`).
set -uo pipefail
cd "$(dirname "$0")/../.."
ALL="machine install suite differential downstream bench launch stress doctor pools"
PARTS=${*:-$ALL}
OUT=${OUT:-/tmp/cyctx-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
HDR=/tmp/hdr/nvidia/cu13  # the headers of the machine's bindings minor, unpacked by `install`
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

part_machine() {
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    command -v python3; python3 --version
    (grep PRETTY /etc/os-release; ldd --version | head -1) 2>/dev/null
    python3 -m pip list 2>/dev/null \
        | grep -i -E "^(cuda|cython|setuptools|pytest |torch |cupy|numba|nvidia-cuda-runtime|matplotlib)"
    echo "command: bash scripts/gpu/run.sh $PARTS"
}

INSTALLED=
part_install() {
    [ -n "$INSTALLED" ] && return 0
    python3 -m pip install -q --no-index --no-deps --target /tmp/hdr \
        .whl/nvidia_cuda_runtime-13*.whl .whl/nvidia_cuda_profiler_api-*.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/cu11 .whl/nvidia_cuda_runtime_cu11-*.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/cu12site \
        .whl/cuda_bindings-12.9*.whl .whl/nvidia_cuda_runtime_cu12-*.whl
    # Test dependencies the machine lacks (greenlet, for the tests of blocks in greenlets).
    if ls .whl/extra/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/extra .whl/extra/*.whl \
            && export PYTHONPATH=/tmp/extra${PYTHONPATH:+:$PYTHONPATH}
    fi
    python3 -m pip install --no-index --no-deps "$(ls wheelhouse/cyctx-*-cp312-cp312-*.whl)" 2>&1 | tail -2 \
        || return 1
    (cd /tmp && python3 -c "import cyctx; print(cyctx.__file__); print(cyctx.BUILD_INFO)" \
        && cyctx --version && CUDA_HOME= PYTHONPATH=/tmp/cu12site cyctx --version) || return 1
    (cd /tmp && cyctx doctor; echo "exit status $?") | tee "$OUT/doctor-report.txt"
    (cd /tmp && cyctx doctor --json > "$OUT/doctor-report.json"; echo "json exit status $?")
    INSTALLED=1
}

part_suite() {
    # The whole suite on the real driver with the machine's cuda-bindings, then with 12.9 first
    # on PYTHONPATH: the same installed cyctx, no rebuild (the live differential against the
    # simulator is part of it). On 8 xdist workers, each a process of its own, so a test's
    # resets never reach another's; pytest-benchmark warns under xdist (an error with the
    # suite's filterwarnings), so it is not loaded.
    local xd="" xdpath=${PYTHONPATH:-}
    if python3 -c "import xdist" 2>/dev/null; then
        xd="-n 8"
    elif ls .whl/xdist/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/xd .whl/xdist/*.whl \
            && xd="-n 8" && xdpath=/tmp/xd${xdpath:+:$xdpath}
    fi
    # shellcheck disable=SC2086
    PYTHONPATH=$xdpath CUDA_HOME=$HDR timeout 330 python3 -m pytest --driver=real $xd \
        -p no:benchmark -ra -q -p no:cacheprovider --basetemp=/tmp/pt13 \
        --junitxml="$OUT/pytest-real-cu13.xml" > "$OUT/pytest-real-cu13.log" 2>&1
    echo "cu13 suite exit $?"
    # shellcheck disable=SC2086
    PYTHONPATH=/tmp/cu12site${xdpath:+:$xdpath} CUDA_HOME=/tmp/cu12site/nvidia/cuda_runtime \
        timeout 330 python3 -m pytest --driver=real $xd -p no:benchmark -ra -q -p no:cacheprovider \
        --basetemp=/tmp/pt12 --junitxml="$OUT/pytest-real-cu12.xml" > "$OUT/pytest-real-cu12.log" 2>&1
    echo "cu12 suite exit $?"
    tail -n 3 "$OUT/pytest-real-cu13.log" "$OUT/pytest-real-cu12.log"
    grep -h -E "^(FAILED|ERROR)" "$OUT"/pytest-real-cu1*.log
}

part_differential() {
    # The record the simulator is compared against (tests/sim/differential/real_h200*.json).
    timeout 90 python3 tests/sim/differential/run.py record --driver real \
        --out "$OUT/real_h200.json" | tail -3
}

part_downstream() {
    local ds
    ds=$(ls wheelhouse/cyctx_downstream_example-*-cp312-*.whl 2>/dev/null)
    [ -n "$ds" ] || { echo "no downstream wheel in wheelhouse/"; return 1; }
    python3 -m pip install -q --no-index --no-deps --target /tmp/ds "$ds"
    (cd examples/downstream && PYTHONPATH=/tmp/ds CYCTX_DOWNSTREAM_DRIVER=real timeout 60 \
        python3 -m pytest -q -p no:cacheprovider -o addopts="" tests 2>&1 | tail -3)
}

part_bench() {
    # About six minutes: pyperf runs each Python-level row in 7 processes (its calibration and
    # 6 workers), and a worker that loads torch takes about 3 s.
    local path=${PYTHONPATH:-}
    if ! python3 -c "import pyperf" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/pyperf .whl/pyperf-*.whl \
            && path=/tmp/pyperf${path:+:$path}
    fi
    PYTHONPATH=$path CUDA_HOME=$HDR timeout 560 python3 bench/run_all.py --out-dir "$OUT/bench" 2>&1 \
        | grep -v -E "^(copying|running|building|creating|/opt/gcc)" | tail -90
}

part_launch() {
    CUDA_HOME=$HDR timeout 240 python3 bench/launch.py --out-dir "$OUT/bench" 2>&1 | tail -30
}

part_stress() {
    timeout 100 python3 bench/stress.py --threads 16 --pairs 1000000 --out "$OUT/stress-h200.json" | tail -12
    timeout 100 python3 bench/stress.py --threads 16 --pairs 1000000 --edges \
        --out "$OUT/stress-edges-h200.json" | tail -12
}

part_doctor() {
    OUT=$OUT/doctor bash scripts/gpu/doctor_capture.sh
}

part_peers() {
    OUT=$OUT/peers bash scripts/gpu/peer_leak_check.sh run
}

part_pools() {
    # The thread-pool and Dask examples (examples/pools/) and their tests on the real driver;
    # each example prints whether a pool thread was left with a context current or a guard
    # entered.
    echo "== threadpool_example.py --tasks 256 --workers 8"
    (cd /tmp && timeout 300 python3 "$OLDPWD/examples/pools/threadpool_example.py" --tasks 256 --workers 8)
    echo "exit status $?"
    echo "== dask_example.py --workers 2 --threads 4 --tasks 256"
    local path=${PYTHONPATH:-}
    if ! python3 -c "import distributed" 2>/dev/null; then
        python3 -m pip install -q --no-index --find-links .whl/dask --target /tmp/cyctx-dask "dask[distributed]" \
            && path=/tmp/cyctx-dask${path:+:$path}
    fi
    (cd /tmp && PYTHONPATH=$path timeout 300 python3 "$OLDPWD/examples/pools/dask_example.py" \
        --workers 2 --threads 4 --tasks 256)
    echo "exit status $?"
    echo "== tests/test_pools.py --driver=real"
    PYTHONPATH=$path timeout 300 python3 -m pytest --driver=real -q -p no:cacheprovider -rs tests/test_pools.py
    echo "exit status $?"
}

{
    for part in $PARTS; do
        if ! declare -F "part_$part" >/dev/null; then
            echo "run.sh: no part '$part' (parts: $ALL peers)" >&2
            continue
        fi
        if [ "$part" != machine ] && [ "$part" != install ]; then
            part_install || { echo "run.sh: installing the wheel failed" >&2; break; }
        fi
        step "$part"
        # In this shell (not a pipe's subshell), so that `install` is remembered.
        "part_$part" > >(tee "$OUT/$part.log") 2>&1
    done
    step done
} 2>&1 | tee "$OUT/run.log"
if [ "${PACK:-}" = 1 ]; then
    tar -czf /tmp/cyctx-run.tgz -C "$OUT" . && mv /tmp/cyctx-run.tgz "$OUT/run.tgz"
fi
