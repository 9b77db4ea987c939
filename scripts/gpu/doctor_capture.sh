#!/usr/bin/env bash
# The doctor's real output on the GPU machine, for docs/classic-failure.md and docs/doctor.md.
# Two uses:
#
#   bash scripts/gpu/doctor_capture.sh                   # on the GPU machine: writes $OUT/doctor-*
#   bash scripts/gpu/doctor_capture.sh --fill-docs DIR   # here: paste DIR/doctor-*.txt into the docs
#
# On the GPU machine it builds cyctx first when the installed one is not this tree's (the same
# build as scripts/gpu/run.sh; it needs nvidia_cuda_runtime, nvidia_cuda_profiler_api and
# setuptools wheels in .whl/), unpacks the CUDA 11.8 runtime wheel of .whl/
# (.whl/nvidia_cuda_runtime_cu11-11.8.89-*.whl) into /tmp/cu11, and runs:
#   doctor, doctor --json, doctor --demo (the machine's CUDA 12/13 runtime), doctor --demo
#   --cudart <11.8>, the report of a thread left in the classic state by the 11.8 runtime, of
#   one after cudaDeviceReset with the 13 runtime, of a forked child, doctor --simulate, and the
#   census: diagnose() with torch, CuPy and cuda.bindings.runtime in one process, and with the
#   11.8 runtime beside 13's (doctor-census-*.txt/.json), and the census's tests.
# Each output is doctor-NAME.txt (or .json); doctor-exit-status.txt lists the exit statuses.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = "--fill-docs" ]; then
    # docs/classic-failure.md and docs/doctor.md mark each pasted block with <!-- doctor-capture: FILE -->; the
    # fenced block right after the marker is replaced by FILE's content.
    exec python3 - "${2:?usage: $0 --fill-docs DIR}" <<'EOF'
import pathlib, re, sys
src = pathlib.Path(sys.argv[1])
def paste(m):
    body = (src / m.group(2)).read_text().rstrip("\n")
    return f"{m.group(1)}```\n{body}\n```"
for readme in (pathlib.Path("docs/classic-failure.md"), pathlib.Path("docs/doctor.md")):
    text = readme.read_text()
    new, n = re.subn(r"(<!-- doctor-capture: ([\w.-]+) -->\n)```\n.*?\n```", paste, text, flags=re.S)
    readme.write_text(new)
    print(f"{readme}: {n} block(s) filled from {src}")
EOF
fi

OUT=${OUT:-/tmp/cyctx-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NO_COLOR=1
: > "$OUT/doctor-exit-status.txt"
echo "=== machine"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -m pip list 2>/dev/null | grep -i -E "^(cuda-bindings|cuda-pathfinder|nvidia-cuda-runtime)"

# Build only when the installed cyctx is not this tree's doctor (a fresh machine, or an old build).
same=1
for f in __main__.py $(cd src/cyctx && echo _doctor/*.py); do
    inst=$(cd /tmp && python3 -c "import cyctx, os; print(os.path.join(os.path.dirname(cyctx.__file__), '$f'))" 2>/dev/null)
    cmp -s "src/cyctx/$f" "$inst" || same=0
done
if [ "$same" = 0 ]; then
    echo "=== build cyctx"
    python3 -m pip install -q --no-index --no-deps --target /tmp/hdr .whl/nvidia_cuda_runtime-*.whl .whl/nvidia_cuda_profiler_api-*.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/st .whl/setuptools-*.whl
    CUDA_HOME=/tmp/hdr/nvidia/cu13 PYTHONPATH=/tmp/st python3 -m pip install -q --no-build-isolation --no-deps --no-index . || exit 1
fi

echo "=== CUDA 11.8 runtime from its wheel in .whl/"
python3 -m pip install -q --no-index --no-deps --target /tmp/cu11 .whl/nvidia_cuda_runtime_cu11-*.whl
CU11=/tmp/cu11/nvidia/cuda_runtime/lib/libcudart.so.11.0
ls -l "$CU11" || exit 1

cap() {  # cap FILE CMD...: run from /tmp (never the source tree), keep stdout+stderr and the status
    local file=$1; shift
    (cd /tmp && timeout "${CAP_TIMEOUT:-60}" "$@") > "$OUT/$file" 2>&1
    local rc=$?
    echo "$file: exit status $rc" | tee -a "$OUT/doctor-exit-status.txt"
}

cap doctor-report.txt    python3 -m cyctx doctor
cap doctor-report.json   python3 -m cyctx doctor --json
cap doctor-demo-cu13.txt python3 -m cyctx doctor --demo
cap doctor-demo-cu11.txt python3 -m cyctx doctor --demo --cudart "$CU11"

# The report of a thread in each broken state, made with the real runtime (not the CLI: the
# doctor's own process starts clean, so these call cyctx's diagnose() in the broken process).
cap doctor-classic-cu11.txt python3 -c "
import ctypes
rt = ctypes.CDLL('$CU11')
print('cudaSetDevice(0) ->', rt.cudaSetDevice(0), '(CUDA 11.8 runtime)')
from cyctx._doctor import diagnose
print(diagnose(cudart='$CU11'))"
cap doctor-reset-cu13.txt python3 -c "
from cyctx._doctor import diagnose, load_cudart
rt, why = load_cudart()
print(rt.label, why or '')
print('cudaSetDevice(0) ->', rt.set_device(0), ' cudaFree(0) ->', rt.free0(), ' cudaDeviceReset() ->', rt.device_reset())
print(diagnose())"
cap doctor-fork.txt python3 -c "
import os, cyctx
g = cyctx.ContextGuard(0)
pid = os.fork()
if pid == 0:
    from cyctx._doctor import diagnose
    print(diagnose(cudart=False)); os._exit(0)
os.waitpid(pid, 0); g.close()"
cap doctor-simulate.txt python3 -m cyctx doctor --simulate

# The census (docs/doctor.md, "Loaded: the census"). doctor-report.txt/.json above are the CLI's
# (a fresh process). These are cyctx.diagnose() in one process with torch, CuPy and
# cuda.bindings.runtime loaded and initialised, and with the CUDA 11.8 runtime of the carried
# wheel beside CUDA 13's; each writes the human report (.txt) and the JSON (.json). /tmp/cu11
# goes last on sys.path: its dist-info names the wheel, and its `nvidia` folder must not hide
# the CUDA 13 wheels'.
cap doctor-census-frameworks.txt python3 -c "
import json, torch, cupy
from cuda.bindings import runtime
torch.zeros(1, device='cuda'); cupy.zeros(1)
print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| CuPy', cupy.__version__,
      'runtime', cupy.cuda.runtime.runtimeGetVersion(), '| cuda.bindings.runtime', runtime.cudaRuntimeGetVersion()[1])
import cyctx
r = cyctx.diagnose()
print(r)
open('$OUT/doctor-census-frameworks.json', 'w').write(r.to_json())"
cap doctor-census-cu11.txt python3 -c "
import ctypes, sys
sys.path.append('/tmp/cu11')
from cyctx._doctor import load_cudart
rt13, why = load_cudart()
print(rt13.label if rt13 else why)
cu11 = ctypes.CDLL('$CU11')
import cyctx
r = cyctx.diagnose(cudart=False)
print(r)
open('$OUT/doctor-census-cu11.json', 'w').write(r.to_json())"
# The census's tests on the real driver (the rest of tests/test_doctor.py runs in run.sh).
CAP_TIMEOUT=300 cap doctor-census-pytest.txt env CYCTX_CUDART11="$CU11" python3 -m pytest --driver=real -q -p no:cacheprovider \
    -p no:benchmark -rs "$PWD/tests/test_doctor.py" -k "census or map_host or healthy or changes_nothing"

echo "=== outputs"
ls -l "$OUT"/doctor-*
cat "$OUT/doctor-exit-status.txt"
