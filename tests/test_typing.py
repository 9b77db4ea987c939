"""The typing stubs (cyctx/__init__.pyi) against the module: the same public names, the same
public members of ContextGuard and Diagnosis; and, where mypy is installed (CI's docs step
installs it), that a type checker rejects what the run time rejects (ContextGuard("0"))."""

import ast
import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

import cyctx

STUB = os.path.join(os.path.dirname(cyctx.__file__), "__init__.pyi")


def _stub():
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read())


def _public(names):
    return {n for n in names if not n.startswith("_") or n in ("__version__",)}


def test_stub_declares_every_public_name():
    tree = _stub()
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
    missing = set(cyctx.__all__) - declared
    assert not missing, f"in cyctx.__all__ but not in __init__.pyi: {sorted(missing)}"
    extra = {n for n in _public(declared) if n != "DeviceLike"} - set(cyctx.__all__)
    assert not extra, f"in __init__.pyi but not exported by cyctx: {sorted(extra)}"


@pytest.mark.parametrize("cls", ["ContextGuard", "Diagnosis"])
def test_stub_members_match_the_class(cls):
    node = next(n for n in _stub().body if isinstance(n, ast.ClassDef) and n.name == cls)
    stub_members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    stub_members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
    runtime = getattr(cyctx, cls)
    public = {n for n in dir(runtime) if not n.startswith("_")}
    if dataclasses.is_dataclass(runtime):
        public |= {f.name for f in dataclasses.fields(runtime)}
    assert public - stub_members == set(), f"{cls}: public at run time, missing in the stub"
    assert _public(stub_members) - public == set(), f"{cls}: in the stub, missing at run time"
    for dunder in ("__enter__", "__exit__", "__init__"):
        if dunder in stub_members:
            assert hasattr(runtime, dunder)


def test_a_type_checker_rejects_what_the_run_time_rejects(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed here (CI's docs step runs this)")
    src = tmp_path / "use.py"
    src.write_text(textwrap.dedent("""
        import cyctx
        cyctx.ContextGuard(0)
        cyctx.ContextGuard.shared(1)
        cyctx.ContextGuard.from_handle(0x1234)
        cyctx.ContextGuard("0")          # line 6
        cyctx.ContextGuard(1.5)          # line 7
        cyctx.ContextGuard.shared("0")   # line 8
    """))
    out = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
                          "--no-error-summary", "--cache-dir", str(tmp_path / "cache"), str(src)],
                         capture_output=True, text=True, timeout=300)
    lines = sorted({int(l.split(":")[1]) for l in out.stdout.splitlines() if ": error:" in l})
    assert lines == [6, 7, 8], out.stdout
