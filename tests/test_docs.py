"""The documentation's own checks: the internal link checker finds what is broken (CI runs it on
the built site), the README's links resolve and its examples run as shown, and, where Sphinx is
installed (CI's documentation step), the site builds with warnings as errors and its examples
pass doctest on the simulated driver."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
pytestmark = pytest.mark.skipif(not os.path.isdir(DOCS), reason="needs the source tree's docs/")


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_links_resolve():
    links = [
        t.split("#", 1)[0]
        for t in re.findall(r"\]\(([^)\s]+)\)", _readme())
        if not re.match(r"^[a-z][a-z0-9+.-]*:|#", t)
    ]
    assert len(links) >= 5, links
    missing = [t for t in links if not os.path.exists(os.path.join(ROOT, t))]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_use_section_runs_as_shown():
    # Its Python blocks, in order, in a fresh interpreter: the first selects the simulated driver.
    use = _readme().split("\n## Use", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", use, re.S)
    assert blocks and "use_simulated_driver" in blocks[0], "no simulator line first"
    code = "".join(blocks) + "\nwith cyctx.device(0):\n    assert cyctx.current_device() == 0\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _check_links(site):
    return subprocess.run(
        [sys.executable, os.path.join(DOCS, "check_links.py"), str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_link_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "index.html").write_text(
        '<a href="guide.html#ok">ok</a> <a href="guide.html#gone">gone</a> <a href="nowhere.html">x</a>'
        '<a href="https://example.invalid/">external, not followed</a> <a href="#top">self</a><p id="top"></p>'
    )
    (tmp_path / "guide.html").write_text('<h1 id="ok">Guide</h1><img src="_images/missing.png">')
    out = _check_links(tmp_path)
    assert out.returncode == 1
    broken = sorted(ln for ln in out.stdout.splitlines() if not ln.startswith("check_links:"))
    assert broken == [
        "guide.html: _images/missing.png (no file _images/missing.png)",
        "index.html: guide.html#gone (no anchor #gone)",
        "index.html: nowhere.html (no file nowhere.html)",
    ], out.stdout
    (tmp_path / "guide.html").write_text('<h1 id="ok">Guide</h1><p id="gone"></p>')
    (tmp_path / "nowhere.html").write_text("")
    assert _check_links(tmp_path).returncode == 0


def _needs_sphinx():
    pytest.importorskip(
        "sphinx", reason="Sphinx is not installed here (CI's documentation step builds the site)"
    )
    pytest.importorskip(
        "furo", reason="the theme is not installed here (pip install -r docs/requirements.txt)"
    )


def _site(tmp_path, top):
    """The site Sphinx builds from top/docs, with warnings as errors; its links checked."""
    _needs_sphinx()
    site = tmp_path / "html"
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "-q", "-b", "html", "docs", str(site)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=top,
    )
    assert out.returncode == 0, f"Sphinx in {top}:\n{out.stdout}{out.stderr}"
    links = _check_links(site)
    assert links.returncode == 0, links.stdout
    return site


@pytest.mark.slow
def test_site_builds_without_warnings_and_its_links_hold(tmp_path):
    site = _site(tmp_path, ROOT)
    for page in (
        "api",
        "cython-api",
        "thread-pools",
        "testing",
        "doctor",
        "benchmarks",
        "changelog",
        "support",
    ):
        assert (site / f"{page}.html").is_file(), page
    api = re.sub(r"<[^>]+>", "", (site / "api.html").read_text())
    # Signatures and types from the stub, not the compiled module's bare names.
    assert "ContextGuard(device: DeviceLike)" in api
    for sig in (
        "shared(device: DeviceLike) ARROW ContextGuard",
        "device(device: DeviceLike) ARROW ContextGuard",
        "current_device() ARROW int | None",
        "get_include() ARROW str",
        "get_include_dirs() ARROW list[str]",
    ):
        assert sig.replace("ARROW", "&#x2192;") in api or sig.replace("ARROW", "→") in api, sig
    assert "Type: int" in api  # a compiled property's type


def _sdist(tmp_path):
    """The source distribution of this tree: the release one in wheelhouse/ when there is one
    (CI builds it first), else one built here with setuptools, as `python -m build --sdist`."""
    from cyctx._version import __version__

    made = os.path.join(ROOT, "wheelhouse", f"cyctx-{__version__}.tar.gz")
    if os.path.isfile(made):
        return made
    out = tmp_path / "sdist"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return str(out / proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_site_builds_from_the_unpacked_sdist(tmp_path):
    # The README says the documentation ships in the sdist: it builds there as it does here,
    # with warnings as errors (a missing image or include is one).
    _needs_sphinx()
    import tarfile

    with tarfile.open(_sdist(tmp_path)) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (top,) = (tmp_path / "unpacked").iterdir()
    _site(tmp_path, top)
