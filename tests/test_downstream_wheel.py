"""The light path to a cyctx wheel a downstream isolated build can find: the one command of the
README's recipe for a Cython package on cyctx, run here as written on a copy of this source
tree."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
pytestmark = [
    pytest.mark.tooling,
    pytest.mark.skipif(
        not os.path.isfile(os.path.join(ROOT, "setup.py")) or not os.path.isfile(README),
        reason="needs the source tree (setup.py, README.md)",
    ),
]


def _command() -> str:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"<!-- cyctx-wheel-command -->\n```\n([^\n]+)\n```", text)
    assert found, "README.md has no ``` block after <!-- cyctx-wheel-command -->"
    return found.group(1)


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
