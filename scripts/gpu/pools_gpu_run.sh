#!/usr/bin/env bash
# The thread-pool and Dask examples (examples/pools/, docs/threads.md) once on a GPU machine,
# with the installed cyctx (a wheel from wheelhouse/ is installed first when cyctx is not):
#
#   bash scripts/gpu/pools_gpu_run.sh          (logs to $OUT, or /tmp/cyctx-pools)
#
#   1. threadpool_example.py: 256 tasks over every device on 8 threads, each allocating,
#      filling and reading back 1 MiB on its device inside ContextGuard.shared(k);
#   2. dask_example.py: a LocalCluster of 2 process workers x 4 threads, the same tasks, the
#      device named by the task and picked by the worker; dask[distributed] comes from the
#      wheels carried in .whl/dask (installed into /tmp/cyctx-dask, the machine's Python is
#      left as it is) when the machine has no dask;
#   3. tests/test_pools.py on the real driver.
# Each prints whether any pool thread was left with a context current or a guard entered.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/cyctx-pools}
mkdir -p "$out"
if ! (cd /tmp && python3 -c "import cyctx" 2>/dev/null); then
    python3 -m pip install -q --no-index --no-deps wheelhouse/cyctx-*-cp312-cp312-*.whl || exit 1
fi
{
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
    echo "== threadpool_example.py --tasks 256 --workers 8"
    (cd /tmp && timeout 300 python3 "$OLDPWD/examples/pools/threadpool_example.py" --tasks 256 --workers 8)
    echo "exit status $?"
    echo "== dask_example.py --workers 2 --threads 4 --tasks 256"
    if ! python3 -c "import distributed" 2>/dev/null; then
        python3 -m pip install -q --no-index --find-links .whl/dask --target /tmp/cyctx-dask "dask[distributed]" \
            && export PYTHONPATH=/tmp/cyctx-dask${PYTHONPATH:+:$PYTHONPATH}
    fi
    (cd /tmp && timeout 300 python3 "$OLDPWD/examples/pools/dask_example.py" --workers 2 --threads 4 --tasks 256)
    echo "exit status $?"
    echo "== tests/test_pools.py --driver=real"
    timeout 300 python3 -m pytest --driver=real -q -p no:cacheprovider -rs tests/test_pools.py
    echo "exit status $?"
} 2>&1 | tee "$out/pools-gpu.log"
