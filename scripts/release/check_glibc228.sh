#!/usr/bin/env bash
# Install the cyctx wheel as a machine with glibc 2.28 (RHEL 8) would, and check it works.
#
#   bash scripts/release/check_glibc228.sh PYTHON [WHEELHOUSE]
#
# A venv of PYTHON gets a `_manylinux` module with PEP 600's `manylinux_compatible` hook,
# which pip consults for every manylinux tag: it answers "no" above glibc 2.28, so that pip
# accepts exactly what it would on a glibc 2.28 system. Checked: the hook is in force (pip's
# tags stop at manylinux_2_28); a wheel tagged manylinux_2_34 is refused; cyctx's wheel from
# WHEELHOUSE (default wheelhouse/) installs with its dependencies from the index (which must
# fit glibc 2.28 too), `pip check` is clean, and a guard works on the simulated driver.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${1:?usage: check_glibc228.sh PYTHON [WHEELHOUSE]}
WHEELHOUSE=$(realpath "${2:-wheelhouse}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin/python"
"$V" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
cat >"$("$V" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_manylinux.py" <<'EOF'
# PEP 600: pip asks this whether a manylinux_<major>_<minor>_<arch> wheel fits this system.
# The answer of a glibc 2.28 system.
def manylinux_compatible(tag_major, tag_minor, tag_arch):
    return (tag_major, tag_minor) <= (2, 28)
EOF

"$V" - <<'EOF'
from pip._vendor.packaging import tags
linux = [str(t) for t in tags.sys_tags() if "manylinux" in str(t)]
newest = max(int(t.split("manylinux_2_")[1].split("_")[0]) for t in linux if "manylinux_2_" in t)
assert newest == 28, f"the _manylinux hook is not in force: pip accepts manylinux_2_{newest}"
print("check_glibc228: pip's newest manylinux tag is manylinux_2_28")
EOF

py_tag=$("$V" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
arch=$(uname -m)
wheel=$(ls "$WHEELHOUSE"/cyctx-*-"$py_tag"-"$py_tag"-*manylinux*_"$arch".whl)
echo "check_glibc228: $(basename "$wheel")"

# The negative control: the same wheel, tagged for glibc 2.34, must be refused.
mkdir "$WORK/newer"
cp "$wheel" "$WORK/newer/$(basename "$wheel" | sed -E "s/-[^-]+\.whl\$/-manylinux_2_34_$arch.whl/")"
if "$V" -m pip install -q --no-index --no-deps --find-links "$WORK/newer" cyctx >"$WORK/refused.log" 2>&1; then
    echo "FAIL: a manylinux_2_34 wheel installed under the emulated glibc 2.28"; exit 1
fi
echo "check_glibc228: a manylinux_2_34 wheel is refused, as on glibc 2.28"

"$V" -m pip install -q --only-binary cyctx --find-links "$WHEELHOUSE" "cyctx==$(basename "$wheel" | cut -d- -f2)" 2>&1 \
    | grep -v "^WARNING: Location" || true
"$V" -m pip check
(cd "$WORK" && "$V" "$ROOT/scripts/release/guard_probe.py" && "$V" -c '
import importlib.metadata as md
import cyctx
tag = [l for l in md.distribution("cyctx").read_text("WHEEL").splitlines() if l.startswith("Tag:")]
print("check_glibc228: installed", cyctx.__version__, "with cuda-bindings", md.version("cuda-bindings"), "|", ", ".join(tag))
')
echo "check_glibc228: passed"
