"""The device spellings are written once (cyctx._inputs.SPELLINGS): recognition tries them, the
errors name them, the stub's DeviceLike says the same (docs/guarantees.md renders its table from
them)."""

import os
import re

import pytest
from helpers.children import run_child

from cyctx import ContextGuard
from cyctx._inputs import KINDS, SPELLINGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB = os.path.join(ROOT, "src", "cyctx", "__init__.pyi")


def test_every_spelling_has_a_kind_a_stub_and_docs():
    assert len(SPELLINGS) >= 14
    for sp in SPELLINGS:
        assert sp.kind in KINDS and sp.stub and sp.docs and sp.what, sp


def test_the_stub_union_is_the_tables():
    with open(STUB, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^DeviceLike = \((.*?)^\)", text, re.S | re.M)
    assert m, "DeviceLike not found in __init__.pyi"
    members = {p.strip() for p in m.group(1).split("|")}
    assert members == {sp.stub for sp in SPELLINGS}, members
    for name in members - {"SupportsIndex"}:  # each a Protocol the stub defines
        assert re.search(rf"^class {name}\(Protocol\):", text, re.M), name


@pytest.mark.parametrize(
    "bad", ["0", 1.5, object(), b"0", True], ids=["str", "float", "object", "bytes", "bool"]
)
def test_the_refusal_names_every_spelling(bad):
    with pytest.raises(TypeError) as ei:
        ContextGuard(bad)
    msg = str(ei.value)
    for sp in SPELLINGS:
        assert sp.what in msg, (sp.what, msg)
    # What users type, as they type it.
    for words in (
        "numpy.int64",
        "cupy.cuda.Device",
        "torch.device",
        "cuda.core Device",
        "CUcontext",
    ):
        assert words in msg, msg


@pytest.mark.parametrize("name", ["CUevent", "CUmodule", "CUresult"])
def test_a_cuda_bindings_object_that_is_no_spelling_is_refused_by_its_type(name):
    # They have __index__: refused by their type before any spelling reads them as an ordinal.
    from cuda.bindings import driver

    obj = driver.CUresult.CUDA_SUCCESS if name == "CUresult" else getattr(driver, name)(3)
    with pytest.raises(TypeError) as ei:
        ContextGuard(obj)
    msg = str(ei.value)
    assert msg.startswith(f"cuda.bindings.driver.{name} is not a device ("), msg
    assert msg.endswith(", which ContextGuard takes"), msg
    for sp in SPELLINGS:
        assert sp.what in msg, (sp.what, msg)


def test_shared_names_the_device_spellings_only():
    from cuda.bindings import driver

    with pytest.raises(TypeError) as ei:
        ContextGuard.shared(driver.CUcontext(0x1000))
    msg = str(ei.value)
    for sp in SPELLINGS:
        assert (sp.what in msg) == (sp.kind == "device"), (sp.what, msg)
    assert "a context's context" not in msg, msg


def test_each_entry_point_reads_its_argument_once():
    # In a child: a shared guard holds its retain until the process ends.
    out = run_child("""
        import cyctx
        from cyctx import ContextGuard

        class CountingIndex:
            reads = 0
            def __index__(self):
                type(self).reads += 1
                return 0

        class Device:  # a cupy.cuda.Device look-alike: recognised by its module and name
            reads = 0
            @property
            def id(self):
                type(self).reads += 1
                return 0
        Device.__module__ = "cupy.cuda.device"

        for make in (CountingIndex, Device):
            for call in (ContextGuard, ContextGuard.shared, cyctx.device):
                make.reads = 0
                g = call(make())
                print("READS", make.__name__, call.__name__, make.reads, g.device)
                if call is ContextGuard:
                    g.close()
    """)
    lines = [ln.split()[1:] for ln in out.stdout.splitlines() if ln.startswith("READS")]
    assert len(lines) == 6, out.stdout
    for name, call, reads, device in lines:
        assert (reads, device) == ("1", "0"), f"{call}({name}) read its argument {reads} times"
