#!/usr/bin/env python3
"""Mutation testing for cyctx: Cython, C++ headers, C (the simulated driver) and Python.

Each mutant in scripts/quality/mutants.toml replaces one exact snippet of one file with a plausible
bug. This script applies them one at a time to a scratch copy of the working tree (the tree
itself is never written), rebuilds only what the mutated file compiles into, runs the test
suite against that build, and reports whether the suite noticed:

  killed       a test failed (the first one is named)
  timeout      the run hung past the limit (counted as killed, with a note)
  survived     the whole suite passed: a behaviour nobody pins, or an equivalent mutant
  build-error  the mutant does not compile (not a mutant; fix or drop it)
  stale        its snippet is not in the file (exactly once): the code moved on; re-anchor it

    python scripts/quality/mutate.py                  # all mutants; table on stdout, JSON report
    python scripts/quality/mutate.py --list           # anchors only: which are stale (no build)
    python scripts/quality/mutate.py --only ID ...    # some of them
    python scripts/quality/mutate.py --mutants scripts/quality/mutants-blind.toml --json blind.json
                                                      # another set; the report elsewhere

How a mutant is built: the scratch tree is built once with `setup.py build_ext --inplace`,
whose compiler and linker commands are recorded. A mutated .pyx/.pxd/.h is re-Cythonized and
recompiled only for the extension modules that include it (found by following cimports,
`cdef extern from` and #include as the compilers resolve them: beside the including file,
then on the recorded -I path, so the headers of _cpp/ and include/cyctx/ count); a mutated
simdriver.c is recompiled into the simulator library alone, a mutated _trace/tracer.c into the
tracer's module alone; a Python file needs no build.
The built package lives in its own folder on PYTHONPATH (outside the scratch tree's src/, as
the consumer tests require), and every file a mutant touched there is put back from a
pristine copy before the next one. A run that hangs past the limit, or dies of a signal, is
reported with the test it was in.

Needs the development environment of docs/install.md (cuda-bindings, Cython, pytest, a C++
compiler) and Python 3.11+ (tomllib). Runs on the simulated driver by default.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_REL = os.path.join("src", "cyctx")
SIM_REL = os.path.join(PKG_REL, "_sim", "simdriver.c")
TRACER_REL = os.path.join(PKG_REL, "_trace", "tracer.c")  # the C extension cyctx._trace._native
FIELDS = {"id", "file", "find", "replace", "why", "tests", "equivalent"}


# --- the mutant set ---------------------------------------------------------------------------


def load_mutants(path):
    with open(path, "rb") as f:
        data = tomllib.load(f)
    mutants = data.get("mutant", [])
    seen = set()
    for m in mutants:
        unknown = set(m) - FIELDS
        missing = {"id", "file", "find", "replace", "why"} - set(m)
        if unknown or missing:
            raise SystemExit(
                f"mutant {m.get('id', '?')}: unknown fields {sorted(unknown)}, "
                f"missing {sorted(missing)}"
            )
        if m["id"] in seen:
            raise SystemExit(f"mutant id {m['id']} appears twice")
        if m["find"] == m["replace"]:
            raise SystemExit(f"mutant {m['id']}: find and replace are the same")
        seen.add(m["id"])
    return mutants


def anchor_status(tree, m):
    """None when the snippet occurs exactly once, else why the mutant is stale."""
    path = os.path.join(tree, m["file"])
    if not os.path.isfile(path):
        return f"{m['file']} does not exist"
    n = open(path, encoding="utf-8").read().count(m["find"])
    if n == 1:
        return None
    return "snippet not found" if n == 0 else f"snippet found {n} times (must be unique)"


# --- the scratch tree and its build -----------------------------------------------------------


def tree_files():
    """The working tree's files as git sees them: tracked, plus untracked ones not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(REPO, p))]


def copy_tree(dst):
    for rel in tree_files():
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(os.path.join(REPO, rel), os.path.join(dst, rel))


def run(cmd, cwd, env=None, timeout=None, log=None):
    """Run cmd in its own process group; (returncode or None on timeout, output, seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the run and every child it started
        out, _ = p.communicate()
        rc = None
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    if log is not None:
        log.write(f"$ {' '.join(cmd) if isinstance(cmd, list) else cmd}\n{out}\n")
    return rc, out, time.monotonic() - t0


class Build:
    """The scratch tree, its recorded build commands, and the package folder the tests use."""

    def __init__(self, scratch, log, suite=()):
        self.scratch = scratch
        self.suite = list(suite)  # pytest arguments of the suite; none: all of tests/
        self.tree = os.path.join(scratch, "tree")
        self.site = os.path.join(scratch, "site")
        self.pristine = os.path.join(scratch, "pristine")
        self.log = log
        self.exts = {}  # "_guard" -> {"compile": argv, "link": argv, "out": built .so}
        self.sim = None

    def setup(self):
        copy_tree(self.tree)
        rc, out, secs = run(
            [sys.executable, "setup.py", "build_ext", "--inplace"], self.tree, log=self.log
        )
        if rc != 0:
            raise SystemExit(f"the unmutated tree does not build:\n{out[-4000:]}")
        self._record_commands(out)
        print(f"built the scratch tree in {secs:.0f} s; extensions {sorted(self.exts)}", flush=True)
        # The package as the tests import it: outside tree/src (the consumer tests refuse an
        # import from the source tree), no generated C++, no bytecode.
        shutil.copytree(
            os.path.join(self.tree, PKG_REL),
            os.path.join(self.site, "cyctx"),
            ignore=shutil.ignore_patterns("*.cpp", "__pycache__"),
        )
        # The packages beside cyctx (the pytest plugin, src/_cyctx_pytest).
        for name in os.listdir(os.path.join(self.tree, "src")):
            here = os.path.join(self.tree, "src", name)
            if name != "cyctx" and os.path.isfile(os.path.join(here, "__init__.py")):
                ignore = shutil.ignore_patterns("__pycache__")
                shutil.copytree(here, os.path.join(self.site, name), ignore=ignore)
        shutil.copytree(self.site, self.pristine)

    def _record_commands(self, out):
        lines = [ln.strip() for ln in out.splitlines()]
        cmds = [
            shlex.split(ln) for ln in lines if re.match(r"^\S*(gcc|g\+\+|cc|c\+\+|clang\S*)\s", ln)
        ]
        names = sorted(
            os.path.basename(f)[:-4] for f in glob.glob(os.path.join(self.tree, PKG_REL, "*.pyx"))
        )
        for name in names:
            src = f"src/cyctx/{name}.cpp"
            comp = [c for c in cmds if "-c" in c and src in c]
            obj = comp[-1][comp[-1].index("-o") + 1] if comp else None
            link = [c for c in cmds if obj and obj in c and "-shared" in c]
            if not comp or not link:
                raise SystemExit(
                    f"could not find the build commands of {name} in setup.py's output"
                )
            self.exts[name] = {
                "compile": comp[-1],
                "link": link[-1],
                "out": link[-1][link[-1].index("-o") + 1],
            }
        comp = [c for c in cmds if "-c" in c and any(a.endswith("simdriver.c") for a in c)]
        obj = comp[-1][comp[-1].index("-o") + 1] if comp else None
        link = [c for c in cmds if obj and obj in c and "-shared" in c]
        if not comp or not link:
            raise SystemExit(
                "could not find the simulated driver's build commands in setup.py's output"
            )
        self.sim = {
            "compile": comp[-1],
            "link": link[-1],
            "out": link[-1][link[-1].index("-o") + 1],
        }
        comp = [c for c in cmds if "-c" in c and any(a.endswith(TRACER_REL) for a in c)]
        obj = comp[-1][comp[-1].index("-o") + 1] if comp else None
        link = [c for c in cmds if obj and obj in c and "-shared" in c]
        if not comp or not link:
            raise SystemExit("could not find the tracer's build commands in setup.py's output")
        self.tracer = {
            "compile": comp[-1],
            "link": link[-1],
            "out": link[-1][link[-1].index("-o") + 1],
        }

    # -- what a file compiles into

    def _include_dirs(self, ext):
        """The extension's -I folders inside the scratch tree, in the compiler's order, relative
        to it (those outside, cuda.h's and Python's, hold no file a mutant changes)."""
        argv, dirs = self.exts[ext]["compile"], []
        for i, a in enumerate(argv):
            if a == "-I" and i + 1 < len(argv):
                d = argv[i + 1]
            elif a.startswith("-I") and a != "-I":
                d = a[2:]
            else:
                continue
            d = os.path.relpath(os.path.normpath(os.path.join(self.tree, d)), self.tree)
            if not d.startswith(os.pardir) and d not in dirs:
                dirs.append(d)
        return dirs

    def _find(self, name, folders):
        """The first of folders/name that exists in the scratch tree (relative), else None."""
        for d in folders:
            rel = os.path.normpath(os.path.join(d, name))
            if os.path.isfile(os.path.join(self.tree, rel)):
                return rel
        return None

    def _deps(self, ext):
        """Every file of the scratch tree that extension `ext` is compiled from, found as the
        compilers find them: a cimport as a .pxd of the package; a Cython `include` beside the
        including file, then in the package; a `cdef extern from` header beside the generated
        .cpp (the package folder), then on the -I path; a C `#include "..."` beside the
        including header, then on the -I path. So cyctx/switch.h, reached through -I
        src/cyctx/include from the .pyx, the .pxd and _cpp/thread_entries.h, is one of them."""
        inc = self._include_dirs(ext)
        todo = [os.path.join(PKG_REL, f"{ext}.pyx"), os.path.join(PKG_REL, f"{ext}.pxd")]
        seen = set()
        while todo:
            f = todo.pop()
            if f is None or f in seen or not os.path.isfile(os.path.join(self.tree, f)):
                continue
            seen.add(f)
            text = open(os.path.join(self.tree, f), encoding="utf-8").read()
            here = os.path.dirname(f)
            if f.endswith((".pyx", ".pxd", ".pxi")):
                mods = re.findall(r"^\s*from\s+cyctx\.(\w+)\s+cimport", text, re.M)
                mods += re.findall(r"^\s*cimport\s+cyctx\.(\w+)", text, re.M)
                if re.search(r"^\s*from\s+cyctx\s+cimport", text, re.M):
                    mods.append("__init__")
                todo += [os.path.join(PKG_REL, f"{mod}.pxd") for mod in mods]
                for name in re.findall(r'^\s*include\s+"([^"]+)"', text, re.M):
                    todo.append(self._find(name, [here, PKG_REL]))
                for name in re.findall(r'cdef\s+extern\s+from\s+"([^"]+)"', text):
                    todo.append(self._find(name, [PKG_REL] + inc))
            else:
                for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
                    todo.append(self._find(name, [here] + inc))
        return seen

    def targets(self, rel):
        """('ext', name) / ('sim',) targets that a change of `rel` must rebuild."""
        if os.path.dirname(rel) == os.path.dirname(SIM_REL):
            return [("sim",)] if rel.endswith((".c", ".h")) else []
        if rel == TRACER_REL:
            return [("tracer",)]
        return [("ext", e) for e in sorted(self.exts) if rel in self._deps(e)]

    def rebuild(self, target):
        """Rebuild one target in the scratch tree and put it into the package folder."""
        if target[0] == "sim":
            steps, out, dest = (
                [self.sim["compile"], self.sim["link"]],
                self.sim["out"],
                "_sim/libcuda.so.1",
            )
        elif target[0] == "tracer":
            steps, out = [self.tracer["compile"], self.tracer["link"]], self.tracer["out"]
            dest = "_trace/" + os.path.basename(out)
        else:
            name = target[1]
            e = self.exts[name]
            cy = (
                f"import ast\nfrom Cython.Build import cythonize\n"
                f"from setuptools import Extension\n"
                f"tree = ast.parse(open('setup.py').read())\n"
                f"d = next(n.value for n in tree.body if isinstance(n, ast.Assign) and "
                f"getattr(n.targets[0], 'id', '') == 'DIRECTIVES')\n"
                f"cythonize([Extension('cyctx.{name}', ['src/cyctx/{name}.pyx'], language='c++')], "
                f"compiler_directives=ast.literal_eval(d), include_path=['src'], force=True, "
                f"quiet=True)\n"
            )
            steps, out, dest = (
                [[sys.executable, "-c", cy], e["compile"], e["link"]],
                e["out"],
                os.path.basename(e["out"]),
            )
        for argv in steps:
            rc, text, _ = run(argv, self.tree, log=self.log)
            if rc != 0:
                return text[-3000:]
        shutil.copyfile(os.path.join(self.tree, out), os.path.join(self.site, "cyctx", dest))
        return None

    def install_source(self, rel):
        """A source file the installed package ships (Python, headers, .pxd) goes there too."""
        if rel.startswith("src" + os.sep):
            inside = os.path.relpath(rel, "src")  # cyctx/..., or a package beside it
            if os.path.isfile(os.path.join(self.pristine, inside)):
                shutil.copyfile(os.path.join(self.tree, rel), os.path.join(self.site, inside))
                return inside
        return None

    def restore(self, rel, original, touched):
        with open(os.path.join(self.tree, rel), "w", encoding="utf-8") as f:
            f.write(original)
        for inside in touched:
            shutil.copyfile(os.path.join(self.pristine, inside), os.path.join(self.site, inside))


# --- running the suite ------------------------------------------------------------------------


# A plugin of the suite runs: it writes the id of the test starting now to a file, so that a run
# killed for hanging, or dead of a signal, says in which test (pytest's -q output names none).
PROGRESS_PLUGIN = '''"""Loaded by scripts/quality/mutate.py into the suites it runs."""
import os


def pytest_runtest_logstart(nodeid, location):
    with open(os.environ["CYCTX_MUTATE_PROGRESS"], "w") as f:
        f.write(nodeid)
'''


def test_env(build, driver):
    env = dict(os.environ)
    plugins = os.path.join(build.scratch, "plugins")
    os.makedirs(plugins, exist_ok=True)
    with open(os.path.join(plugins, "cyctx_mutate_progress.py"), "w") as f:
        f.write(PROGRESS_PLUGIN)
    env["PYTHONPATH"] = os.pathsep.join(
        [build.site, plugins] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a restored .py must never meet a mutant's bytecode
    env["CYCTX_TEST_DRIVER"] = driver
    env["CYCTX_MUTATE_PROGRESS"] = os.path.join(build.scratch, "progress")
    # The suite's test of this tool runs the tool: not inside a mutation run (it would build
    # and run a suite of its own for every survivor, and it is not what a mutant is about).
    env["CYCTX_MUTATION_RUN"] = "1"
    env.pop("CYCTX_SIM_LIBRARY", None)
    return env


def pytest(build, env, tests, timeout):
    """Run the suite (or `tests`): (returncode or None on timeout, output, seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "cyctx_mutate_progress",
        "--driver",
        env["CYCTX_TEST_DRIVER"],
    ]
    with contextlib.suppress(FileNotFoundError):
        os.remove(env["CYCTX_MUTATE_PROGRESS"])
    return run(
        cmd + list(tests or build.suite), build.tree, env=env, timeout=timeout, log=build.log
    )


def last_started(env):
    """The id of the last test that the latest suite run started, or None (none started)."""
    try:
        with open(env["CYCTX_MUTATE_PROGRESS"]) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def first_failure(out, rc=None, started=None):
    """The first failing test of a pytest run's output, or what else ended it (`started`: the
    last test the run started)."""
    for ln in out.splitlines():
        m = re.match(r"^(FAILED|ERROR) (.+?)(?: - .*)?$", ln)  # test ids may hold spaces
        if m:
            return m.group(2)
    if rc is not None and rc < 0:
        where = f" in {started}" if started else " before any test started"
        return f"the test process died of signal {-rc}{where} (a crash)"
    tail = [ln for ln in out.strip().splitlines() if ln.strip()]
    return f"pytest exited with {rc}: {tail[-1][:200] if tail else 'no output'}"


def try_mutant(build, m, env, timeout):
    rel = m["file"]
    path = os.path.join(build.tree, rel)
    original = open(path, encoding="utf-8").read()
    touched = []
    t0 = time.monotonic()
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original.replace(m["find"], m["replace"], 1))
        inside = build.install_source(rel)
        if inside:
            touched.append(inside)
        for target in build.targets(rel):
            touched.append(
                os.path.join(
                    "cyctx",
                    "_sim/libcuda.so.1"
                    if target[0] == "sim"
                    else "_trace/" + os.path.basename(build.tracer["out"])
                    if target[0] == "tracer"
                    else os.path.basename(build.exts[target[1]]["out"]),
                )
            )
            err = build.rebuild(target)
            if err is not None:
                return {"status": "build-error", "note": err[-800:]}
        build_s = time.monotonic() - t0
        runs = [m["tests"], []] if m.get("tests") else [[]]
        for tests in runs:
            rc, out, _ = pytest(build, env, tests, timeout)
            started = last_started(env)
            if rc is None:
                where = f"in {started}" if started else "before any test started (collection)"
                return {
                    "status": "timeout",
                    "by": started,
                    "note": f"hung {where}: no result after {timeout:.0f} s; counted as killed",
                    "build_s": build_s,
                }
            if rc != 0:
                return {
                    "status": "killed",
                    "by": first_failure(out, rc, started),
                    "build_s": build_s,
                }
        return {"status": "survived", "build_s": build_s}
    finally:
        # The scratch tree's generated .cpp and objects stay the mutant's: the next mutant of
        # that extension regenerates them; the package folder gets its pristine files back.
        build.restore(rel, original, touched)


# --- the report -------------------------------------------------------------------------------


def outcome(r):
    """A result in words: the test that killed it, or the note (a hang names its test there)."""
    if r["status"] == "timeout":
        return r.get("note", "")
    return r.get("by") or r.get("note", "")


def report(results, mutants, out_json, elapsed):
    by_id = {m["id"]: m for m in mutants}
    w = max(len(r["id"]) for r in results) if results else 10
    print()
    print(f"{'mutant':<{w}}  {'status':<11}  {'secs':>5}  detail")
    for r in results:
        m = by_id[r["id"]]
        detail = outcome(r)
        if r["status"] == "survived":
            detail = (
                f"EQUIVALENT: {m['equivalent']}"
                if m.get("equivalent")
                else "NOT EXPLAINED: " + m["why"]
            )
        print(
            f"{r['id']:<{w}}  {r['status']:<11}  {r.get('secs', 0):>5.0f}  "
            f"{detail.splitlines()[0] if detail else ''}"
        )
    count = {
        s: sum(r["status"] == s for r in results)
        for s in ("killed", "timeout", "survived", "build-error", "stale")
    }
    valid = count["killed"] + count["timeout"] + count["survived"]
    killed = count["killed"] + count["timeout"]
    equivalent = [
        r for r in results if r["status"] == "survived" and by_id[r["id"]].get("equivalent")
    ]
    unexplained = [
        r["id"]
        for r in results
        if r["status"] == "survived" and not by_id[r["id"]].get("equivalent")
    ]
    wrongly_equivalent = [
        r["id"]
        for r in results
        if r["status"] in ("killed", "timeout") and by_id[r["id"]].get("equivalent")
    ]
    score = killed / valid if valid else 0.0
    print()
    print(" ".join(f"{k}={v}" for k, v in count.items()) + f"  ({elapsed / 60:.1f} min)")
    print(
        f"score: {killed}/{valid} killed = {100 * score:.1f}%"
        + (
            f"; {len(equivalent)} equivalent survivor(s), {killed}/{valid - len(equivalent)} = "
            f"{100 * killed / (valid - len(equivalent)):.1f}% of the rest"
            if equivalent and valid > len(equivalent)
            else ""
        )
    )
    if unexplained:
        print(
            "survivors with no explanation (kill them with a test, or mark them equivalent): "
            f"{unexplained}"
        )
    if wrongly_equivalent:
        print(f"marked equivalent but killed (drop the mark): {wrongly_equivalent}")
    stale = [r["id"] for r in results if r["status"] == "stale"]
    if stale:
        print(f"STALE anchors (re-anchor them in scripts/quality/mutants.toml): {stale}")
    data = {
        "score": score,
        "counts": count,
        "unexplained_survivors": unexplained,
        "elapsed_s": round(elapsed),
        "mutants": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    with open(out_json, "w") as f:
        json.dump(data, f, indent=1)
    print(f"report: {out_json}")
    return 0 if not unexplained and not stale and count["build-error"] == 0 else 1


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mutants", default=os.path.join(REPO, "scripts", "quality", "mutants.toml"))
    ap.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    ap.add_argument(
        "--list", action="store_true", help="list the mutants and their anchors; build nothing"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds one suite run may take (default: 4x the unmutated run, at least 120)",
    )
    ap.add_argument(
        "--suite",
        nargs="+",
        metavar="TEST",
        help="the suite the mutants face: these test paths or ids (default: all of tests/)",
    )
    ap.add_argument("--driver", default="sim", choices=("sim", "real", "auto"))
    ap.add_argument("--json", default=os.path.join(REPO, "build", "mutation", "report.json"))
    ap.add_argument(
        "--keep", action="store_true", help="keep the scratch folder (its path is printed)"
    )
    args = ap.parse_args(argv)

    mutants = load_mutants(args.mutants)
    if args.only:
        unknown = set(args.only) - {m["id"] for m in mutants}
        if unknown:
            raise SystemExit(f"no such mutant: {sorted(unknown)}")
        mutants = [m for m in mutants if m["id"] in args.only]

    if args.list:
        bad = 0
        for m in mutants:
            why = anchor_status(REPO, m)
            bad += why is not None
            note = (
                "STALE: " + why if why else "ok" + (" (equivalent)" if m.get("equivalent") else "")
            )
            print(f"{m['id']:<40} {m['file']:<32} {note}")
        print(f"{len(mutants)} mutants, {bad} stale")
        return 1 if bad else 0

    # SIGTERM as well as Ctrl-C unwinds through the finally below, which removes the scratch.
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    scratch = tempfile.mkdtemp(prefix="cyctx-mutate-")
    t0 = time.monotonic()
    results = []
    try:
        with open(os.path.join(scratch, "build.log"), "w") as log:
            build = Build(scratch, log, args.suite or ())
            build.setup()
            env = test_env(build, args.driver)
            # The recorded commands rebuild every target once, unmutated, and the suite must
            # pass on that build: the replay is checked before any mutant relies on it.
            for target in [("ext", e) for e in sorted(build.exts)] + [("sim",), ("tracer",)]:
                err = build.rebuild(target)
                if err:
                    raise SystemExit(f"replaying the build of {target} failed:\n{err}")
            rc, out, secs = pytest(build, env, [], None)
            if rc != 0:
                raise SystemExit(
                    f"the unmutated suite fails ({first_failure(out, rc, last_started(env))}): "
                    f"fix that first\n{out[-3000:]}"
                )
            timeout = args.timeout or max(120.0, 4 * secs)
            print(
                f"unmutated suite: passed in {secs:.0f} s; limit per run {timeout:.0f} s",
                flush=True,
            )
            for i, m in enumerate(mutants, 1):
                why = anchor_status(build.tree, m)
                if why:
                    r = {"status": "stale", "note": why}
                else:
                    t1 = time.monotonic()
                    r = try_mutant(build, m, env, timeout)
                    r["secs"] = round(time.monotonic() - t1, 1)
                r = {"id": m["id"], "file": m["file"], **r}
                results.append(r)
                print(
                    f"[{i}/{len(mutants)}] {m['id']}: {r['status']} {outcome(r)[:160]}"
                    f" ({r.get('secs', 0):.0f} s)",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("interrupted: reporting what ran", file=sys.stderr)
    finally:
        if args.keep:
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return report(results, mutants, args.json, time.monotonic() - t0) if results else 1


if __name__ == "__main__":
    sys.exit(main())
