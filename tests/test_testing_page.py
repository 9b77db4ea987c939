"""docs/testing.md's worked example is docs/_examples/test_gpu.py (the page includes it), run
here as the page says, with the page's own conftest.py, and its printed output compared with
the page's block: the page cannot drift from what the plugin prints."""

import os
import re
import shutil

import pytest

pytest_plugins = ["pytester"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "testing.md")
EXAMPLE = os.path.join(ROOT, "docs", "_examples", "test_gpu.py")
pytestmark = pytest.mark.skipif(
    not (os.path.isfile(PAGE) and os.path.isfile(EXAMPLE)),
    reason="needs the source tree's docs/",
)


def _section(text: str, title: str) -> str:
    start = text.index(title)
    nxt = re.search(r"^#{2,3} ", text[start + len(title) :], re.M)
    return text[start : start + len(title) + nxt.start()] if nxt else text[start:]


def _normal(text: str) -> list[str]:
    """What does not differ from run to run: no handles, timings, paths or environment."""
    keep = []
    for line in text.strip().splitlines():
        # The session header's lines about the machine and the other plugins installed there
        # (pytest-benchmark's, hypothesis's, pytest-timeout's on a GPU machine).
        if re.match(
            r"(platform |rootdir: |configfile: |cachedir: |plugins: |benchmark: |hypothesis |"
            r"timeout: |\[gw\d+\] linux -- Python )",
            line,
        ):
            continue
        line = re.sub(r"0x[0-9a-f]+", "0x…", line)
        if line.endswith("...") and "0x…" in line:
            # A short-summary line cut at the terminal's width: where it is cut depends on how
            # many digits the handles before it have, which differs between machines (x86-64,
            # aarch64, an emulator's address space). Kept up to its first handle.
            line = line[: line.index("0x…") + 3]
        # The closing line is centred between runs of "=": a run of ten seconds or more (a slow
        # or emulated machine) prints a digit more and one "=" fewer.
        line = re.sub(r"^=+ (.*) =+$", r"\1", line)
        keep.append(re.sub(r" in \d+\.\d+s( \(\d+:\d\d:\d\d\))?$", " in …s", line))
    return keep


def test_the_worked_example_prints_what_the_page_shows(pytester, monkeypatch):
    pytest.importorskip("xdist")
    with open(PAGE) as f:
        page = f.read()
    example = _section(page, "### A worked example")
    assert "```{literalinclude} _examples/test_gpu.py" in example, (
        "the worked example no longer includes docs/_examples/test_gpu.py"
    )
    command = re.search(r"^`(pytest [^`]*test_gpu\.py)`", example, re.M)
    assert command, "no `pytest ... test_gpu.py` command in the worked example"
    shown = re.search(r"```text\n(.*?)```", example, re.S).group(1)
    conftest = re.search(r"```python\n(# conftest\.py\n.*?)```", page, re.S)
    assert conftest, "no ```python block starting '# conftest.py' on the page"

    pytester.makeconftest(conftest.group(1))
    shutil.copy(EXAMPLE, pytester.path / "test_gpu.py")
    args = command.group(1).split()[1:]
    monkeypatch.setenv("COLUMNS", "100")  # the page's width
    # The page shows a terminal's run: pytest prints the short summary untrimmed where CI or
    # BUILD_NUMBER is set, so the run under test must not inherit them from a CI job.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    printed = result.stdout.str()
    assert _normal(printed) == _normal(shown), (
        f"docs/testing.md's worked example shows other output than `{command.group(1)}` prints "
        f"now; it printed:\n{printed}"
    )
