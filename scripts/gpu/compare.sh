#!/usr/bin/env bash
# The guard's per-call cost for several builds side by side on one machine: the benchmarks'
# `core` group (driver floor, nogil guard, Python `with`) for each build, alternating, so that
# drift of the machine hits every build alike. For before/after figures of a change.
#
#   bash scripts/gpu/compare.sh ROUNDS TAG=WHEEL[=BENCHDIR] ...
#
# Each WHEEL is installed (no deps) into its own directory put first on PYTHONPATH; BENCHDIR is
# the bench/ to run with it (default: this checkout's; an older build needs the bench/ of its
# own commit, e.g. `git archive <commit> bench | tar -x -C .gpu/<tag>`). Writes each run's
# JSON under $OUT/compare (or /tmp/cyctx-compare) and prints the medians per row and build.
# CMP_ARGS adds arguments to run_all.py (e.g. "--sim --quick" for a dry run without a GPU;
# then also CMP_SIM=1).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=$1; shift
out=${OUT:-/tmp/cyctx-compare}/compare
mkdir -p "$out"
declare -a TAGS
for spec in "$@"; do
    IFS== read -r tag wheel bench <<<"$spec"
    TAGS+=("$tag")
    python3 -m pip install -q --no-index --no-deps --target "/tmp/cmp-$tag" "$wheel" || exit 1
    echo "${bench:-bench}" > "/tmp/cmp-$tag.bench"
done
for r in $(seq 1 "$ROUNDS"); do
    for tag in "${TAGS[@]}"; do
        echo "== round $r: $tag ($(date -u +%H:%M:%S))"
        (cd /tmp && PYTHONPATH="/tmp/cmp-$tag${PYTHONPATH:+:$PYTHONPATH}" timeout 200 python3 \
            "$OLDPWD/$(cat "/tmp/cmp-$tag.bench")/run_all.py" --only core --repeat 3 \
            --out-dir "$out/$tag-$r" --tag "$tag" ${CMP_ARGS:-} >"$out/$tag-$r.log" 2>&1) || { echo "failed:"; tail -20 "$out/$tag-$r.log"; }
    done
done
# A Python `with guard:` in a loop reuses one frame; a block in a function called per step
# gets a new frame each call (cyctx records the block's frame: that is where its cost shows).
for tag in "${TAGS[@]}"; do
    (cd /tmp && PYTHONPATH="/tmp/cmp-$tag${PYTHONPATH:+:$PYTHONPATH}" python3 - "$tag" ${CMP_SIM:+sim} <<'PY'
import sys, timeit
if len(sys.argv) > 2:
    from cyctx.testing import use_simulated_driver
    use_simulated_driver(2)
import cyctx
g = cyctx.ContextGuard(0)
g.__enter__()  # the fast path: the guard's context is current
def f():
    with g:
        pass
def h():
    pass
def loop(n):
    for _ in range(n):
        with g:
            pass
n = 200_000
best = {k: min(timeit.repeat(fn, number=1 if k == "loop" else n, repeat=7)) / n * 1e9
        for k, fn in (("loop", lambda: loop(n)), ("call", f), ("empty call", h))}
print(f"per-call {sys.argv[1]}: with in a loop {best['loop']:.1f} ns; in a function called per block "
      f"{best['call']:.1f} ns (an empty call {best['empty call']:.1f} ns)")
g.__exit__(None, None, None)
g.close()
PY
    ) 2>&1 | tee -a "$out/per-call.txt"
done
python3 - "$out" "${TAGS[@]}" <<'PY'
import glob, json, statistics, sys
out, tags = sys.argv[1], sys.argv[2:]
# Each run's rows that ran, read once: {tag: [{(layer, id, path): ns}, ...]}.
runs = {tag: [{(r["layer"], r["id"], r["path"]): r["ns"] for r in json.load(open(f)).get("cost", [])
               if r.get("status") == "ok"}
              for f in sorted(glob.glob(f"{out}/{tag}-*/*.json"))] for tag in tags}
keys = sorted({k for tag in tags for run in runs[tag] for k in run})
print(f"{'row':58s}" + "".join(f"{t:>16s}" for t in tags))
for key in keys:
    if key[0] not in ("driver", "cython", "python"):
        continue
    cells = ""
    for tag in tags:
        vals = [run[key] for run in runs[tag] if key in run]
        cells += f"{statistics.median(vals):16.2f}" if vals else f"{'-':>16s}"
    print(f"{'/'.join(key):58s}{cells}")
# A shared machine drifts by tens of percent between runs, moving the driver's calls and the
# guard's alike. The guard's own cost is what a fast-path enter+exit takes above the driver
# calls it makes (cuCtxGetId and two cuCtxGetCurrent), taken run by run from one run's rows.
guard, getid, getcur = (("cython", "cython.guard", "fast"), ("driver", "driver.getid", "fast"),
                        ("driver", "driver.getcurrent", "fast"))
print()
print(f"{'above its driver calls, per run (median)':58s}" + "".join(f"{t:>16s}" for t in tags))
cells = ""
for tag in tags:
    above = [run[guard] - run[getid] - 2 * run[getcur] for run in runs[tag]
             if guard in run and getid in run and getcur in run]
    cells += f"{statistics.median(above):16.2f}" if above else f"{'-':>16s}"
print(f"{'/'.join(guard):58s}{cells}")
PY
