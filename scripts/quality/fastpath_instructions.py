"""Instructions per enter+exit on the fast path, counted by callgrind: a measure of the guard's
own code that, unlike a timing on a shared GPU machine, does not drift. Two loops: a Cython loop
of nogil g.enter(); g.exit(), and a Python loop of `with g: pass` beside the same loop over an
extension type whose __enter__/__exit__ do nothing (the floor of any Python `with`).

    python scripts/quality/fastpath_instructions.py [TAG=PATH ...]

Each TAG=PATH is a cyctx installation (a directory put first on sys.path, e.g. from
`pip install --target DIR --no-deps WHEEL`; an empty PATH: the cyctx this Python imports).
For each, the loops are compiled against it and run on the simulated driver under
`valgrind --tool=callgrind` for N and 2N iterations; the difference, divided by N, is what one
enter+exit costs. The nogil loop is split by the object that executes it: cyctx's `_guard`
module, the simulated libcuda (the driver calls themselves) and ld.so (where `__tls_get_addr`
runs for a general-dynamic thread-local: the simulated driver's, and older builds' stack). The
Python loops are counted whole (interpreter included): `with guard` and `with Empty()`, and
their ratio. Needs valgrind, a C++
compiler and Cython.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

N = 10_000

LOOP = textwrap.dedent("""
    from cyctx cimport ContextGuard
    def loop(ContextGuard g, long n):
        cdef long i
        with nogil:
            for i in range(n):
                g.enter()
                g.exit()

    cdef class Empty:
        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            return False
""")

BUILD = textwrap.dedent("""
    import cyctx
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    inc = getattr(cyctx, "get_include_dirs", cyctx.get_include)()  # older cyctx: get_include()
    ext = Extension("loop", ["loop.pyx"], include_dirs=inc if isinstance(inc, list) else [inc], language="c++",
                    extra_compile_args=["-std=c++17", "-O2"])
    setup(ext_modules=cythonize([ext], quiet=True), script_args=["build_ext", "--inplace"])
""")

RUN = textwrap.dedent("""
    import sys
    from cyctx.testing import use_simulated_driver
    use_simulated_driver(2)
    import cyctx, loop
    def pyloop(cm, n):
        for _ in range(n):
            with cm:
                pass
    g = cyctx.ContextGuard(0)
    g.__enter__()  # the guard's context is current: every enter below is the fast path
    which, n = sys.argv[1], int(sys.argv[2])
    if which == "nogil":
        loop.loop(g, n)
    else:
        pyloop(g if which == "with" else loop.Empty(), n)
    g.__exit__(None, None, None)
    g.close()
""")


def per_object(profile: str) -> collections.Counter:
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", profile],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total: collections.Counter = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+.*\[(.*)\]\s*$", line)
        if m:
            total[os.path.basename(m.group(2))] += int(m.group(1).replace(",", ""))
    return total


def measure(tag: str, path: str, work: str) -> dict[str, float]:
    d = os.path.join(work, tag)
    os.makedirs(d)
    with open(os.path.join(d, "loop.pyx"), "w") as f:
        f.write(LOOP)
    with open(os.path.join(d, "run.py"), "w") as f:
        f.write(RUN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, d) if p))
    subprocess.run([sys.executable, "-c", BUILD], cwd=d, env=env, check=True, capture_output=True)
    out = {}
    for which in ("nogil", "with", "empty"):
        counts = []
        for n in (N, 2 * N):
            prof = os.path.join(d, f"cg-{which}-{n}.out")
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={prof}",
                    sys.executable,
                    "run.py",
                    which,
                    str(n),
                ],
                cwd=d,
                env=env,
                check=True,
                capture_output=True,
            )
            counts.append(per_object(prof))
        a, b = counts
        out[which] = {k: (b[k] - a[k]) / N for k in set(a) | set(b)}
    return out


def main(argv: list[str]) -> int:
    if not shutil.which("valgrind"):
        print("valgrind is not installed", file=sys.stderr)
        return 2
    specs = [s.partition("=")[::2] for s in argv] or [("installed", "")]
    work = tempfile.mkdtemp(prefix="cyctx-instr-")
    print(f"instructions per enter+exit, fast path, simulated driver ({N} and {2 * N} iterations)")
    print(
        f"{'build':12s}{'_guard':>10s}{'libcuda':>10s}{'ld.so':>10s}"
        f"{'with guard':>12s}{'with Empty':>12s}{'ratio':>8s}"
    )
    for tag, path in specs:
        d = measure(tag, path, work)

        def pick(prefix, d=d["nogil"]):
            return sum(v for k, v in d.items() if k.startswith(prefix))

        with_guard, with_empty = (sum(d[w].values()) for w in ("with", "empty"))
        print(
            f"{tag:12s}{pick('_guard.'):10.1f}{pick('libcuda'):10.1f}{pick('ld-linux'):10.1f}"
            f"{with_guard:12.1f}{with_empty:12.1f}{with_guard / with_empty:8.3f}"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
