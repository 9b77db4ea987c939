# Sourced by scripts/release/build_wheels.sh and .ci/run: where a CPython of a given minor is.
# find_python 3.11 -> the newest 3.11.x under pyenv, else python3.11 on PATH, else nothing.
find_python() {
    local p
    p=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$p" ] || p=$(command -v "python$1" || true)
    echo "$p"
}
