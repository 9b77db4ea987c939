"""The doctor's census of what is mapped, as a long-running process meets it: a library whose
file was deleted or replaced on disk after it was loaded (what `pip install -U` does under a
running Jupyter kernel; /proc/self/maps lists it as ``PATH (deleted)``), and libraries whose
version functions answer something that cannot be a CUDA version. Each case runs diagnose()
in a fresh interpreter on this run's driver, with stand-in libraries compiled here."""

import json
import os
import re
import textwrap

import pytest
from helpers.children import run_child, run_python

# Stand-ins: each answers its version function with what the case gives and counts the calls.
SOURCES = {
    "cudart": (
        "libcudart.so.13",
        "int census_calls = 0;\n"
        "int cudaRuntimeGetVersion(int *v) { census_calls++; *v = %(a)s; return 0; }\n",
    ),
    "nvrtc": (
        "libnvrtc.so.13",
        "int census_calls = 0;\n"
        "int nvrtcVersion(int *ma, int *mi) { census_calls++; *ma = %(a)s; *mi = %(b)s; return 0; }\n",
    ),
    "nvJitLink": (
        "libnvJitLink.so.13",
        "int census_calls = 0;\nint nvJitLinkVersion(unsigned *ma, unsigned *mi) "
        "{ census_calls++; *ma = %(a)s; *mi = %(b)s; return 0; }\n",
    ),
}
KIND = {"cudart": "runtime", "nvrtc": "nvrtc", "nvJitLink": "nvjitlink"}
FUNCTION = {
    "cudart": "cudaRuntimeGetVersion",
    "nvrtc": "nvrtcVersion",
    "nvJitLink": "nvJitLinkVersion",
}


def _build(directory, lib, a, b=0):
    from helpers.fakelibs import shared_library

    name, src = SOURCES[lib]
    os.makedirs(directory, exist_ok=True)
    # Built beside its final place: the case puts it there.
    return shared_library(src % {"a": a, "b": b}, os.path.join(directory, name + ".new"), name)


def _diagnose(site, load, then):
    """In a child: load ``load`` (a path), run ``then`` (code; LIB is the loaded library),
    diagnose inside a guard; (to_dict(), str(), calls into the loaded library)."""
    code = f"""
    import ctypes, json, os, sys
    sys.path.append({str(site)!r})
    LIB = ctypes.CDLL({load!r})
    {textwrap.indent(textwrap.dedent(then), "    ").strip()}
    from cyctx import ContextGuard
    from cyctx._doctor import diagnose
    g = ContextGuard(0)
    with g:
        r = diagnose()
    g.close()
    print(json.dumps([r.to_dict(), str(r), ctypes.c_int.in_dll(LIB, "census_calls").value]))
    """
    proc = run_child(textwrap.dedent(code))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _census_lines(text):
    section = text.split("\nLoaded", 1)[1].split("\n\n", 1)[0]
    return [ln for ln in section.splitlines()[1:] if not ln.startswith("  (")]


# Columns: kind, version (when there is one), path, [notes]; two spaces at least between.
COLUMNS = re.compile(
    r"  (driver|runtime|nvrtc|nvjitlink|library)  +(CUDA \d+\.\d+  +)?\S.*  \[.*\]$"
)


def _no_run_together(text):
    for line in _census_lines(text):
        assert COLUMNS.fullmatch(line), f"a census line whose columns run together: {line!r}"


# --- a file deleted or replaced after it was loaded -------------------------------------------


@pytest.mark.parametrize(
    ("lib", "via"),
    [("cudart", "path"), ("nvrtc", "path"), ("nvJitLink", "path"), ("cudart", "symlink")],
)
@pytest.mark.parametrize("how", ["deleted", "replaced", "renamed over"])
def test_a_library_deleted_or_replaced_on_disk_is_still_listed_as_loaded(tmp_path, lib, via, how):
    # via "symlink": loaded by its soname's link (libcudart.so.13 -> libcudart.so.13.0.96, as
    # the wheels and toolkits ship it); the memory map names the file, the loader the link.
    from helpers.fakelibs import fake_distribution

    site = tmp_path / "site"
    where = site / "torch" / "lib"
    old = _build(str(where), lib, 13000, 13) if lib == "cudart" else _build(str(where), lib, 13, 0)
    load = old[: -len(".new")]
    path = load + ".0.96" if via == "symlink" else load
    os.replace(old, path)
    if via == "symlink":
        os.symlink(os.path.basename(path), load)
    new = _build(str(tmp_path / "newer"), lib, 12090, 12) if lib == "cudart" else None
    if new is None:
        new = _build(str(tmp_path / "newer"), lib, 12, 9)
    fake_distribution(site, "torch", "9.9.0", [path])
    then = {
        "deleted": f"os.remove({path!r})",
        # pip's way: the old file removed, the new one written at the same path
        "replaced": f"import shutil; os.remove({path!r}); shutil.copy({new!r}, {path!r})",
        "renamed over": f"import shutil; shutil.copy({new!r}, {path!r} + '.tmp'); "
        f"os.replace({path!r} + '.tmp', {path!r})",
    }[how]
    d, text, calls = _diagnose(site, load, then)
    listed = [x for x in d["loaded"] if x["path"] == path]
    assert len(listed) == 1, f"{how} {lib}: the census lists {d['loaded']}"
    (entry,) = listed
    state = "deleted" if how == "deleted" else "replaced"
    # The loaded library's own answer (13.0), not the file on disk's (12.9), and asked once.
    assert (entry["kind"], entry["version"], entry["version_from"]) == (
        KIND[lib],
        13000,
        FUNCTION[lib],
    ), entry
    assert calls == 1, f"{lib}'s version function was called {calls} times"
    assert (entry["file"], entry["distribution"]) == (state, None), entry
    on_disk = {
        "deleted": "no file at this path now",
        "replaced": "another file at this path now, shipped by torch 9.9.0",
    }[state]
    assert entry["on_disk"] == on_disk, entry
    (line,) = [ln for ln in _census_lines(text) if path in ln]
    assert f"{state} since it was loaded: {on_disk}" in line and "CUDA 13.0" in line, line
    _no_run_together(text)


def test_a_library_unchanged_on_disk_is_the_same_file(tmp_path):
    site = tmp_path / "site"
    path = _build(str(site / "lib"), "cudart", 13000)[: -len(".new")]
    os.replace(path + ".new", path)
    d, text, _ = _diagnose(site, path, "pass")
    (entry,) = [x for x in d["loaded"] if x["path"] == path]
    assert (entry["file"], entry["on_disk"], entry["version"]) == ("same", None, 13000), entry
    assert "since it was loaded" not in text


# --- versions that cannot be versions ---------------------------------------------------------

IMPLAUSIBLE = [
    ("cudart", "2147483647", "0", "2147483647"),
    ("cudart", "-12000", "0", "-12000"),
    ("cudart", "12345", "0", "12345"),  # not 1000 * major + 10 * minor
    ("cudart", "0", "0", "0"),
    ("nvrtc", "-7", "2147483647", "major -7, minor 2147483647"),
    ("nvrtc", "13", "-1", "major 13, minor -1"),
    ("nvrtc", "0", "5", "major 0, minor 5"),
    ("nvJitLink", "4294967295", "0", "major -1, minor 0"),  # unsigned, read as the int it is
    ("nvJitLink", "13", "100", "major 13, minor 100"),
]


@pytest.mark.parametrize("lib, a, b, raw", IMPLAUSIBLE)
def test_an_implausible_version_is_a_note_never_a_version_or_a_finding(tmp_path, lib, a, b, raw):
    site = tmp_path / "site"
    path = _build(str(site / "lib"), lib, a, b)[: -len(".new")]
    os.replace(path + ".new", path)
    d, text, calls = _diagnose(site, path, "pass")
    (entry,) = [x for x in d["loaded"] if x["path"] == path]
    assert (entry["version"], entry["version_str"], entry["version_from"]) == (None, None, None)
    assert entry["note"] == f"{FUNCTION[lib]} returned an implausible version ({raw})", entry
    assert calls == 1
    # No finding rests on it: none names the library.
    assert not [f for f in d["findings"] if path in json.dumps(f)], d["findings"]
    (line,) = [ln for ln in _census_lines(text) if path in ln]
    assert "CUDA" not in line.split(path)[0], f"a version shown for {raw}: {line!r}"
    _no_run_together(text)


# CuPy's runtime module (its runtime linked in): answering a garbage version.
FAKE_CUPY = """
import types
_m = types.ModuleType("cupy_backends.cuda.api.runtime")
_m.__file__ = {ext!r}
_m.runtimeGetVersion = lambda: {value}
sys.modules[_m.__name__] = _m
"""


@pytest.mark.parametrize("value", [2147483647, -1, 12001])
def test_a_static_runtimes_implausible_version_is_a_note(tmp_path, value):
    site = tmp_path / "site"
    path = _build(str(site / "lib"), "cudart", 13000)[: -len(".new")]
    os.replace(path + ".new", path)
    ext = str(site / "runtime.so")
    d, text, _ = _diagnose(site, path, FAKE_CUPY.format(ext=ext, value=value))
    (cp,) = [x for x in d["loaded"] if x["static"] and "cupy_backends" in x["name"]]
    assert cp["version"] is None, cp
    assert cp["note"] == f"cudaRuntimeGetVersion returned an implausible version ({value})", cp
    assert not [f for f in d["findings"] if f["code"] == "runtime_majors_mixed"], d["findings"]
    _no_run_together(text)


# --- a mapped path that is not UTF-8 ----------------------------------------------------------


def test_a_library_whose_path_is_not_utf8_is_listed_by_the_name_the_os_gives_it(tmp_path):
    # A directory named in Latin-1 (an old home directory, a mounted share): its bytes are no
    # UTF-8, and os names it with surrogate escapes. Reading the memory map must neither stop
    # there nor alter the name, in the census, the doctor's runtime search and the driver lookup.
    where = tmp_path / os.fsdecode(b"caf\xe9") / "lib"
    old = _build(str(where), "cudart", 13000)
    load = old[: -len(".new")]
    os.replace(old, load)
    then = """
    from _cyctx_libcuda import loaded_libcuda
    from cyctx._census import mapped_paths
    from cyctx._doctor.runtime import loaded_cudart
    assert LIB._name in mapped_paths(), mapped_paths()
    assert loaded_cudart() == LIB._name and os.path.exists(loaded_cudart()), loaded_cudart()
    assert loaded_libcuda() is not None
    """
    d, text, calls = _diagnose(tmp_path, load, then)
    (entry,) = [x for x in d["loaded"] if x["path"] == load]
    assert (entry["kind"], entry["version"], entry["file"]) == ("runtime", 13000, "same"), entry
    assert calls == 1


def test_a_library_that_is_not_what_was_asked_at_a_path_that_is_not_utf8_is_refused_in_words(
    tmp_path,
):
    # ctypes reports a missing function (or a library that does not load) with the loader's
    # message, which names the path: not UTF-8 there, CPython before 3.14 raises
    # UnicodeDecodeError instead of AttributeError/OSError, or (some 3.11 releases) the error
    # with no message (3.14 decodes the message as os decodes paths). The doctor's runtime, the
    # driver lookup and the simulator's choice each pass the loader's message on, or say in
    # their own words what is known: never an empty reason.
    where = tmp_path / os.fsdecode(b"caf\xe9")
    old = _build(str(where), "cudart", 13000)  # has cudaRuntimeGetVersion only
    load = old[: -len(".new")]
    os.replace(old, load)
    junk = str(where / "junk.so")
    with open(junk, "w") as f:
        f.write("not a library")
    code = f"""
    import ctypes, json, os
    from _cyctx_libcuda import exports
    from cyctx._doctor.runtime import load_cudart
    from cyctx import testing
    lib = ctypes.CDLL({load!r})
    out = [exports(lib, "cudaRuntimeGetVersion"), exports(lib, "cudaGetDevice")]
    try:
        lib.cudaGetDevice
    except (AttributeError, UnicodeDecodeError) as e:
        # what this CPython's ctypes raises for it, and whether the loader's words came through
        out.append([type(e).__name__, isinstance(e, AttributeError) and str(e) != ""])
    try:
        ctypes.CDLL({junk!r})
    except (OSError, UnicodeDecodeError) as e:
        out[-1].append(isinstance(e, OSError) and str(e) != "")
    rt, why = load_cudart({load!r})
    out.append([rt, why])
    for path in ({load!r}, {junk!r}, {load + ".missing"!r}):
        os.environ["CYCTX_SIM_LIBRARY"] = path
        try:
            testing.use_simulated_driver()
        except (RuntimeError, FileNotFoundError) as e:
            out.append([type(e).__name__, str(e)])
    print(json.dumps(out))
    """
    proc = run_python(code)  # no driver chosen: the simulator's choice is the case's
    (
        exported,
        has_get_device,
        (raised, message_kept, load_message_kept),
        (rt, why),
        not_sim,
        junk_says,
        missing,
    ) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (exported, has_get_device, rt) == (True, False, None)
    assert raised in ("AttributeError", "UnicodeDecodeError"), raised
    lost = "(ctypes cannot decode the loader's message: the path is not UTF-8)"
    if message_kept:  # the loader's message, the path in it decoded as os decodes paths
        assert why.startswith(f"cannot load {load}: ") and why.endswith("cudaGetDevice"), ascii(why)
    else:
        assert why == f"cannot load {load}: a function is missing or it does not load {lost}"
    assert junk_says[0] == "RuntimeError"
    assert junk_says[1].startswith(f"{junk} (from CYCTX_SIM_LIBRARY) is not a library that loads: ")
    said = junk_says[1].split(" is not a library that loads: ", 1)[1]
    if load_message_kept:  # the loader's own words (glibc's vary), naming the file
        assert said.startswith(f"{junk}: ") and len(said) > len(junk) + 2, ascii(said)
    else:
        assert said.endswith(lost), ascii(said)
    not_sim = not_sim[1]
    missing = missing[0]
    assert not_sim.endswith("is not cyctx's simulated driver: it has no cyctxsim_is_simulated")
    assert missing in ("RuntimeError", "FileNotFoundError")


def test_what_the_loader_said_is_passed_on_or_said_to_be_lost():
    from _cyctx_libcuda import loader_message

    latin1 = os.fsdecode(b"/opt/caf\xe9/libcudart.so.13")
    undecodable = UnicodeDecodeError("utf-8", b"\xe9", 0, 1, "invalid continuation byte")
    assert loader_message(OSError("x.so: cannot open shared object file"), latin1) == (
        "x.so: cannot open shared object file"
    )
    for exc in (undecodable, AttributeError(""), OSError()):
        assert loader_message(exc, latin1).endswith(
            "(ctypes cannot decode the loader's message: the path is not UTF-8)"
        )
    # No message at a UTF-8 path: nothing is known of why, and nothing is claimed.
    assert loader_message(AttributeError(""), "/opt/lib/libcudart.so.13") == (
        "AttributeError with no message from the loader"
    )
