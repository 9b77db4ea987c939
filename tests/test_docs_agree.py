"""Statements in the docs and examples that name something in the code are read from the text
and checked against the code, so a rename or a schema bump cannot leave a page saying the old one."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
EXAMPLES = os.path.join(ROOT, "examples")
pytestmark = pytest.mark.skipif(not os.path.isdir(DOCS), reason="needs the source tree's docs/")


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _schema_constant():
    # Read from the source rather than imported: this checks the text of the tree under test.
    tree = ast.parse(_read("src", "cyctx", "_doctor", "report.py"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "SCHEMA" for t in node.targets
        ):
            return node.value.value
    raise AssertionError("report.py defines no SCHEMA")


def test_versioning_page_names_the_doctors_current_schema():
    schema = _schema_constant()
    found = re.findall(
        r"doctor's JSON \(schema `(cyctx\.diagnosis/\d+)`\)", _read("docs", "versioning.md")
    )
    assert found == [schema]


def test_doctor_page_and_cli_help_name_the_current_schema():
    schema = _schema_constant()
    stated = re.findall(
        r"under the schema name `(cyctx\.diagnosis/\d+)`", _read("docs", "doctor.md")
    )
    stated += re.findall(r"schema `(cyctx\.diagnosis/\d+)` \(", _read("docs", "doctor.md"))
    stated += re.findall(r"\(schema (cyctx\.diagnosis/\d+)\)", _read("src", "cyctx", "__main__.py"))
    assert stated and set(stated) == {schema}


@pytest.mark.parametrize("example", sorted(os.listdir(EXAMPLES)) if os.path.isdir(EXAMPLES) else [])
def test_example_readme_names_the_include_function_its_setup_py_calls(example):
    readme_path = os.path.join(EXAMPLES, example, "README.md")
    setup_path = os.path.join(EXAMPLES, example, "setup.py")
    if not (os.path.isfile(readme_path) and os.path.isfile(setup_path)):
        pytest.skip(f"{example} has no README.md and setup.py pair")
    named = set(
        re.findall(r"include_dirs=\[?[^`]*?cyctx\.(get_include\w*)\(\)", _read(readme_path))
    )
    called = set(
        re.findall(r"include_dirs=\[?[^\n]*?cyctx\.(get_include\w*)\(\)", _read(setup_path))
    )
    assert named <= called, f"README names {sorted(named)}, setup.py calls {sorted(called)}"


SIM_LINE = (
    "cyctx.testing.use_simulated_driver(2)  # no GPU? run on cyctx's simulated driver, 2 devices"
)


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", [("README.md",), ("docs", "python-guards.md")])
def test_page_shows_the_line_that_runs_its_snippets_on_the_simulator(page):
    assert any(SIM_LINE in b.splitlines() for b in _python_blocks(_read(*page)))


def test_readme_use_section_runs_as_shown_after_the_simulator_line():
    import subprocess
    import sys

    use = _read("README.md").split("## Use", 1)[1].split("\n## ", 1)[0]
    blocks = _python_blocks(use)
    assert blocks and SIM_LINE in blocks[0]
    code = (
        "".join(blocks)
        + "\nwith cyctx.device(0):\n    assert cyctx.current_device() == 0\nlaunch()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_readme_links_its_docs_pages_and_each_exists():
    links = re.findall(r"\]\((docs/[\w-]+\.md)\)", _read("README.md"))
    assert len(set(links)) >= 5
    assert all(os.path.isfile(os.path.join(ROOT, p)) for p in links)


def _exit_table():
    section = _read("docs", "doctor.md").split("## Exit status", 1)[1].split("\n## ", 1)[0]
    return {int(m[0]): m[1] for m in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.M)}


def test_doctor_exit_table_lists_exactly_the_codes_the_doctor_defines():
    from cyctx import _doctor

    codes = {_doctor.EXIT_OK, _doctor.EXIT_PROBLEM, _doctor.EXIT_USAGE, _doctor.EXIT_NO_CUDA}
    assert set(_exit_table()) == codes


@pytest.mark.parametrize(
    ("args", "row_says"),
    [
        (["doctor", "--simulate"], "nothing wrong"),
        (["doctor", "--no-such-option"], "bad command line"),
        pytest.param(
            ["doctor"],
            "no usable NVIDIA driver",
            marks=pytest.mark.skipif(
                "__import__('cyctx.testing').testing.real_driver_available()",
                reason="this machine has an NVIDIA driver",
            ),
        ),
    ],
)
def test_doctor_exits_with_the_status_its_docs_give(args, row_says):
    import subprocess
    import sys

    table = _exit_table()
    r = subprocess.run(
        [sys.executable, "-m", "cyctx", *args], capture_output=True, text=True, timeout=60
    )
    assert row_says in table[r.returncode], (r.returncode, r.stdout[-500:], r.stderr[-500:])


def _raises(doc):
    """{exception name: what the docstring says of it} of a numpydoc "Raises" section."""
    section = doc.split("Raises\n", 1)[1].split("\n\n", 1)[0]
    names = {}
    lines = section.splitlines()[1:]  # under the ------ line
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    for line in lines:
        if line.strip() and len(line) - len(line.lstrip()) == indent:
            key = line.strip()
            names[key] = ""
        elif line.strip():
            names[key] += line.strip() + " "
    return names


def _in_a_forked_child():
    from helpers.forking import run_forked

    def child():
        import cyctx

        try:
            cyctx.ContextGuard(0)
        except Exception as exc:  # noqa: BLE001 - its type is what is checked
            return type(exc).__name__
        return None

    return run_forked(child)


def _raised(make):
    import cyctx

    try:
        cyctx.ContextGuard(make).close()
    except Exception as exc:  # noqa: BLE001 - its type is what is checked
        return type(exc).__name__
    return None


# What the API page says ContextGuard(...) raises (its Raises section, which autodoc shows) is
# what it raises: each case's exception is listed by its own name.
@pytest.mark.parametrize(
    ("case", "raised"),
    [
        ("not an int", lambda: _raised("0")),
        ("negative", lambda: _raised(-1)),
        ("no such device", lambda: _raised(99)),
        ("a forked child", _in_a_forked_child),
    ],
)
def test_api_page_names_the_exception_contextguard_raises(case, raised):
    import cyctx

    listed = _raises(cyctx.ContextGuard.__doc__)
    name = raised()
    assert name is not None, f"ContextGuard raised nothing for {case}"
    assert name in listed, f"for {case} ContextGuard raises {name}; its docs list {sorted(listed)}"
    if case == "a forked child":
        others = [n for n, says in listed.items() if n != name and "fork" in says.lower()]
        assert not others, f"the docs also give {others} for a forked child"


def _findings_table():
    """docs/doctor.md's table of findings: {code: severity}; a row may name several codes."""
    section = _read("docs", "doctor.md").split("## Findings", 1)[1].split("\n## ", 1)[0]
    table = {}
    for codes, severity in re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| (\w+) \|", section, re.M):
        for code in re.findall(r"`(\w+)`", codes):
            assert code not in table, f"{code} has two rows"
            table[code] = severity
    return table


def test_doctor_findings_table_lists_exactly_the_rules_codes_and_severities():
    from cyctx._doctor import bindings, rules

    declared = {}
    for rule in rules.RULES:
        # One code, one severity: a code's rules may be several (driver_error has two).
        assert declared.setdefault(rule.code, rule.severity) == rule.severity, rule
    # The report of unusable cuda-bindings makes its one finding without the rules (their
    # words need cuda.bindings).
    declared[bindings.CODE] = bindings.SEVERITY
    documented = _findings_table()
    assert len(documented) > 15, "the table was not read?"
    assert sorted(set(declared) - set(documented)) == [], "codes the page does not list"
    assert sorted(set(documented) - set(declared)) == [], "codes the page lists that no rule makes"
    assert documented == declared
