"""The mutation tool (scripts/quality/mutate.py): the operator mutants it makes from sources
(each kind, never in a comment, a string, a signature or a declaration), its sample and its
anchoring of listed mutants to functions; and a run for real on a small suite: a mutant of a
header that only the compiler's include path reaches (cyctx/switch.h, under include/) is rebuilt
into the extension and killed, as is one of the simulated CUPTI (a C library of its own), an
operator mutant is killed by the tests of its file's area, and a mutant that hangs is reported
with the test that hung."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import drivers

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOOL = os.path.join(REPO, "scripts", "quality", "mutate.py")
pytestmark = pytest.mark.tooling

if not os.path.isfile(TOOL):
    pytest.skip(
        "no scripts/quality/mutate.py here: a checkout's tool, not in the sdist",
        allow_module_level=True,
    )
_spec = importlib.util.spec_from_file_location("cyctx_mutate", TOOL)
mutate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutate)


def changes(rel, text):
    """{(line, new line)} of the operator mutants of `text`."""
    return {(m["line"], m["replace"]) for m in mutate.operator_mutants(rel, text)}


PY = '''\
def pick(a, b, items):
    """True when a == b is True."""
    # a comment: a == b and not items
    if a == b and not items:
        return min(a, b)
    total = len(items) + 1
    helper(a, b)
    return "a == b"
'''


def test_each_operator_kind_is_made_from_python_code_and_none_from_its_text():
    got = changes("src/cyctx/m.py", PY)
    want = {
        (4, "    if a != b and not items:"),  # comparison
        (4, "    if a == b or not items:"),  # boolean
        (4, "    if a == b and items:"),
        (4, "    if not (a == b and not items):"),
        (5, "        return min(b, a)"),  # swapped arguments
        (5, "        pass"),  # dropped statement
        (6, "    total = len(items) + (1 + 1)"),  # off-by-one
        (6, "    total = len(items) + (1 - 1)"),
        (6, "    pass"),
        (7, "    helper(b, a)"),
        (7, "    pass"),
        (8, "    pass"),
    }
    assert want <= got, sorted(want - got)
    # The signature, the docstring and the comment give none; the string of line 8 only its drop.
    assert {line for line, _ in got} == {4, 5, 6, 7, 8}
    assert [new for line, new in got if line == 8] == ["    pass"]
    assert {m["function"] for m in mutate.operator_mutants("src/cyctx/m.py", PY)} == {"pick"}


PYX = """\
cdef int step(Switch* s, int n) except -1 nogil:
    cdef int k = 0
    if s.prev == NULL:
        s.ids[0] = n
        return 0
    return _go(&s.prev, n)
"""


def test_cython_signatures_declarations_and_dereferences_are_left_alone():
    got = changes("src/cyctx/_native/m.pxi", PYX)
    assert (3, "    if s.prev != NULL:") in got
    assert (4, "        pass") in got
    # A status of an `except -1` function: 0 becomes -1 (an error with no exception), never 1,
    # which reads as 0.
    assert (5, "        return (0 - 1)") in got and (5, "        return (0 + 1)") not in got
    assert {line for line, _ in got} == {3, 4, 5, 6}, sorted(got)
    assert not any("[(0" in new for _, new in got)  # p[0] is a dereference, not an index
    assert (6, "    return _go(n, &s.prev)") not in got  # an address for an int: no build


C = """\
static int step(int a, int b) {
    if (a < b) return a;  // a < b, !a
    x->y = f(a, b);
    return 0;
}
"""


def test_c_conditions_are_negated_statements_dropped_and_comments_kept():
    got = changes("src/cyctx/_cpp/m.h", C)
    want = {
        (2, "    if (!(a < b)) return a;  // a < b, !a"),
        (2, "    if (a <= b) return a;  // a < b, !a"),
        (3, "    x->y = f(b, a);"),
        (3, "    ;"),
        (4, "    return (0 + 1);"),
    }
    assert want <= got, sorted(want - got)
    assert {line for line, _ in got} == {2, 3, 4}
    assert all(new.endswith("// a < b, !a") for line, new in got if line == 2)
    assert {m["function"] for m in mutate.operator_mutants("src/cyctx/_cpp/m.h", C)} == {"step"}


def test_every_python_operator_mutant_of_the_package_compiles():
    # Python mutants are checked as they are made: one that does not compile would be
    # "killed" by the SyntaxError of its import.
    mutants = mutate.generated(["src/cyctx/_bind.py", "src/cyctx/_inputs.py"])
    assert len(mutants) > 100
    for m in mutants:
        with open(os.path.join(REPO, m["file"])) as f:
            text = f.read().splitlines(keepends=True)
        text[m["line"] - 1] = m["replace"] + "\n"
        compile("".join(text), m["id"], "exec")


def test_a_sample_is_the_same_for_a_seed_and_another_for_another_seed():
    mutants = mutate.generated(["src/cyctx/_inputs.py"])
    one = [m["id"] for m in mutate.select(mutants, sample=10, seed=1)]
    assert one == [m["id"] for m in mutate.select(mutants, sample=10, seed=1)]
    assert len(one) == 10 and one != [m["id"] for m in mutate.select(mutants, sample=10, seed=2)]
    lines = [m["line"] for m in mutate.select(mutants, sample=10, seed=1)]
    assert lines == sorted(lines)


def test_mutants_are_chosen_by_file_and_by_function():
    mutants = mutate.generated(["src/cyctx/_bind.py", "src/cyctx/_inputs.py"])
    chosen = mutate.select(mutants, files=["src/cyctx/_bind.py"], functions=["__call__"])
    assert chosen and {m["function"] for m in chosen} == {"Bound.__call__"}
    assert {m["file"] for m in chosen} == {"src/cyctx/_bind.py"}


TWICE = """\
def first(x):
    return x + 1


def second(x):
    return x + 1
"""


def test_a_listed_mutant_anchored_to_a_function_needs_its_snippet_unique_there_only(tmp_path):
    (tmp_path / "m.py").write_text(TWICE)
    m = {"file": "m.py", "find": "x + 1", "replace": "x - 1"}
    assert mutate.locate(str(tmp_path), m) == "snippet found 2 times in the file (must be once)"
    start = TWICE.index("x + 1", TWICE.index("def second"))
    assert mutate.locate(str(tmp_path), {**m, "function": "second"}) == (start, start + 5)
    assert mutate.locate(str(tmp_path), {**m, "function": "third"}) == "function third not found"


def test_the_curated_list_is_anchored_in_the_tree():
    proc = subprocess.run(
        [sys.executable, TOOL, "--list", "--curated"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0 and " 0 stale" in proc.stdout, proc.stdout[-3000:]


# Killed only when the extension is rebuilt with the mutated header: an id that the driver
# did not know at the enter (CYCTX_PREV_UNKNOWN) becomes the one of a context dead at the enter
# (0), which the exit makes current again.
UNKNOWN_TEST = (
    "tests/guard/test_restore_rules.py::"
    "test_prev_recorded_as_dead_versus_unknown[unknown-at-the-enter-is-not]"
)
# Killed only when the simulated CUPTI, a C library of its own beside the simulated driver, is
# rebuilt with the mutant.
CUPTI_TEST = "tests/trace/test_trace_sim_cupti.py::test_bad_enable_is_refused"
# Formats an ordinal for its message (int_text): the hang mutant loops there for ever.
BOUND_TEST = (
    "tests/guard/test_recognition_bounds.py::"
    "test_the_last_ordinal_is_accepted_and_the_next_refused_with_the_bounds_stated"
)

MUTANTS = f'''
[[mutant]]
id = "header-prev-unknown-is-dead"
file = "src/cyctx/include/cyctx/switch.h"
find = "#define CYCTX_PREV_UNKNOWN (~0ULL)"
replace = "#define CYCTX_PREV_UNKNOWN (0ULL)"
why = "a handle the driver did not know at the enter is taken for a dead one, and restored"
tests = ["{UNKNOWN_TEST}"]

[[mutant]]
id = "simcupti-domain-zero-valid"
file = "src/cyctx/_sim/simcupti.c"
function = "valid"
find = "domain > 0"
replace = "domain >= 0"
why = "the simulated CUPTI accepts callbacks of domain 0, which names none"
tests = ["{CUPTI_TEST}"]

[[mutant]]
id = "python-hang"
file = "src/cyctx/_inputs.py"
function = "int_text"
find = """    if n.bit_length() <= 256:
        return str(n)"""
replace = """    while n.bit_length() <= 256:
        pass"""
why = "formatting an ordinal for a message never ends"
tests = ["{BOUND_TEST}"]
'''


@pytest.mark.slow
def test_a_header_mutant_is_rebuilt_and_killed_and_a_hang_names_its_test(tmp_path):
    if os.environ.get("CYCTX_MUTATION_RUN"):
        pytest.skip("inside a mutation run: the tool itself is not what a mutant changes")
    if drivers.SIM is None:
        pytest.skip("the tool runs its suites on the simulated driver")
    toml = tmp_path / "mutants.toml"
    toml.write_text(MUTANTS)
    # An operator mutant of bind: the call no longer calls the function. No test is named for
    # it: the tests that cover _bind.py are its area's (COVERS).
    (op,) = [
        m
        for m in mutate.generated(["src/cyctx/_bind.py"])
        if m["kind"] == "dropped statement" and "return self._fn(*args, **kwargs)" in m["find"]
    ]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, TOOL, "--mutants", str(toml), "--operators", "--json", str(report)]
        + ["--files", "src/cyctx/_bind.py", "src/cyctx/_inputs.py", "src/cyctx/include/*"]
        + ["src/cyctx/_sim/simcupti.c"]
        + ["--only", "header-prev-unknown-is-dead", "simcupti-domain-zero-valid", "python-hang"]
        + [op["id"]]
        + ["--timeout", "40"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert report.exists(), out[-4000:]
    data = json.loads(report.read_text())
    got = {r["id"]: r for r in data["mutants"]}
    header = got["header-prev-unknown-is-dead"]
    assert header["status"] == "killed" and header["by"] == UNKNOWN_TEST, (header, out[-3000:])
    hang = got["python-hang"]
    assert hang["status"] == "timeout" and hang["by"] == BOUND_TEST, (hang, out[-3000:])
    assert hang["note"].startswith(f"hung in {BOUND_TEST}: no result after 40 s"), hang
    assert f"python-hang: timeout hung in {BOUND_TEST}" in proc.stdout, proc.stdout[-3000:]
    cupti = got["simcupti-domain-zero-valid"]
    assert cupti["status"] == "killed" and cupti["by"].startswith(CUPTI_TEST), cupti
    bound = got[op["id"]]
    assert bound["status"] == "killed", (bound, out[-3000:])
    assert bound["by"].startswith(("tests/guard/test_bind.py", "tests/test_pools.py")), bound
    assert data["counts"]["killed"] == 3 and data["counts"]["timeout"] == 1, data["counts"]
    assert data["score"] == 1.0 and proc.returncode == 0, out[-3000:]
