#!/usr/bin/env bash
# The device runs, in two calls of under ten minutes each (`bash scripts/gpu_run.sh A`, then
# `B`). Each builds cyctx on the GPU machine against its own cuda-bindings and writes its logs,
# JUnit XML and JSON to $OUT (copied back into results/).
#   A: the whole suite on the real driver (13.x bindings), the differential record, the doctor's
#      real output (CUDA 13 and 11.8 runtimes), the full load test.
#   B: the benchmark suite, then the whole suite and the differential record with cuda-bindings
#      12.9 and CUDA 12.9 headers.
#   C: the final check: the whole suite with cuda-bindings 13 and, at the same time (the
#      machine has 32 cores and the suites share nothing but the GPUs), with 12.9.
# Carry .whl: nvidia-cuda-runtime + nvidia-cuda-profiler-api of the machine's bindings minor
# (the image's runtime wheel is older than its bindings), setuptools>=77, cuda-bindings 12.9,
# nvidia-cuda-runtime-cu12 12.9, nvidia-cuda-runtime-cu11 11.8.
set -uo pipefail
PART=${1:?usage: gpu_run.sh A|B}
OUT=${OUT:-/tmp/cyctx-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/gpu_run_$PART.log") 2>&1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step machine
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
python3 --version
python3 -m pip list 2>/dev/null | grep -i -E "^(cuda|cython|setuptools|pytest |torch |cupy|numba|nvidia-cuda-runtime|matplotlib)"

step build
python3 -m pip install -q --no-index --no-deps --target /tmp/hdr .whl/nvidia_cuda_runtime-*.whl .whl/nvidia_cuda_profiler_api-*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/st .whl/setuptools-*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/cu11 .whl/nvidia_cuda_runtime_cu11-*.whl
export CUDA_HOME=/tmp/hdr/nvidia/cu13
export CYCTX_CUDART11=/tmp/cu11/nvidia/cuda_runtime/lib/libcudart.so.11.0
PYTHONPATH=/tmp/st python3 -m pip install --no-build-isolation --no-deps --no-index -v . 2>&1 | grep -E "cyctx build|Successfully|rror" || exit 1
python3 -c "import cyctx; print(cyctx.BUILD_INFO)"

if [ "$PART" = A ]; then
    step "test suite, real driver, cuda-bindings 13"
    timeout 300 python3 -m pytest --driver=real -ra -q -p no:cacheprovider --junitxml="$OUT/pytest-real-cu13.xml" 2>&1 | tail -45

    step "differential: record the real driver"
    timeout 90 python3 tests/differential/run.py record --driver real --out "$OUT/real_h200.json" | tail -3

    step "doctor"
    timeout 120 bash scripts/doctor_capture.sh 2>&1 | tail -15

    step "load test: 16 threads x 2 devices, 1M enter/exit pairs"
    timeout 100 python3 bench/stress.py --threads 16 --pairs 1000000 --out "$OUT/stress-h200.json" | tail -22
    echo "stress exit code $?"
fi

if [ "$PART" = B ]; then
    step "benchmark suite"
    timeout 330 python3 bench/run_all.py --out-dir "$OUT/bench" 2>&1 | grep -v -E "^(copying|running|building|creating|/opt/gcc)" | tail -120

    step "re-check, cuda-bindings 13: runtime and interop tests"
    timeout 120 python3 -m pytest --driver=real -ra -q -p no:cacheprovider tests/test_runtime.py tests/test_interop.py --junitxml="$OUT/pytest-real-cu13-recheck.xml" 2>&1 | tail -8

    step "CUDA 12: cuda-bindings 12.9 with CUDA 12.9 headers"
    python3 -m pip install -q --no-index --no-deps --target /tmp/cu12site .whl/cuda_bindings-12.9*.whl .whl/nvidia_cuda_runtime_cu12-*.whl
    rm -rf build
    PYTHONPATH=/tmp/cu12site:/tmp/st CUDA_HOME=/tmp/cu12site/nvidia/cuda_runtime \
        python3 -m pip install --no-build-isolation --no-deps --no-index --target /tmp/cyctx12 -v . 2>&1 | grep -E "cyctx build|Successfully|rror" || exit 1
    export PYTHONPATH=/tmp/cyctx12:/tmp/cu12site CUDA_HOME=/tmp/cu12site/nvidia/cuda_runtime
    (cd /tmp && python3 -c "import cyctx, cuda.bindings; print(cyctx.BUILD_INFO, cuda.bindings.__version__, cyctx.__file__)")
    timeout 200 python3 -m pytest --driver=real -ra -q -p no:cacheprovider --junitxml="$OUT/pytest-real-cu12.xml" 2>&1 | tail -30
    timeout 60 python3 tests/differential/run.py record --driver real --out "$OUT/real_h200_cu12.json" | tail -3
fi
if [ "$PART" = C ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/cu12site .whl/cuda_bindings-12.9*.whl .whl/nvidia_cuda_runtime_cu12-*.whl
    rm -rf build
    PYTHONPATH=/tmp/cu12site:/tmp/st CUDA_HOME=/tmp/cu12site/nvidia/cuda_runtime \
        python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/cyctx12 . || exit 1
    step "whole suite, real driver: cuda-bindings 13 and 12.9 side by side"
    timeout 280 python3 -m pytest --driver=real -ra -q -p no:cacheprovider --basetemp=/tmp/pt13 \
        --junitxml="$OUT/pytest-real-cu13-final.xml" > "$OUT/pytest-cu13-final.log" 2>&1 &
    pid13=$!
    PYTHONPATH=/tmp/cyctx12:/tmp/cu12site CUDA_HOME=/tmp/cu12site/nvidia/cuda_runtime \
        timeout 280 python3 -m pytest --driver=real -ra -q -p no:cacheprovider --basetemp=/tmp/pt12 \
        --junitxml="$OUT/pytest-real-cu12-final.xml" > "$OUT/pytest-cu12-final.log" 2>&1
    wait "$pid13"  # not a bare `wait`: that also waits for the `tee` of the exec line (run 3C hung there)
    tail -4 "$OUT/pytest-cu13-final.log"; tail -4 "$OUT/pytest-cu12-final.log"
    grep -E "^(FAILED|ERROR)" "$OUT"/pytest-cu1*-final.log
fi
step done
# Only 8 files come back from $OUT: everything travels in one archive.
tar -czf /tmp/results.tgz -C "$OUT" . && mv /tmp/results.tgz "$OUT/results-$PART.tgz"
