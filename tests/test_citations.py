"""Every file the documents cite exists: the Markdown links and images of the repository's
Markdown files, and the repository paths they write as code (`tests/sim/differential/...`,
`scripts/gpu/run.sh`, `src/cyctx/_cpp/driver.h`; a pytest id's file part; a glob matches one
file at least). Fenced code blocks are commands and output, not citations: left out.

Runs in a checkout: an sdist leaves out bench/results/ and scripts/, which the documents cite.
"""

from __future__ import annotations

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "src", "cyctx")

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(ROOT, ".git")),
    reason="not a git checkout (an sdist holds neither bench/results/ nor scripts/)",
)

# First components of the repository paths a document may write as code. A path under
# src/cyctx may also be written from there (`_cpp/driver.h`, `_doctor/model.py`).
_TOP = ("src/", "tests/", "docs/", "bench/", "scripts/", "examples/", ".ci/", "results/")
_IN_PKG = ("_cpp/", "_doctor/", "_sim/", "include/")
_ROOT_FILES = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "CHANGELOG.md")

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE = re.compile(r"`([^`\n]+)`")


def documents() -> list[str]:
    """The repository's Markdown files (docs/lab/ and build outputs left out)."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        dirs[:] = sorted(
            x
            for x in dirs
            if not x.startswith(".")
            and x not in ("build", "wheelhouse", "_build", "node_modules", "__pycache__")
            and not x.endswith(".egg-info")
        )
        out += [os.path.normpath(os.path.join(rel, f)) for f in sorted(files) if f.endswith(".md")]
    return out


def _exists(path: str, base: str) -> bool:
    path = path.split("#", 1)[0].split("::", 1)[0]
    path = re.sub(r":\d+$", "", path).rstrip(".,;:)")
    if not path:
        return True
    for root in (ROOT, base) + ((PKG,) if path.startswith(_IN_PKG) else ()):
        cand = os.path.join(root, path)
        if glob.has_magic(cand) and glob.glob(cand) or os.path.exists(cand):
            return True
    return False


def cited(text: str, base: str) -> list[str]:
    """The paths `text` (a Markdown file in directory `base`) cites that do not exist."""
    text = _FENCE.sub("", text)
    missing = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            continue  # an external link, an anchor of the same page, a site path
        if not _exists(target, base):
            missing.append(target)
    for span in _CODE.findall(text):
        for word in span.split():
            word = word.strip("'\"()[],;")
            if word.startswith(_TOP + _IN_PKG) or word in _ROOT_FILES:
                if "<" in word or "{" in word or "$" in word:
                    continue  # a placeholder (`<wheel>`, `{project}`, `$OUT/...`)
                if re.search(r"\.so(\.\d+)?$|_build_info\.py$", word):
                    continue  # a build output
                if not _exists(word, base):
                    missing.append(word)
    return missing


def test_every_file_the_documents_cite_exists():
    docs = documents()
    assert "docs/evidence.md" in docs and "bench/README.md" in docs
    broken = {}
    for doc in docs:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            missing = cited(f.read(), os.path.join(ROOT, os.path.dirname(doc)))
        if missing:
            broken[doc] = missing
    assert not broken, f"cited files that do not exist: {broken}"


def test_a_missing_citation_is_caught():
    base = os.path.join(ROOT, "docs")
    text = (
        "See [the evidence](evidence.md#costs), `tests/sim/differential/real_h200.json`,\n"
        "`tests/test_layout.py::test_no_import_circles`, `_cpp/driver.h` and `scripts/gpu/*.sh`.\n"
        "```\npython results/gone.py\n```\n"
    )
    assert cited(text, base) == []
    gone = (
        "[old](old-page.md) ![plot](img/none.png) `results/2026-12-01/run.log` "
        "`bench/results/none.txt` and `_cpp/tls.h`"
    )
    assert cited(gone, base) == [
        "old-page.md",
        "img/none.png",
        "results/2026-12-01/run.log",
        "bench/results/none.txt",
        "_cpp/tls.h",
    ]
