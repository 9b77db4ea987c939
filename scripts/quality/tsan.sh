#!/usr/bin/env bash
# ThreadSanitizer over cyctx's native code on the simulated driver (docs/packaging.md, "What is
# checked where").
#
# Builds a copy of the extension and of the simulated driver with -fsanitize=thread (in a
# temporary directory; the tree and the installed cyctx are untouched), builds the harness
# (tsan/tsan_harness.pyx, a Cython module that cimports cyctx), and runs tsan/run.py under
# gcc's libtsan, preloaded since CPython itself is not instrumented:
#   1. the self-test: a deliberate data race (tsan_harness.racy) must be reported;
#   2. the check: 16 threads over the nogil surface for $CYCTX_TSAN_SECONDS (default 20) must
#      give no report at all, and every workload must have run (run.py says what they are);
#   3. the same under cyctx.trace(): the tracer's callback and its lock-free buffer, written by
#      the 16 threads and read by the main thread while they run, must give no report either.
# --seed-cyctx-race: the self-test inside cyctx instead. The copy's guard fields read and
# written across threads without the GIL (shared_fields.h's u64_load/u64_store: the context id
# that enter() reads and a reset re-activation writes) become plain accesses, and the check must
# then report a data race there; nothing else is checked (a second build: slower).
# Needs gcc with libtsan (Debian: libtsan2) and a Python with cyctx's build requirements
# (Cython, setuptools, cuda-bindings and the nvidia-cuda-runtime wheel of the same major, as
# `pip install ".[test,cu13]"` brings): $PYTHON, else `python` on PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python}
RUN_SECONDS=${CYCTX_TSAN_SECONDS:-20}
SEED_CYCTX=0
case "${1:-}" in
"") ;;
--seed-cyctx-race) SEED_CYCTX=1 ;;
*) echo "usage: $0 [--seed-cyctx-race]" >&2; exit 2 ;;
esac
LIBTSAN=$(gcc -print-file-name=libtsan.so.2)
if [ ! -f "$LIBTSAN" ]; then
    echo "tsan.sh: gcc has no libtsan.so.2 (Debian: apt-get install libtsan2)" >&2
    exit 1
fi

WORK=$(mktemp -d)  # tree/: the copy of cyctx built with TSan; harness/: the harness
mkdir "$WORK/tree" "$WORK/harness"
trap '[ -n "${CYCTX_TSAN_KEEP:-}" ] || rm -rf "$WORK"' EXIT
t0=$(date +%s)

# The sources as they are (tracked and new files), without anything built in the tree; outside
# a git checkout (an unpacked sdist), all of them (the build replaces what was built).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- src setup.py pyproject.toml README.md LICENSE |
        xargs -0 cp --parents -t "$WORK/tree"
else
    cp -r src setup.py pyproject.toml README.md LICENSE "$WORK/tree/"
fi
cp scripts/quality/tsan/tsan_harness.pyx scripts/quality/tsan/run.py \
    scripts/quality/tsan/build_harness.py "$WORK/harness/"
if [ "$SEED_CYCTX" = 1 ]; then
    FIELDS=$WORK/tree/src/cyctx/_cpp/shared_fields.h
    sed -i -e '/u64_load/s/__atomic_load_n(p, __ATOMIC_RELAXED)/*p/' \
        -e '/u64_store/s/__atomic_store_n(p, v, __ATOMIC_RELAXED)/*p = v/' "$FIELDS"
    [ "$(grep -c -e 'return \*p; }' -e '{ \*p = v; }' "$FIELDS")" = 2 ] ||
        { echo "tsan.sh: could not seed the race in shared_fields.h" >&2; exit 1; }
    echo "tsan.sh: seeded a race in cyctx: u64_load/u64_store of shared_fields.h made plain"
fi

echo "tsan.sh: building cyctx and the simulated driver with -fsanitize=thread"
# gcc, whose libtsan is the one preloaded. setup.py's own flags follow these (-O2 as in a
# release build). Symbols kept for the reports (CYCTX_DEBUG=1); linked against the system's
# libraries, not the wheel's glibc stubs.
(cd "$WORK/tree" &&
    CC=gcc CXX=g++ CFLAGS="-fsanitize=thread -g" CXXFLAGS="-fsanitize=thread -g" LDFLAGS="-fsanitize=thread" \
        CYCTX_DEBUG=1 CYCTX_COMPAT_STUBS=0 "$PY" setup.py -q build_ext --inplace >"$WORK/build.log" 2>&1) ||
    { cat "$WORK/build.log"; exit 1; }
(cd "$WORK/harness" && CC=gcc CXX=g++ "$PY" build_harness.py ../tree/src >>"$WORK/build.log" 2>&1) || { cat "$WORK/build.log"; exit 1; }
for so in "$WORK"/tree/src/cyctx/_guard*.so "$WORK"/tree/src/cyctx/_sim/libcuda.so.1 \
    "$WORK"/tree/src/cyctx/_trace/_native*.so \
    "$WORK"/harness/tsan_harness*.so; do
    # grep -c reads all of nm's output (grep -q could stop early and fail the pipe: pipefail).
    nm -D --undefined-only "$so" | grep -c __tsan_func_entry >/dev/null ||
        { echo "tsan.sh: $so is not instrumented" >&2; exit 1; }
done
t1=$(date +%s)
echo "tsan.sh: built in $((t1 - t0)) s"

run() {  # $1: log name; the rest: run.py's arguments. Sets REPORTS (ThreadSanitizer reports).
    local log=$WORK/$1
    (cd "$WORK/harness" &&
        env LD_PRELOAD="$LIBTSAN" PYTHONPATH="$WORK/tree/src:$WORK/harness" PYTHONDONTWRITEBYTECODE=1 \
            TSAN_OPTIONS="log_path=$log halt_on_error=0 exitcode=0 die_after_fork=0 suppressions=$SUPP print_suppressions=1" \
            timeout 600 "$PY" run.py "${@:2}") || { echo "tsan.sh: run.py ${*:2} failed" >&2; cat "$log".* 2>/dev/null; exit 1; }
    # One log per process (log.PID: the forked children have their own).
    touch "$log.none"
    REPORTS=$(cat "$log".* | grep -c '^WARNING: ThreadSanitizer' || true)
}
SUPP=$ROOT/scripts/quality/tsan/suppressions.txt

if [ "$SEED_CYCTX" = 1 ]; then
    run check --seconds "$RUN_SECONDS"
    if grep -q 'data race' "$WORK"/check.* && grep -q 'shared_fields.h' "$WORK"/check.*; then
        echo "tsan.sh: seen: $REPORTS report(s), in shared_fields.h: $(grep -h -m1 '^SUMMARY: ThreadSanitizer' "$WORK"/check.*)"
        exit 0
    fi
    echo "tsan.sh: the race seeded in shared_fields.h was NOT reported" >&2
    cat "$WORK"/check.*
    exit 1
fi

echo "tsan.sh: self-test: a deliberate data race must be reported"
run seeded --seed-race
if [ "$REPORTS" -lt 1 ] || ! grep -q 'data race' "$WORK"/seeded.* || ! grep -q 'tsan_racy_increment' "$WORK"/seeded.*; then
    echo "tsan.sh: the seeded race in tsan_harness.racy was NOT reported: the harness cannot see races" >&2
    cat "$WORK"/seeded.*
    exit 1
fi
echo "tsan.sh: seen: $(grep -h -m1 '^SUMMARY: ThreadSanitizer' "$WORK"/seeded.*)"

echo "tsan.sh: 16 threads over the nogil surface for ${RUN_SECONDS} s"
run check --seconds "$RUN_SECONDS"
if [ "$REPORTS" -ne 0 ]; then
    cat "$WORK"/check.*
    echo "tsan.sh: $REPORTS ThreadSanitizer report(s)" >&2
    exit 1
fi

echo "tsan.sh: the same under cyctx.trace() (the tracer's callback and its buffer) for ${RUN_SECONDS} s"
run traced --seconds "$RUN_SECONDS" --trace
if [ "$REPORTS" -ne 0 ]; then
    cat "$WORK"/traced.*
    echo "tsan.sh: $REPORTS ThreadSanitizer report(s) under the trace" >&2
    exit 1
fi
t2=$(date +%s)
# What the suppressions dropped (reasons in suppressions.txt), summed over the processes.
SUPPRESSED=$(cat "$WORK"/check.* "$WORK"/traced.* | awk '/^ThreadSanitizer: Matched/ {m=1; next} m && /^ *[0-9]+ / {n[$2]+=$1; next} {m=0} END {for (k in n) printf "%s%d %s", sep, n[k], k; sep=", "}')
echo "tsan.sh: 0 ThreadSanitizer reports; suppressed: ${SUPPRESSED:-none} (build $((t1 - t0)) s, runs $((t2 - t1)) s)"
