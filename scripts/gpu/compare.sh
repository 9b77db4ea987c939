#!/usr/bin/env bash
# The guard's per-call cost for several builds side by side on one machine, alternating, for
# before/after figures of a change (scripts/gpu/README.md, "compare.sh", says what it runs and
# writes):
#
#   bash scripts/gpu/compare.sh ROUNDS TAG=WHEEL[=BENCHDIR] ...
#
# CMP_ARGS adds arguments to run_all.py (e.g. "--sim --quick" for a dry run without a GPU).
# pyperf comes from the environment, or from .whl/pyperf-*.whl (installed into /tmp).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=$1; shift
out=${OUT:-/tmp/cyctx-compare}/compare
mkdir -p "$out"
if ! python3 -c "import pyperf" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/cmp-pyperf .whl/pyperf-*.whl || exit 1
    export PYTHONPATH=/tmp/cmp-pyperf${PYTHONPATH:+:$PYTHONPATH}
fi
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
        # shellcheck disable=SC2086
        (cd /tmp && PYTHONPATH="/tmp/cmp-$tag${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 \
            "$OLDPWD/$(cat "/tmp/cmp-$tag.bench")/run_all.py" --only nogil,python \
            --out-dir "$out/$tag-$r" --tag "$tag" ${CMP_ARGS:-} >"$out/$tag-$r.log" 2>&1) || { echo "failed:"; tail -20 "$out/$tag-$r.log"; }
    done
done
python3 - "$out" "${TAGS[@]}" <<'PY'
import glob, statistics, sys
import pyperf
out, tags = sys.argv[1], sys.argv[2:]
rounds = {tag: [pyperf.BenchmarkSuite.load(f) for f in sorted(glob.glob(f"{out}/{tag}-*/bench-{tag}.json"))]
          for tag in tags}
for tag, suites in rounds.items():  # each build's rounds, one suite: TAG.json
    merged = suites[0]
    for suite in suites[1:]:
        merged.add_runs(suite)
    merged.dump(f"{out}/{tag}.json", replace=True)
# A shared machine drifts by tens of percent between runs, moving the driver's calls and the
# guard's alike. The guard's own cost is what a fast-path enter+exit takes above the driver
# calls it makes (cuCtxGetId and two cuCtxGetCurrent), taken round by round from one round's rows.
print(f"{'nogil guard.enter()/exit() above its driver calls, per round (median), ns':76s}"
      + "".join(f"{t:>14s}" for t in tags))
cells = ""
for tag, suites in rounds.items():
    above = []
    for suite in suites:
        m = {b.get_name(): b.median() * 1e9 for b in suite.get_benchmarks()}
        above.append(m["nogil/cython.guard/fast"] - m["nogil/driver.getid/fast"]
                     - 2 * m["nogil/driver.getcurrent/fast"])
    cells += f"{statistics.median(above):14.2f}" if above else f"{'-':>14s}"
print(f"{'':76s}{cells}")
PY
files=()
for tag in "${TAGS[@]}"; do files+=("$out/$tag.json"); done
python3 -m pyperf compare_to --table "${files[@]}" | tee "$out/compare.txt"
