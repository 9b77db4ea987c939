#!/usr/bin/env bash
# The test suite on aarch64, under emulation: wheelhouse/'s aarch64 wheel for CPython VERSION
# (scripts/release/build_wheels.sh --arch aarch64), installed with its test extras into a fresh
# venv of Debian's arm64 python in a chroot (scripts/release/debian_chroot.sh), then pytest on the
# simulated driver from the repository root, with ARGS (default: the whole suite).
#
#   bash scripts/release/arm64_suite.sh VERSION [PYTEST ARGS...]
#
# Fails when pytest fails, and when no test passed (pytest exits 0 when all skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
v=${1:?usage: arm64_suite.sh VERSION [PYTEST ARGS...]}
shift
wheels=(wheelhouse/cyctx-*-"cp${v/./}"-"cp${v/./}"-*_aarch64.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] \
    || { echo "arm64_suite: want one aarch64 wheel for Python $v in wheelhouse/, found: ${wheels[*]}" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bash scripts/release/debian_chroot.sh "arm64:$v" run "$PWD" bash -c '
    set -e
    v=$1 wheel=$2
    shift 2
    python$v -m venv /tmp/venv
    . /tmp/venv/bin/activate
    python -m pip install -q --upgrade pip
    python -m pip install -q "$wheel[test,cu13]"
    echo "arm64_suite: $(python -c "import platform, sys; print(sys.version.split()[0], platform.machine())"), $(basename "$wheel")"
    python -m pytest -p no:cacheprovider --driver=sim "$@"
' _ "$v" "$PWD/${wheels[0]}" "$@" 2>&1 | tee "$log"
# pytest's closing line, with its runs of = or without them (-q): "... N passed ... in Ts".
grep -qE '^(=+ )?([0-9]+ [a-z]+, )*[0-9]+ passed.* in [0-9.]+s' "$log" || { echo "arm64_suite: no test passed" >&2; exit 1; }
