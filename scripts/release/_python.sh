# Sourced by scripts/release/build_wheels.sh and .ci/run: which CPythons cyctx supports, and where
# a CPython of a given minor is.

# supported_pythons -> "3.11", "3.12", ..., one a line, lowest first: pyproject.toml's classifiers,
# the one list of them.
supported_pythons() {
    sed -n 's/^ *"Programming Language :: Python :: \(3\.[0-9][0-9]*\)",\{0,1\}$/\1/p' \
        "$(dirname "${BASH_SOURCE[0]}")/../../pyproject.toml" | sort -V
}

# find_python 3.11 -> the newest 3.11.x under pyenv, else python3.11 on PATH, else nothing.
find_python() {
    local p
    p=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$p" ] || p=$(command -v "python$1" || true)
    echo "$p"
}

# free_threaded PYTHON -> status 0 when PYTHON is a free-threaded CPython (built without the GIL).
free_threaded() {
    [ "$("$1" -c 'import sysconfig; print(int(bool(sysconfig.get_config_var("Py_GIL_DISABLED"))))' 2>/dev/null)" = 1 ]
}
