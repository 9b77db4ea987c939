"""The light path to a cyctx wheel a downstream isolated build can find: the one command of
docs/install.md ("A cyctx wheel for your own package's build"), which the examples' READMEs
quote verbatim, run here as written on a copy of this source tree."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(ROOT, "docs", "install.md")
EXAMPLES = ("minimal", "downstream", "kernels")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(ROOT, "setup.py")) or not os.path.isfile(INSTALL),
    reason="needs the source tree (setup.py, docs/)",
)


def _command() -> str:
    with open(INSTALL, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"<!-- cyctx-wheel-command -->\n```\n([^\n]+)\n```", text)
    assert found, "docs/install.md has no ``` block after <!-- cyctx-wheel-command -->"
    return found.group(1)


def test_the_examples_readmes_quote_the_documented_command():
    command = _command()
    assert command.startswith("python -m pip wheel ") and " -w wheelhouse" in command, command
    for name in EXAMPLES:
        with open(os.path.join(ROOT, "examples", name, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        assert f"`{command}`" in readme, (
            f"examples/{name}/README.md does not quote docs/install.md's `{command}`"
        )
        # What they then run finds the wheel where the command puts it.
        assert "--find-links ../../wheelhouse" in readme, name


def _index_reachable():
    # The documented command is an isolated build: pip fetches setuptools and Cython from the
    # package index. A machine without one (a GPU box cut off from the network) cannot run it.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "setuptools", "--retries", "0"]
        + ["--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode == 0


@pytest.mark.slow
def test_the_documented_command_makes_a_wheel_pip_finds_for_cyctx(tmp_path):
    from cyctx._version import __version__

    if not _index_reachable():
        pytest.skip(
            "no package index reachable here: the documented command's isolated build needs one"
        )

    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT,
        tree,
        ignore=shutil.ignore_patterns(
            ".git",
            "build",
            "dist",
            "wheelhouse",
            "*.so",
            "*.egg-info",
            "__pycache__",
            ".pytest_cache",
            "_build",
            "_guard.cpp",
            "*.c.o",
        ),
    )
    argv = _command().split()
    assert argv[0] == "python"
    proc = subprocess.run(
        [sys.executable, *argv[1:]], cwd=tree, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = sorted(os.listdir(tree / "wheelhouse"))
    assert len(wheels) == 1 and wheels[0].startswith(f"cyctx-{__version__}-"), wheels
    # What a downstream build's resolver does with --find-links (pip's configuration and what
    # is installed here left out): it picks this wheel for cyctx.
    found = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--no-deps",
            "--quiet",
            "--report",
            "-",
            "--find-links",
            str(tree / "wheelhouse"),
            f"cyctx=={__version__}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.returncode == 0, found.stdout + found.stderr
    (picked,) = json.loads(found.stdout)["install"]
    assert picked["download_info"]["url"].endswith("/wheelhouse/" + wheels[0]), picked
