#!/usr/bin/env bash
# One device call: build cyctx on the GPU machine against its own cuda-bindings, then run the
# whole suite on the real driver, the differential record/compare, the guard benchmark and the
# full load test. Everything it prints and writes lands in $OUT (copied back into the repo).
#
# Carry: .whl with nvidia-cuda-runtime of the machine's cuda-bindings minor (for cuda.h; the
# image's runtime wheel is older than its bindings) and setuptools>=77.
set -uo pipefail
OUT=${OUT:-/tmp/cyctx-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/gpu_run.log") 2>&1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step machine
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
python3 --version
python3 -m pip list 2>/dev/null | grep -i -E "^(cuda|cython|setuptools|pytest|torch |cupy|numba|nvidia-cuda-runtime)"

step build
python3 -m pip install -q --no-index --no-deps --target /tmp/hdr .whl/nvidia_cuda_runtime-*.whl .whl/nvidia_cuda_profiler_api-*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/st .whl/setuptools-*.whl
export CUDA_HOME=/tmp/hdr/nvidia/cu13
PYTHONPATH=/tmp/st python3 -m pip install --no-build-isolation --no-deps --no-index -v . 2>&1 | grep -E "cyctx build|Successfully|rror" || exit 1
python3 -c "import cyctx; print(cyctx.BUILD_INFO)"

step "test suite, real driver"
timeout 240 python3 -m pytest --driver=real -ra -q -p no:cacheprovider --junitxml="$OUT/pytest-real.xml" 2>&1 | tail -40

step "differential: record the real driver (compared with the simulated one on CI)"
timeout 90 python3 tests/differential/run.py record --driver real --out "$OUT/real_h200.json"

step "guard benchmark"
timeout 120 python3 bench/bench_guard.py --out "$OUT/guard-h200.json" 2>&1 | grep -v "^copying\|^running\|^building"

step "load test: 16 threads x 2 devices, 1M enter/exit pairs"
timeout 100 python3 bench/stress.py --threads 16 --pairs 1000000 --out "$OUT/stress-h200.json" | tail -25
echo "stress exit code $?"
step done
