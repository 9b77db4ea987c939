"""Compile a small C++ program against cyctx's headers (the installed package's: its .pxd
directory holds _cpp/) and run it: for the native layers that no Python call can reach into."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def compile_and_run(tmp_path, source: str, name: str) -> subprocess.CompletedProcess:
    import cyctx

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    exe = tmp_path / name
    includes = [f"-I{d}" for d in [*cyctx.get_include_dirs(), os.path.dirname(cyctx.__file__)]]
    subprocess.run(
        [cxx, "-std=c++17", "-O1", *includes, str(src), "-o", str(exe), "-pthread"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
