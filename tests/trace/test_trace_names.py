"""What a trace shows of names: files, directories, functions and libraries appear as Python
shows them, whatever their characters (Latin-1, the rest of the BMP, beyond it, bytes a path
has that no encoding decodes), and a long path keeps its tail, cut between characters; an
event prints as the one line the report gives it."""

import json
import os
import subprocess
import sys

import pytest
from helpers import drivers, fakelibs

import cyctx

MODULE = """
from cuda.bindings import driver as d


def {fn}():
    d.cuCtxSetCurrent(None)


class Klasse:
    def {method}(self):
        d.cuCtxSetCurrent(None)
"""

# (directory name, function name, method name)
NAMES = {
    "latin-1": ("dïr", "fünc", "méthode"),
    "bmp": ("目录", "函数", "方法"),
    "astral": ("d\U0001f600r", "f\U00020000nc", "m\U00020001"),
    "undecodable": (os.fsdecode(b"d\xffr"), "plain", "plain_method"),
}


def _import_from(directory, name, fn, method):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(MODULE.format(fn=fn, method=method))
    sys.path.insert(0, directory)
    try:
        __import__(name)
    finally:
        sys.path.remove(directory)
    return sys.modules.pop(name)


@pytest.mark.parametrize("kind", list(NAMES))
def test_python_files_and_functions_appear_as_python_shows_them(d, tmp_path, kind):
    dirname, fn, method = NAMES[kind]
    mod = _import_from(
        os.path.join(str(tmp_path), dirname), f"cyctx_names_{kind.replace('-', '_')}", fn, method
    )
    with cyctx.trace() as t:
        getattr(mod, fn)()
        getattr(mod.Klasse(), method)()
    first, second = t.events
    assert first.python[0].file == mod.__file__ == second.python[0].file
    assert first.python[0].function == fn
    assert second.python[0].function == f"Klasse.{method}"
    # The report and the JSON carry the same text.
    report = t.report()
    assert f"{mod.__file__}:" in report, report
    assert t.to_json()["events"][0]["python"][0]["file"] == mod.__file__


def test_a_long_non_ascii_path_keeps_its_tail_cut_between_characters(d, tmp_path):
    # Deeper than an event's 200 bytes of file name, in characters of 2, 3 and 4 bytes.
    parts = ["é" * 40, "目" * 30, "\U0001f600" * 20, "ü" * 40]
    directory = os.path.join(str(tmp_path), *parts)
    mod = _import_from(directory, "cyctx_names_long", "fünc", "méthode")
    with cyctx.trace() as t:
        mod.fünc()
    (e,) = t.events
    shown = e.python[0].file
    assert shown.startswith("...") and mod.__file__.endswith(shown[3:]), shown
    assert shown.endswith("ü" * 40 + "/cyctx_names_long.py")
    assert "\ufffd" not in shown and len(shown.encode()) <= 199, shown


LIB_C = r"""
typedef int (*set_fn)(void *);
__attribute__((noinline)) int cyctx_names_call(set_fn f) { int r = f((void *)0); return r + 0; }
"""

# In a process of its own: a library left mapped at a path no encoding decodes would be in
# every later test's memory map.
LIB_CHILD = """
import ctypes, json, os, sys
from cyctx.testing import use_simulated_driver
sim = use_simulated_driver(1)
import cyctx
from cuda.bindings import driver
driver.cuInit(0)
sys.path.insert(0, sys.argv[2])
from helpers import drivers
lib = ctypes.CDLL(sys.argv[1])
lib.cyctx_names_call.argtypes = [ctypes.c_void_p]
fn = ctypes.cast(drivers.sim_set_current(sim), ctypes.c_void_p).value
with cyctx.trace() as t:
    assert lib.cyctx_names_call(fn) == 0
(e,) = t.events
n = e.native[0]
print(json.dumps([os.fsencode(n.library).hex(), n.symbol, n.owner]))
"""


@pytest.mark.parametrize("kind", list(NAMES))
def test_a_native_library_in_a_non_ascii_directory_is_named_by_its_path(sim, tmp_path, kind):
    if fakelibs.compiler() is None:
        pytest.skip("no C compiler")
    directory = os.path.join(str(tmp_path), NAMES[kind][0])
    os.makedirs(directory)
    so = fakelibs.shared_library(LIB_C, os.path.join(directory, "libcyctxnames.so"), flags=["-O1"])
    helpers = os.path.dirname(os.path.dirname(os.path.abspath(drivers.__file__)))
    proc = subprocess.run(
        [sys.executable, "-c", LIB_CHILD, so, helpers],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    library, symbol, owner = json.loads(proc.stdout)
    # The path as Python shows it: the same bytes, whatever they are.
    assert bytes.fromhex(library) == os.fsencode(so)
    assert (symbol, owner) == ("cyctx_names_call", "libcyctxnames.so")


def test_an_event_prints_as_its_line_of_the_report(d, primary):
    g = cyctx.ContextGuard(1)
    try:
        with cyctx.trace() as t:
            drivers.ok(d.cuCtxSetCurrent(primary))
            with g:
                pass
            drivers.ok(d.cuCtxSetCurrent(None))
    finally:
        g.close()
    lines = [ln.strip() for ln in t.report().splitlines()]
    assert len(t.events) >= 4
    for e in t.events:
        assert str(e) == repr(e) and "\n" not in str(e)
        assert str(e) in lines, (str(e), lines)
    last = t.who_made_current()
    assert repr(last) in lines and len(repr(last)) < 300, repr(last)
    # In a container too (a list of events prints each as its line).
    assert repr([last]) == f"[{last}]"
