"""numpy's spelling, include_dirs=[cyctx.get_include()], with no cuda.h on the path: the build
stops with cyctx's words first in every order a module cimports cuda.bindings' cydriver (which
includes cuda.h) and cyctx, and in every order a C file includes cuda.h and cyctx/switch.h; with
a cuda.h on the path, before or after cyctx's directory, each order compiles."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import cyctx

CYCTX_SAYS = "cyctx: cuda.h is not on the include path"
BARE = "cuda.h: No such file or directory"

SETUP = textwrap.dedent("""
    import sys
    import cyctx
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    dirs = {"alone": [cyctx.get_include()], "all": cyctx.get_include_dirs(),
            "reversed": cyctx.get_include_dirs()[::-1]}[sys.argv.pop()]
    ext = Extension("spelling", ["spelling.pyx"], include_dirs=dirs, language="c++")
    setup(name="spelling", ext_modules=cythonize([ext], quiet=True),
          script_args=["build_ext", "--inplace"])
""")

ORDERS = {
    "cydriver first (docs/cython-api.md's order)": (
        "from cuda.bindings cimport cydriver\nfrom cyctx cimport ContextGuard, check_result\n"
    ),
    "cyctx first": "from cyctx cimport ContextGuard, Switch\nfrom cuda.bindings cimport cydriver\n",
    "cydriver first, cimport cyctx": "from cuda.bindings cimport cydriver\ncimport cyctx\n",
}


def _cc():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def _no_cuda_h_by_default(cc, tmp_path):
    # Where the compiler finds a cuda.h without being told (CPATH, a system directory), the
    # spelling works and there is nothing to report.
    src = tmp_path / "probe.c"
    src.write_text('#include "cuda.h"\n')
    if subprocess.run([cc, "-fsyntax-only", str(src)], capture_output=True).returncode == 0:
        pytest.skip("this compiler finds a cuda.h without include directories")


def _cuda_dir():
    try:
        return cyctx.get_include_dirs()[1]
    except Exception as exc:  # no cuda.h installed: nothing to find
        pytest.skip(f"no cuda.h for this cuda-bindings: {exc}")


def _build(tmp_path, cimports, dirs):
    (tmp_path / "spelling.pyx").write_text(
        cimports + "\ndef f():\n    return cydriver.CUDA_SUCCESS\n"
    )
    (tmp_path / "setup_spelling.py").write_text(SETUP)
    return subprocess.run(
        [sys.executable, "setup_spelling.py", dirs],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("order", list(ORDERS))
def test_every_cimport_order_without_cuda_h_says_what_to_do_first(tmp_path, order):
    _no_cuda_h_by_default(_cc(), tmp_path)
    proc = _build(tmp_path, ORDERS[order], "alone")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert CYCTX_SAYS in out and "include_dirs=cyctx.get_include_dirs()" in out, out[-4000:]
    assert BARE not in out or out.index(CYCTX_SAYS) < out.index(BARE), "cyctx's words first"
    # The compiler's first diagnostic (its command line may hold "error" too: Debian's
    # Pythons build extensions with -Werror=format-security).
    first_error = next(ln for ln in out.splitlines() if "error:" in ln)
    assert CYCTX_SAYS in first_error, first_error


@pytest.mark.slow
@pytest.mark.parametrize("dirs", ["all", "reversed"])
def test_with_cuda_h_on_the_path_either_order_of_directories_builds(tmp_path, dirs):
    _cuda_dir()
    proc = _build(tmp_path, ORDERS["cydriver first (docs/cython-api.md's order)"], dirs)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _compile(cc, tmp_path, source, *flags, env=None):
    src = tmp_path / "uses.c"
    src.write_text(
        source + "int main(void) { CUcontext c = 0; cyctx_Switch s; (void)c; (void)s; return 0; }\n"
    )
    return subprocess.run(
        [cc, "-fsyntax-only", *flags, str(src)], capture_output=True, text=True, env=env
    )


C_ORDERS = {
    "cuda.h first": '#include <cuda.h>\n#include "cyctx/switch.h"\n',
    "quoted cuda.h first": '#include "cuda.h"\n#include "cyctx/switch.h"\n',
    "switch.h first": '#include "cyctx/switch.h"\n#include <cuda.h>\n',
}


@pytest.mark.parametrize("order", list(C_ORDERS))
def test_c_in_every_include_order(tmp_path, order):
    cc = _cc()
    _no_cuda_h_by_default(cc, tmp_path)
    proc = _compile(cc, tmp_path, C_ORDERS[order], "-I", cyctx.get_include())
    assert proc.returncode != 0, proc.stderr
    first_error = next(ln for ln in proc.stderr.splitlines() if "error" in ln)
    assert CYCTX_SAYS in first_error, proc.stderr
    # Asked not to look, it does not: the compiler's own error.
    proc = _compile(
        cc, tmp_path, C_ORDERS[order], "-I", cyctx.get_include(), "-DCYCTX_NO_CUDA_H_CHECK"
    )
    assert proc.returncode != 0 and CYCTX_SAYS not in proc.stderr and BARE in proc.stderr
    cuda = _cuda_dir()
    for flags in (
        ["-I", cyctx.get_include(), "-I", cuda],
        ["-I", cuda, "-I", cyctx.get_include()],
        ["-I", cyctx.get_include(), "-isystem", cuda],
    ):
        proc = _compile(cc, tmp_path, C_ORDERS[order], *flags)
        assert proc.returncode == 0, (flags, proc.stderr)
    # A cuda.h the compiler finds by CPATH is on the path too.
    env = dict(os.environ, CPATH=cuda)
    proc = _compile(cc, tmp_path, C_ORDERS[order], "-I", cyctx.get_include(), env=env)
    assert proc.returncode == 0, proc.stderr


def test_a_cuda_h_beside_the_source_is_the_one_taken(tmp_path):
    # A quoted include looks beside the including file first, and cyctx's cuda.h, reached
    # through switch.h after it, then does nothing: no -I to the real header needed.
    cc = _cc()
    _no_cuda_h_by_default(cc, tmp_path)
    shutil.copy(os.path.join(_cuda_dir(), "cuda.h"), tmp_path / "cuda.h")
    proc = _compile(
        cc, tmp_path, '#include "cuda.h"\n#include "cyctx/switch.h"\n', "-I", cyctx.get_include()
    )
    assert proc.returncode == 0, proc.stderr
