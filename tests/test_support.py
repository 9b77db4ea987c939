"""The supported versions, stated once (docs/support.md, "Platforms and versions"), agree with
the package: its metadata (requires-python, the classifiers, the extras, the cuda-bindings
requirement), the range cyctx checks at import (cyctx._compat) and the driver functions it
requires (src/cyctx/_cpp/driver.h); and no other page says otherwise about Python."""

from __future__ import annotations

import os
import re
import tomllib

import pytest

from cyctx import _compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _project() -> dict:
    return tomllib.loads(_read("pyproject.toml"))["project"]


def support_rows(text: str | None = None) -> dict[str, str]:
    """{first cell: second cell} of the table under "## Platforms and versions"."""
    text = _read("docs", "support.md") if text is None else text
    m = re.search(r"^## Platforms and versions\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, 'docs/support.md has no "## Platforms and versions" section'
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", m.group(1), re.M)
    return {k: v for k, v in rows if k.strip("-") and k != " "}


def _minor(v: str) -> int:
    return int(v.split(".")[1])


def pythons(cell: str) -> list[int]:
    return sorted({_minor(v) for v in re.findall(r"\b3\.\d+\b", cell)})


def test_pythons_are_the_packages():
    project = _project()
    classified = sorted(
        _minor(c.rsplit(":: ", 1)[1])
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    m = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert m, project["requires-python"]
    assert classified == list(range(int(m.group(1)), classified[-1] + 1)), classified
    assert pythons(support_rows()["Python"]) == classified


def test_cuda_majors_are_the_packages():
    project = _project()
    cell = support_rows()["CUDA"]
    majors = sorted(int(x) for x in re.findall(r"\b(1\d)\b", cell.split(":")[0]))
    classified = sorted(
        int(c.rsplit(":: ", 1)[1])
        for c in project["classifiers"]
        if c.startswith("Environment :: GPU :: NVIDIA CUDA :: ")
    )
    extras = sorted(
        int(k[2:]) for k in project["optional-dependencies"] if re.fullmatch(r"cu\d+", k)
    )
    assert majors == classified == extras == sorted(_compat.SUPPORTED_MAJORS)
    (dep,) = [d for d in project["dependencies"] if d.startswith("cuda-bindings")]
    assert dep.removeprefix("cuda-bindings") == _compat.supported_range()
    assert f"`{_compat.supported_range()}`" in cell, cell
    for k in extras:
        assert f"`cu{k}`" in cell


def test_driver_is_the_oldest_that_has_every_function_cyctx_requires():
    # The table of _cpp/driver.h: {"name", version of the ABI resolved, required}.
    entries = re.findall(
        r'\{"(cu\w+)", (\d+), (true|false)\}', _read("src", "cyctx", "_cpp", "driver.h")
    )
    assert len(entries) > 5, entries
    oldest = max(int(v) for _, v, required in entries if required == "true")
    cell = support_rows()["NVIDIA driver"]
    assert f"CUDA {oldest // 1000}.{oldest % 1000 // 10} or newer" in cell, (oldest, cell)


_CLAIM = re.compile(r"CPython (3\.\d+)(?:(?: to |-|–)(3\.\d+)| or newer|\+)")


def python_claims(text: str) -> list[tuple[int, int | None]]:
    """Each "CPython 3.N to 3.M" / "3.N or newer" / "3.N+" in `text`: (N, M or None)."""
    return [(_minor(a), _minor(b) if b else None) for a, b in _CLAIM.findall(text)]


def _pages() -> list[str]:
    docs = [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))]
    return ["README.md", "CHANGELOG.md"] + [p for p in docs if p.endswith(".md")]


@pytest.mark.parametrize("page", _pages())
def test_no_page_states_other_pythons(page):
    supported = pythons(support_rows()["Python"])
    for low, high in python_claims(_read(page)):
        assert low == supported[0], f"{page}: CPython 3.{low} as the lowest"
        assert high in (None, supported[-1]), f"{page}: CPython 3.{high} as the highest"


def test_a_contradiction_is_caught():
    assert python_claims("Linux, CPython 3.10 or newer; CPython 3.11 to 3.13; CPython 3.11+") == [
        (10, None),
        (11, 13),
        (11, None),
    ]
    text = _read("docs", "support.md").replace("3.14 and 3.15", "3.14", 1)
    assert pythons(support_rows(text)["Python"]) == [11, 12, 13, 14]
