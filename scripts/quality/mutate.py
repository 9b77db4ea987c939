#!/usr/bin/env python3
"""Mutation testing for cyctx: Cython, C/C++ headers, C and Python.

A mutant is one plausible bug, applied to a scratch copy of the working tree (the tree itself is
never written); what the mutated file compiles into is rebuilt and the tests that cover it run.
docs/mutation.md tells the two kinds of mutant (operators, listed), the outcomes and the
options:

    python scripts/quality/mutate.py --list                    # both sets; builds nothing
    python scripts/quality/mutate.py --sample 30 --seed 1      # 30 of them, chosen reproducibly

How a mutant is built: the scratch tree is built once with `setup.py build_ext --inplace`,
whose compiler and linker commands are recorded; a mutated .pyx/.pxi/.h is recompiled only
into the extension modules that include it (following cimports, `include`, `cdef extern from`
and #include), a C library source (C_LIBRARIES) into that library alone, a Python file needs
no build. The built package lives outside the scratch tree's src/ (the consumer tests require
it), and every file a mutant touched there is put back from a pristine copy before the next.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import fnmatch
import glob
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_REL = os.path.join("src", "cyctx")
# The C libraries setup.py builds beside the extension modules, each from one source: the
# simulated driver and its CUPTI, and the tracer's module (cyctx._trace._native).
C_LIBRARIES = tuple(
    os.path.join(PKG_REL, *p.split("/"))
    for p in ("_sim/simdriver.c", "_sim/simcupti.c", "_trace/tracer.c")
)
CURATED = os.path.join(REPO, "scripts", "quality", "mutants.toml")
FIELDS = {"id", "file", "function", "find", "replace", "why", "tests", "equivalent"}

# The files operator mutants are generated over, unless --files names others.
TARGETS = (
    "src/cyctx/_guard.pyx",
    "src/cyctx/_native/*.pxi",
    "src/cyctx/_protocol/*",
    "src/cyctx/_cpp/*.h",
    "src/cyctx/_trace/tracer.c",
    "src/cyctx/*.py",
    "src/cyctx/_doctor/*.py",
    "src/cyctx/_trace/*.py",
    "src/_cyctx_*/*.py",
)

# The tests that cover a file: the first entry whose prefix the file's path starts with.
# The guard through Python, then its nogil Cython API (the consumer, compiled against the build).
GUARD_TESTS = [
    "tests/guard",
    "tests/test_thread_stack*.py",
    "tests/test_registry.py",
    "tests/test_consumer.py",
]
DOCTOR_TESTS = ["tests/test_doctor*.py", "tests/test_runtime.py", "tests/test_lookup_orders.py"]
COVERS = (
    ("src/cyctx/_trace/", ["tests/trace"]),
    ("src/cyctx/_doctor/", DOCTOR_TESTS),
    ("src/cyctx/doctor.py", DOCTOR_TESTS),
    ("src/cyctx/__main__.py", DOCTOR_TESTS),
    ("src/cyctx/_census.py", DOCTOR_TESTS + ["tests/test_fork_checks.py"]),
    (
        "src/_cyctx_pytest/",
        [
            "tests/test_pytest_plugin.py",
            "tests/test_plugin_first_init.py",
            "tests/test_same_context_rule.py",
            "tests/trace/test_trace_plugin.py",
        ],
    ),
    (
        "src/_cyctx_libcuda/",
        [
            "tests/test_fork_checks.py",
            "tests/test_testing_module.py",
            "tests/test_pytest_plugin.py",
            "tests/test_lookup_orders.py",
        ],
    ),
    (
        "src/cyctx/testing.py",
        ["tests/test_testing_module.py", "tests/test_lookup_orders.py", "tests/sim"],
    ),
    (
        "src/cyctx/_fork.py",
        ["tests/test_fork_checks.py", "tests/guard/test_fork.py", "tests/test_doctor_fork.py"],
    ),
    ("src/cyctx/_bind.py", ["tests/guard/test_bind.py", "tests/test_pools.py"]),
    ("src/cyctx/_cuda_headers.py", ["tests/test_cuda_headers.py"]),
    ("src/cyctx/_sim/", ["tests/sim", "tests/guard"]),
    ("src/cyctx/", GUARD_TESTS),  # the native core, the inputs, the errors
)


def covering_tests(rel, root=REPO):
    for prefix, tests in COVERS:
        if rel.startswith(prefix):
            found = []
            for t in tests:
                hits = sorted(glob.glob(os.path.join(root, t)))
                found += [os.path.relpath(h, root) for h in hits]
            return found
    return []


# --- operator mutants -------------------------------------------------------------------------


class Line:
    """One source line as the lexer saw it: its text, a mask of what each character is (c code,
    s string, k comment), the bracket depth at its start, and whether a string or comment was
    open there."""

    __slots__ = ("text", "mask", "depth", "open", "braces")

    def __init__(self, text, mask, depth, open_, braces):
        self.text, self.mask, self.depth, self.open, self.braces = text, mask, depth, open_, braces

    def blank(self):
        """The line with its comments blanked, trailing space and newline dropped."""
        return "".join(
            " " if k == "k" else ch for ch, k in zip(self.text, self.mask, strict=True)
        ).rstrip()


def lex(text, c_like):
    """The file's lines with masks: enough of Python's, Cython's and C's strings and comments
    to keep mutants out of them, and the bracket depth that tells a statement's first line."""
    out, depth, braces, state = [], 0, 0, None  # state: None, or (kind, closing delimiter)
    for line in text.splitlines(keepends=True):
        start, mask, i = (depth, state is not None, braces), [], 0
        while i < len(line):
            ch = line[i]
            if state is not None:
                kind, close = state
                if kind == "s" and ch == "\\":
                    mask += "ss"
                    i += 2
                elif line.startswith(close, i):
                    mask += kind * len(close)
                    i += len(close)
                    state = None
                else:
                    mask.append(kind)
                    i += 1
                continue
            if (c_like and line.startswith("//", i)) or (not c_like and ch == "#"):
                mask += "k" * (len(line) - i)
                break
            if c_like and line.startswith("/*", i):
                state = ("k", "*/")
                mask += "kk"
                i += 2
                continue
            if ch in "\"'":
                quote = ch * 3 if not c_like and line.startswith(ch * 3, i) else ch
                state = ("s", quote)
                mask += "s" * len(quote)
                i += len(quote)
                continue
            if ch in "([" or (ch == "{" and not c_like):
                depth += 1
            elif ch in ")]" or (ch == "}" and not c_like):
                depth = max(depth - 1, 0)
            elif ch == "{":
                braces += 1
            elif ch == "}":
                braces = max(braces - 1, 0)
            mask.append("c")
            i += 1
        if state is not None and state[0] == "s" and len(state[1]) == 1:
            state = None  # a one-quote string ends with its line (a continued one is rare)
        out.append(Line(line, "".join(mask[: len(line)]), start[0], start[1], start[2]))
    return out


C_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "catch", "defined", "do"}
C_HEADER = re.compile(
    r"\b(\w+)\s*\((?:[^;{}()]|\([^;{}()]*\))*\)\s*(?:const\s*)?(?:noexcept\s*)?\{"
)
P_DEF = re.compile(r"^(\s*)(async\s+def|def|cpdef|cdef|class)\b")


def function_spans(lines, c_like):
    """[(qualified name, first line, last line)], 1-based, for every function (and class) of
    the file; a C function's body starts at its header's line."""
    spans = []
    if c_like:
        text = "".join(ln.blank() + "\n" for ln in lines)
        starts = [0]
        for ln in lines:
            starts.append(starts[-1] + len(ln.blank()) + 1)
        for m in C_HEADER.finditer(text):
            if m.group(1) in C_KEYWORDS:
                continue
            depth, j = 0, m.end() - 1
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            first = bisect.bisect_right(starts, m.start(1))
            spans.append((m.group(1), first, bisect.bisect_right(starts, j)))
        return spans
    stack = []  # (indent, qualified name, first line) of the open definitions
    for n, ln in enumerate(lines, 1):
        code = ln.blank()
        if not code.strip() or ln.open or ln.depth:
            continue
        indent = len(code) - len(code.lstrip())
        while stack and indent <= stack[-1][0]:
            spans.append(stack.pop()[1:] + (last_code_line(lines, n),))
        m = P_DEF.match(code)
        if not m:
            continue
        header, k = code, n  # a signature may go on over lines: while a bracket is open
        while k < len(lines) and (lines[k].depth or lines[k].open):
            header += " " + lines[k].blank()
            k += 1
        if not header.rstrip().endswith(":") or re.match(
            r"\s*cdef\s+(extern|struct|enum|union|packed)\b", header
        ):
            continue  # a declaration (cdef int f(int)), not a definition
        if m.group(2) == "class" or re.match(r"\s*cdef\s+class\b", header):
            name = re.search(r"class\s+(\w+)", header)
        elif m.group(2) in ("cdef", "cpdef"):
            name = re.search(r"(\w+)\s*\(", header)
        else:
            name = re.search(r"def\s+(\w+)", header)
        if name is None:
            continue
        qual = ".".join([s[1] for s in stack[-1:]] + [name.group(1)])
        stack.append((indent, qual, n))
    while stack:
        spans.append(stack.pop()[1:] + (last_code_line(lines, len(lines) + 1),))
    return spans


def last_code_line(lines, before):
    """The last line before `before` (1-based) that holds code."""
    n = before - 1
    while n > 1 and not lines[n - 1].blank().strip():
        n -= 1
    return n


def function_at(spans, n):
    """The innermost (name, first, last) span holding line n, or None."""
    inner = [s for s in spans if s[1] <= n <= s[2]]
    return max(inner, key=lambda s: s[1]) if inner else None


def _negate_c_condition(code):
    """`if (cond)` / `while (cond)` at the start of a C statement becomes `if (!(cond))`."""
    m = re.match(r"^(\s*(?:\}\s*else\s+)?(?:if|while)\s*)\(", code)
    if not m:
        return []
    depth = 0
    for j in range(m.end() - 1, len(code)):
        depth += {"(": 1, ")": -1}.get(code[j], 0)
        if depth == 0:
            return [(m.end(), j, "!(" + code[m.end() : j] + ")")]
    return []


def _drop_statement(code, c_like):
    if c_like:
        pat = r"^(\s+)(?:[\w.\[\]>*-]+ *(?:[-+|&]?=) [^=].*|[\w.>:-]+\(.*\)|break|continue);$"
        empty = ";"
    else:
        pat = (
            r"^(\s+)(?:return\b.*|raise\b.*|break|continue|[\w.\[\]]+\(.*\)"
            r"|[\w.\[\], ]+\s*(?:[-+*|&]?=)\s.*)$"
        )
        empty = "pass"
    m = re.match(pat, code)
    return [(m.end(1), len(code), empty)] if m else []


# (kind, languages: p Python and Cython, c C and C++, the pattern, its replacement). A pattern
# is matched against one line with its comments blanked; each match is a mutant, kept if it
# changes code, not only what lies in a string. A callable gives (start, end, replacement)s and
# is tried on a line that starts a statement of its own only.
RULES = (
    ("comparison", "pc", r"(?<= )==(?= )", "!="),
    ("comparison", "pc", r"(?<= )!=(?= )", "=="),
    ("comparison", "pc", r"(?<= )<(?= )", "<="),
    ("comparison", "pc", r"(?<= )<=(?= )", "<"),
    ("comparison", "pc", r"(?<= )>(?= )", ">="),
    ("comparison", "pc", r"(?<= )>=(?= )", ">"),
    ("comparison", "p", r"(?<= )is not(?= )", "is"),
    ("comparison", "p", r"(?<= )is(?= (?!not ))", "is not"),
    ("comparison", "p", r"(?<= )not in(?= )", "in"),
    ("comparison", "p", r"(?<= )in(?= )", "not in"),
    ("boolean", "p", r"\bTrue\b", "False"),
    ("boolean", "p", r"\bFalse\b", "True"),
    ("boolean", "c", r"\btrue\b", "false"),
    ("boolean", "c", r"\bfalse\b", "true"),
    ("boolean", "p", r"(?<= )and(?= )", "or"),
    ("boolean", "p", r"(?<= )or(?= )", "and"),
    ("boolean", "c", r"(?<= )&&(?= )", "||"),
    ("boolean", "c", r"(?<= )\|\|(?= )", "&&"),
    ("boolean", "p", r"(?<![\w.])not (?!in )", ""),
    ("boolean", "c", r"!(?!=)", ""),
    ("boolean", "p", r"^(\s*(?:el)?if|\s*while) (.*):$", r"\1 not (\2):"),
    ("boolean", "c", _negate_c_condition, None),
    ("off-by-one", "pc", r"(?<![\w.])(\d+)(?![\w.])", r"(\1 + 1)"),
    ("off-by-one", "pc", r"(?<![\w.])(\d+)(?![\w.])", r"(\1 - 1)"),
    ("dropped statement", "pc", _drop_statement, None),
    (
        "swapped arguments",
        "pc",
        r"(?<=\w\()([^(),=\[\]{}\"']+), ([^(),=\[\]{}\"']+)(?=[,)])",
        r"\2, \1",
    ),
)
RULES = tuple((k, langs, re.compile(p) if isinstance(p, str) else p, r) for k, langs, p, r in RULES)

# A Python or Cython statement starting so is left alone: imports, declarations, signatures.
P_SKIP = re.compile(
    r"^\s*(import|from|cimport|include|ctypedef|def|async\s+def|cdef|cpdef|class|global"
    r"|nonlocal|DEF|IF|ELIF|ELSE|@)\b|^\s*@"
)


def operator_mutants(rel, text):
    """The operator mutants of one file (rel: its path from the repository root)."""
    c_like = rel.endswith((".c", ".h"))
    lang = "c" if c_like else "p"
    lines = lex(text, c_like)
    spans = function_spans(lines, c_like)
    short = rel[len("src/") :] if rel.startswith("src/") else rel
    out, stmt_start, prev_code, preproc = [], 1, "", False
    for n, ln in enumerate(lines, 1):
        code = ln.blank()
        if not code.strip():
            continue
        own = ln.depth == 0 and not ln.open  # the first line of a statement
        span = function_at(spans, n)
        if c_like:
            preproc = code.lstrip().startswith("#") or (preproc and prev_code.endswith("\\"))
            own = own and (not prev_code or prev_code[-1] in ";{}:)" or prev_code.endswith("else"))
            # Inside a function's body only: not its signature, not file-level declarations.
            skip = preproc or span is None or ln.braces <= lines[span[1] - 1].braces
        else:
            if own and not prev_code.endswith("\\"):
                stmt_start = n
            skip = bool(P_SKIP.match(lines[stmt_start - 1].blank()))
        prev_code = code.rstrip()
        if skip:
            continue
        func = span[0] if span else None
        single = own and not (lines[n].depth if n < len(lines) else 0)
        seen = set()
        for kind, langs, pat, rep in RULES:
            if lang not in langs:
                continue
            if callable(pat):
                if not single:
                    continue
                edits = pat(code) if pat is _negate_c_condition else pat(code, c_like)
            else:
                edits = [(m.start(), m.end(), m.expand(rep)) for m in pat.finditer(code)]
            for a, b, new in edits:
                if kind == "off-by-one" and (
                    (not rel.endswith(".py") and code[a - 1 : a] == "[" and code[b : b + 1] == "]")
                    or re.search(r"except\s*[-+]?\s*$", code[:a])
                ):
                    continue  # p[0] is a dereference in Cython and C; `except -1` a declaration
                if new == "(0 + 1)" and code.strip() == "return 0" and _status_only(lines, span):
                    continue  # a status whose only other value is -1: 1 reads as 0 (equivalent)
                if kind == "swapped arguments" and not rel.endswith(".py"):
                    x, y = (_shape(v) for v in code[a:b].split(", ", 1))
                    if x != y:
                        continue  # a pointer for a value, a literal for a variable: no build
                if new == "not in" and re.search(r"(\bfor\s+[\w, ()]*|\bnot)$", code[:a].rstrip()):
                    continue  # `for x in`, `not in`
                if b > a and "c" not in ln.mask[a:b]:
                    continue  # inside a string only
                mutated = ln.text[:a] + new + ln.text[b:]
                if mutated == ln.text or mutated in seen:
                    continue
                seen.add(mutated)
                if rel.endswith(".py") and not _compiles(text, lines, n, mutated):
                    continue
                out.append(
                    {
                        "id": f"{short}:{n}:{kind.replace(' ', '-')}:{len(seen)}",
                        "origin": "operators",
                        "file": rel,
                        "function": func,
                        "line": n,
                        "kind": kind,
                        "find": ln.text.rstrip("\n"),
                        "replace": mutated.rstrip("\n"),
                        "why": f"{kind}: `{ln.text.strip()}` -> `{mutated.strip()}`",
                    }
                )
    return out


def _status_only(lines, span):
    """Whether the Cython function of `span` returns a status: `except -1`, its return value
    read for nothing but that -1 (the guard's convention)."""
    if span is None:
        return False
    header, k = "", span[1]
    while k <= len(lines) and not header.rstrip().endswith(":"):
        header += lines[k - 1].blank()
        k += 1
    return bool(re.search(r"\bint\b.*\bexcept\s+-1\b", header))


def _shape(arg):
    arg = arg.strip()
    return "address" if arg.startswith("&") else "literal" if re.fullmatch(r"-?\d\w*", arg) else ""


def _compiles(text, lines, n, mutated):
    src = "".join(ln.text for ln in lines[: n - 1]) + mutated + "".join(ln.text for ln in lines[n:])
    try:
        compile(src, "<mutant>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError):
        return False


# --- listed mutants (TOML) --------------------------------------------------------------------


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
                f"{path}: mutant {m.get('id', '?')}: unknown fields {sorted(unknown)}, "
                f"missing {sorted(missing)}"
            )
        if m["id"] in seen:
            raise SystemExit(f"{path}: mutant id {m['id']} appears twice")
        if m["find"] == m["replace"]:
            raise SystemExit(f"{path}: mutant {m['id']}: find and replace are the same")
        seen.add(m["id"])
        m["origin"] = os.path.relpath(path, REPO)
    return mutants


def locate(tree, m):
    """(start, end) of what mutant m replaces in its file under `tree`, or why it is stale."""
    path = os.path.join(tree, m["file"])
    if not os.path.isfile(path):
        return f"{m['file']} does not exist"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if "line" in m:  # an operator mutant: its line, as it was generated
        lines = text.splitlines(keepends=True)
        if len(lines) < m["line"] or lines[m["line"] - 1].rstrip("\n") != m["find"]:
            return f"line {m['line']} changed since the mutant was made"
        start = sum(len(ln) for ln in lines[: m["line"] - 1])
        return (start, start + len(m["find"]))
    lo, hi = 0, len(text)
    if m.get("function"):
        c_like = m["file"].endswith((".c", ".h"))
        lines = lex(text, c_like)
        want = m["function"]
        found = [
            s for s in function_spans(lines, c_like) if s[0] == want or s[0].endswith("." + want)
        ]
        if len(found) != 1:
            return f"function {want} " + ("not found" if not found else "found more than once")
        offsets = [0]
        for ln in lines:
            offsets.append(offsets[-1] + len(ln.text))
        lo, hi = offsets[found[0][1] - 1], offsets[found[0][2]]
    n = text.count(m["find"], lo, hi)
    if n != 1:
        where = f"in {m['function']}" if m.get("function") else "in the file"
        return f"snippet {'not found' if n == 0 else f'found {n} times'} {where} (must be once)"
    start = text.index(m["find"], lo, hi)
    return (start, start + len(m["find"]))


# --- choosing what runs -----------------------------------------------------------------------


def generated(patterns):
    files = set(tree_files())
    rels = sorted(
        {
            os.path.relpath(p, REPO)
            for pat in patterns
            for p in glob.glob(os.path.join(REPO, pat), recursive=True)
        }
        & files
    )
    rels = [r for r in rels if r.endswith((".py", ".pyx", ".pxi", ".c", ".h"))]
    out = []
    for rel in rels:
        with open(os.path.join(REPO, rel), encoding="utf-8") as f:
            out += operator_mutants(rel, f.read())
    return out


def select(mutants, files=None, functions=None, only=None, sample=None, seed=0):
    if files:
        mutants = [m for m in mutants if any(fnmatch.fnmatch(m["file"], p) for p in files)]
    if functions:

        def named(m):
            f = m.get("function") or ""
            return any(
                fnmatch.fnmatch(f, p) or fnmatch.fnmatch(f.rsplit(".", 1)[-1], p) for p in functions
            )

        mutants = [m for m in mutants if named(m)]
    if only:
        unknown = set(only) - {m["id"] for m in mutants}
        if unknown:
            raise SystemExit(f"no such mutant (after the other choices): {sorted(unknown)}")
        mutants = [m for m in mutants if m["id"] in only]
    if sample is not None and sample < len(mutants):
        mutants = random.Random(seed).sample(mutants, sample)
        mutants.sort(key=lambda m: (m["file"], m.get("line", 0), m["id"]))
    return mutants


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

    def __init__(self, scratch, log):
        self.scratch = scratch
        self.tree = os.path.join(scratch, "tree")
        self.site = os.path.join(scratch, "site")
        self.pristine = os.path.join(scratch, "pristine")
        self.log = log
        self.exts = {}  # "_guard" -> {"compile": argv, "link": argv, "out": built .so}
        self.clibs = {}  # "src/cyctx/_sim/simdriver.c" -> {"compile", "link", "out"}

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
        for src in C_LIBRARIES:
            if not os.path.isfile(os.path.join(self.tree, src)):
                continue
            comp = [c for c in cmds if "-c" in c and any(a.endswith(src) for a in c)]
            obj = comp[-1][comp[-1].index("-o") + 1] if comp else None
            link = [c for c in cmds if obj and obj in c and "-shared" in c]
            if not comp or not link:
                raise SystemExit(f"could not find the build commands of {src} in setup.py's output")
            self.clibs[src] = {
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
            with open(os.path.join(self.tree, f), encoding="utf-8") as fh:
                text = fh.read()
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
        """('ext', name) / ('c', source) targets that a change of `rel` must rebuild (a header
        beside a C library's source: every library of that folder)."""
        if rel in self.clibs:
            return [("c", rel)]
        if rel.endswith(".h") and any(
            os.path.dirname(c) == os.path.dirname(rel) for c in self.clibs
        ):
            return [("c", c) for c in self.clibs if os.path.dirname(c) == os.path.dirname(rel)]
        return [("ext", e) for e in sorted(self.exts) if rel in self._deps(e)]

    def dest(self, target):
        """Where a target's build goes in the package folder, from its cyctx/."""
        if target[0] == "c":
            rel = os.path.relpath(os.path.dirname(target[1]), PKG_REL)
            return os.path.join(rel, os.path.basename(self.clibs[target[1]]["out"]))
        return os.path.basename(self.exts[target[1]]["out"])

    def rebuild(self, target):
        """Rebuild one target in the scratch tree and put it into the package folder."""
        if target[0] == "c":
            lib = self.clibs[target[1]]
            steps, out = [lib["compile"], lib["link"]], lib["out"]
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
            steps, out = [[sys.executable, "-c", cy], e["compile"], e["link"]], e["out"]
        for argv in steps:
            rc, text, _ = run(argv, self.tree, log=self.log)
            if rc != 0:
                return text[-3000:]
        shutil.copyfile(
            os.path.join(self.tree, out), os.path.join(self.site, "cyctx", self.dest(target))
        )
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
    """Run `tests` (pytest arguments): (returncode or None on timeout, output, seconds)."""
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
    return run(cmd + list(tests), build.tree, env=env, timeout=timeout, log=build.log)


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


def try_mutant(build, m, env, timeout, runs):
    """Apply m, rebuild, run each of `runs` (lists of tests) until one fails; put it back."""
    rel = m["file"]
    path = os.path.join(build.tree, rel)
    with open(path, encoding="utf-8") as f:
        original = f.read()
    start, end = locate(build.tree, m)
    touched = []
    t0 = time.monotonic()
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original[:start] + m["replace"] + original[end:])
        inside = build.install_source(rel)
        if inside:
            touched.append(inside)
        for target in build.targets(rel):
            touched.append(os.path.join("cyctx", build.dest(target)))
            err = build.rebuild(target)
            if err is not None:
                return {"status": "build-error", "note": err[-800:]}
        build_s = time.monotonic() - t0
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


def report(results, out_json, elapsed):
    w = max(len(r["id"]) for r in results)
    print()
    print(f"{'mutant':<{w}}  {'status':<11}  {'secs':>5}  detail")
    for r in results:
        detail = outcome(r)
        if r["status"] == "survived":
            if r["origin"] == "operators":
                detail = r["why"]
            elif r.get("equivalent"):
                detail = f"EQUIVALENT: {r['equivalent']}"
            else:
                detail = "NOT EXPLAINED: " + r["why"]
        print(
            f"{r['id']:<{w}}  {r['status']:<11}  {r.get('secs', 0):>5.0f}  "
            f"{detail.splitlines()[0] if detail else ''}"
        )
    statuses = ("killed", "timeout", "survived", "build-error", "stale")
    count = {s: sum(r["status"] == s for r in results) for s in statuses}
    killed = count["killed"] + count["timeout"]
    valid = killed + count["survived"]
    score = killed / valid if valid else 0.0
    listed = [r for r in results if r["origin"] != "operators"]
    unexplained = [r["id"] for r in listed if r["status"] == "survived" and not r.get("equivalent")]
    wrongly_equivalent = [
        r["id"] for r in listed if r["status"] in ("killed", "timeout") and r.get("equivalent")
    ]
    broken = [r["id"] for r in listed if r["status"] in ("stale", "build-error")]
    print()
    print(" ".join(f"{k}={v}" for k, v in count.items()) + f"  ({elapsed / 60:.1f} min)")
    print(f"score: {killed}/{valid} killed = {100 * score:.1f}%")
    by_origin = {}
    for origin in sorted({r["origin"] for r in results}):
        rs = [r for r in results if r["origin"] == origin]
        k = sum(r["status"] in ("killed", "timeout") for r in rs)
        v = k + sum(r["status"] == "survived" for r in rs)
        by_origin[origin] = {"killed": k, "valid": v, "total": len(rs)}
        print(f"  {origin}: {k}/{v} killed ({len(rs) - v} not counted: build errors, stale)")
    survivors = [r for r in results if r["status"] == "survived"]
    if survivors:
        print("survivors:")
        for r in survivors:
            where = f"{r['file']}:{r['line']}" if "line" in r else r["file"]
            print(f"  {where} ({r.get('function') or 'file level'}): {r['why']}")
    if unexplained:
        print(
            f"listed survivors with no explanation (kill them with a test, or mark them "
            f"equivalent): {unexplained}"
        )
    if wrongly_equivalent:
        print(f"marked equivalent but killed (drop the mark): {wrongly_equivalent}")
    if broken:
        print(f"listed mutants that are stale or do not build (re-anchor or fix them): {broken}")
    data = {
        "score": score,
        "counts": count,
        "by_origin": by_origin,
        "unexplained_survivors": unexplained,
        "survivors": [r["id"] for r in survivors],
        "elapsed_s": round(elapsed),
        "mutants": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    with open(out_json, "w") as f:
        json.dump(data, f, indent=1)
    print(f"report: {out_json}")
    return 0 if not unexplained and not broken else 1


def runs_of(m, args):
    """The test runs mutant m faces, in order (the next only when the last passed)."""
    if args.suite:
        return [args.suite]
    own = m.get("tests") or covering_tests(m["file"]) or ["tests"]
    return [own, ["tests"]] if args.confirm and own != ["tests"] else [own]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--mutants",
        action="append",
        metavar="FILE",
        help="listed (find/replace) mutants from FILE; may be given more than once",
    )
    ap.add_argument("--operators", action="store_true", help="the operator mutants")
    ap.add_argument("--curated", action="store_true", help="the curated list (mutants.toml)")
    ap.add_argument(
        "--files",
        nargs="+",
        metavar="GLOB",
        help="only mutants of these files (paths from the repository root; operator mutants "
        "are generated over them, in place of the default targets)",
    )
    ap.add_argument(
        "--functions", nargs="+", metavar="NAME", help="only mutants inside these functions"
    )
    ap.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    ap.add_argument("--sample", type=int, metavar="N", help="N of the chosen mutants, at random")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    ap.add_argument(
        "--list", action="store_true", help="list the mutants and their anchors; build nothing"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds one test run may take (default: 4x the unmutated run, at least 120)",
    )
    ap.add_argument(
        "--suite",
        nargs="+",
        metavar="TEST",
        help="the tests every mutant faces, instead of those that cover its file",
    )
    ap.add_argument(
        "--confirm",
        action="store_true",
        help="a mutant that survives the tests of its file faces the whole suite too",
    )
    ap.add_argument("--driver", default="sim", choices=("sim", "real", "auto"))
    ap.add_argument("--json", default=os.path.join(REPO, "build", "mutation", "report.json"))
    ap.add_argument(
        "--keep", action="store_true", help="keep the scratch folder (its path is printed)"
    )
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    if not (args.mutants or args.operators or args.curated):
        args.operators = args.curated = True  # the default: both of the project's sets
    mutants = []
    for path in (args.mutants or []) + ([CURATED] if args.curated else []):
        mutants += load_mutants(path)
    if args.operators:
        ops = generated(args.files or TARGETS)
        print(f"{len(ops)} operator mutants generated in {time.monotonic() - t0:.0f} s", flush=True)
        mutants = ops + mutants
    clash = [i for i, n in Counter(m["id"] for m in mutants).items() if n > 1]
    if clash:
        raise SystemExit(f"mutant ids given more than once: {clash}")
    mutants = select(mutants, args.files, args.functions, args.only, args.sample, args.seed)

    if args.list:
        bad = 0
        for m in mutants:
            where = locate(REPO, m)
            bad += isinstance(where, str)
            note = "STALE: " + where if isinstance(where, str) else m["why"]
            print(f"{m['id']:<48} {m.get('function') or '-':<28} {note}")
        kinds = Counter(m.get("kind", m["origin"]) for m in mutants)
        print(
            f"{len(mutants)} mutants ({', '.join(f'{v} {k}' for k, v in kinds.items())}), "
            f"{bad} stale"
        )
        return 1 if bad else 0
    if not mutants:
        raise SystemExit("no mutant chosen")

    # SIGTERM as well as Ctrl-C unwinds through the finally below, which removes the scratch.
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    scratch = tempfile.mkdtemp(prefix="cyctx-mutate-")
    results = []
    try:
        with open(os.path.join(scratch, "build.log"), "w") as log:
            build = Build(scratch, log)
            build.setup()
            env = test_env(build, args.driver)
            # The recorded commands rebuild every target once, unmutated, and the tests must
            # pass on that build: the replay is checked before any mutant relies on it.
            for target in [("ext", e) for e in sorted(build.exts)] + [
                ("c", c) for c in build.clibs
            ]:
                err = build.rebuild(target)
                if err:
                    raise SystemExit(f"replaying the build of {target} failed:\n{err}")
            every = list(dict.fromkeys(t for m in mutants for run in runs_of(m, args) for t in run))
            every = ["tests"] if "tests" in every else every
            rc, out, secs = pytest(build, env, every, None)
            if rc != 0:
                raise SystemExit(
                    f"the unmutated tests fail ({first_failure(out, rc, last_started(env))}): "
                    f"fix that first\n{out[-3000:]}"
                )
            timeout = args.timeout or max(120.0, 4 * secs)
            print(
                f"unmutated tests ({len(every)} paths): passed in {secs:.0f} s; limit per run "
                f"{timeout:.0f} s",
                flush=True,
            )
            for i, m in enumerate(mutants, 1):
                why = locate(build.tree, m)
                if isinstance(why, str):
                    r = {"status": "stale", "note": why}
                else:
                    t1 = time.monotonic()
                    r = try_mutant(build, m, env, timeout, runs_of(m, args))
                    r["secs"] = round(time.monotonic() - t1, 1)
                keep = ("id", "origin", "file", "function", "line", "kind", "why", "equivalent")
                r = {**{k: m[k] for k in keep if k in m}, **r}
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
    return report(results, args.json, time.monotonic() - t0) if results else 1


if __name__ == "__main__":
    sys.exit(main())
