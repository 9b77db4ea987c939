"""The doctor asked again in one process: the runtime it loaded itself (its lookup, where the
program had none) stays the doctor's in every later report, so it never counts in the program's
mix of majors; and the "CUDA 11 runtime loaded" rule's boundary is 12.0 ("older than 12.0")."""

import json
import os

import pytest
from helpers.children import run_child, run_python
from helpers.fakelibs import fake_cuda_library

REPORTS = """
import ctypes, json, os
import cyctx

def seen(r):
    d = r.to_dict()
    return {
        "runtime": d["runtime"] and [d["runtime"]["library"], d["runtime"]["source"],
                                     d["runtime"]["note"] or ""],
        "runtimes": sorted([os.path.realpath(l["path"]), l["by_doctor"]]
                           for l in d["loaded"] if l["kind"] == "runtime" and not l["static"]),
        "codes": [f["code"] for f in d["findings"]],
    }

out = [seen(cyctx.diagnose())]
out.append(seen(cyctx.diagnose()))
if PROGRAM:
    ctypes.CDLL(PROGRAM)  # the program's own runtime, of another major, loaded after
    out.append(seen(cyctx.diagnose()))
    out.append(seen(cyctx.diagnose()))
print(json.dumps(out))
"""


def _reports(program=None):
    # No driver chosen: the doctor's lookup loads a runtime only where the driver is not the
    # simulated one (a real libcudart cannot drive it).
    proc = run_python(f"PROGRAM = {program!r}\n" + REPORTS, timeout=300)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    first = out[0]
    if not first["runtime"] or not first["runtime"][0]:
        pytest.skip(f"the doctor finds no libcudart to load here: {first['runtime']}")
    return out


def test_the_doctors_own_runtime_stays_the_doctors_and_is_not_mixed_with_the_programs(tmp_path):
    cu12 = fake_cuda_library(tmp_path / "lib", "cudart", 12090, soname="libcudart.so.12")
    first, second, third, fourth = _reports(cu12)
    path, how, _ = first["runtime"]
    ours = os.path.realpath(path)
    assert first["runtimes"] == [[ours, True]], first
    assert second["runtimes"] == [[ours, True]], "still the doctor's, though mapped by now"
    assert second["runtime"][0] == path
    assert second["runtime"][1] == f"{how}, loaded by an earlier diagnose()"
    assert second["codes"] == first["codes"]
    if ours.endswith(".so.12"):  # the doctor's own runtime is CUDA 12 here: no other major
        return
    for r in (third, fourth):
        assert sorted(r["runtimes"]) == sorted([[ours, True], [os.path.realpath(cu12), False]])
        assert "runtime_majors_mixed" not in r["codes"], r["codes"]
        # The program's runtime is the one described (this stand-in answers only its version,
        # so the doctor says it cannot load it as a runtime).
        assert cu12 in r["runtime"][0] + r["runtime"][2], r["runtime"]


@pytest.mark.parametrize(
    "version, soname, found",
    [(11080, "libcudart.so.11.0", True), (12000, "libcudart.so.12", False)],
    ids=["11.8", "12.0"],
)
def test_cuda11_runtime_rule_at_its_boundary(tmp_path, version, soname, found):
    # docs/doctor.md: a runtime "older than 12.0" is the classic failure's; 12.0 is not.
    lib = fake_cuda_library(tmp_path / "lib", "cudart", version, soname=soname)
    proc = run_child(
        f"""
        import ctypes, json, cyctx
        ctypes.CDLL({lib!r})
        r = cyctx.diagnose()
        print(json.dumps([f["code"] for f in r.to_dict()["findings"]]))
        """
    )
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ("cuda11_runtime_loaded" in codes) is found, codes
    assert "runtime_majors_mixed" not in codes, codes
