"""Tests of the simulated CUDA driver (src/cyctx/_sim/simdriver.c).

The simulator is driven the way cyctx drives the real driver: through
``cuda.bindings.driver``, which resolves every function with ``cuGetProcAddress_v2``.
ABI variants that the Python API does not expose are called through ctypes on the
pointer that ``cuGetProcAddress_v2`` returns. The ``cyctxsim_*`` control API shows
state the driver API cannot (reference counts, stack depth) and injects faults.

The library can be loaded once per process and ``cuInit`` state persists, so the
tests here never depend on order: they work with deltas, release what they retain,
leave the thread's stack as they found it (an autouse fixture checks), and run what
needs a fresh process (before ``cuInit``, exact context ids, several devices, fork
without ``cuInit``) in a subprocess.
"""

import ctypes
import functools
import os
import textwrap
import threading

import pytest


def _load_simulator():
    try:  # already loaded (RTLD_NOLOAD finds a library by its soname)
        lib = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError:
        path = os.environ.get("CYCTX_SIM_LIBRARY")
        if not path:
            pytest.skip(
                "simulated driver not loaded: set CYCTX_SIM_LIBRARY to the built libcuda.so.1",
                allow_module_level=True,
            )
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    if not hasattr(lib, "cyctxsim_is_simulated"):
        pytest.skip("libcuda.so.1 in this process is the real driver", allow_module_level=True)
    return lib


sim = _load_simulator()
from cuda.bindings import driver as _bdrv  # noqa: E402  (after the simulator is loaded)
from helpers.children import TESTS_DIR, run_python  # noqa: E402
from helpers.forking import run_forked  # noqa: E402
from helpers.threads import in_thread, run_threads, running  # noqa: E402

from cyctx.testing import declare_control_api  # noqa: E402

# CUDA 13 added cuCtxGetDevice_v2/cuCtxSynchronize_v2 to the bindings; steps using them run
# only there. With 12.x bindings cuCtxCreate is the old (flags, dev) ABI and the v4 one is
# cuCtxCreate_v4: the proxy below keeps the tests' v4-style calls working on both majors.
HAS13 = hasattr(_bdrv, "cuCtxGetDevice_v2")


class _Compat:
    def __getattr__(self, name):
        return getattr(_bdrv, name)

    def cuCtxCreate(self, *args):
        fn = _bdrv.cuCtxCreate if HAS13 or len(args) == 2 else _bdrv.cuCtxCreate_v4
        return fn(*args)


drv = _Compat()

declare_control_api(sim)


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _library_path():
    info = _DlInfo()
    libdl = ctypes.CDLL(None)
    fn = ctypes.cast(sim.cyctxsim_is_simulated, ctypes.c_void_p)
    assert libdl.dladdr(fn, ctypes.byref(info))
    return os.path.realpath(info.dli_fname.decode())


SIM_PATH = _library_path()
R = drv.CUresult
SUCCESS = R.CUDA_SUCCESS
INVALID_VALUE = R.CUDA_ERROR_INVALID_VALUE
NOT_INITIALIZED = R.CUDA_ERROR_NOT_INITIALIZED
INVALID_DEVICE = R.CUDA_ERROR_INVALID_DEVICE
INVALID_CONTEXT = R.CUDA_ERROR_INVALID_CONTEXT
DESTROYED = R.CUDA_ERROR_CONTEXT_IS_DESTROYED


def ok(result):
    """Assert a cuda.bindings call succeeded; return its value (or values)."""
    assert result[0] == SUCCESS, result
    rest = result[1:]
    return rest[0] if len(rest) == 1 else (rest or None)


def err(result):
    return result[0]


def count(name):
    return sim.cyctxsim_call_count(name.encode())


# --- raw ABI access through the simulator's own cuGetProcAddress_v2 -------------------

_gpa_v2 = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_int,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_int),
)(("cuGetProcAddress_v2", sim))
_gpa_v1 = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64
)(("cuGetProcAddress", sim))


def gpa(symbol, version, flags=0):
    """(CUresult, pointer or None, status) of cuGetProcAddress_v2."""
    pfn, status = ctypes.c_void_p(0xDEAD), ctypes.c_int(-1)
    r = _gpa_v2(symbol.encode(), ctypes.byref(pfn), version, flags, ctypes.byref(status))
    return r, pfn.value, status.value


def raw(symbol, version, *argtypes):
    r, pfn, _ = gpa(symbol, version)
    assert r == 0 and pfn, (symbol, version, r)
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(pfn)


P = ctypes.c_void_p
PP = ctypes.POINTER(ctypes.c_void_p)
PI = ctypes.POINTER(ctypes.c_int)
PU = ctypes.POINTER(ctypes.c_uint)
PULL = ctypes.POINTER(ctypes.c_ulonglong)


def handle(ctx):
    return int(ctx) if ctx is not None else 0


# --- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _initialised():
    assert sim.cyctxsim_is_simulated() == 1
    ok(drv.cuInit(0))
    yield


def _state():
    retains = [sim.cyctxsim_retain_count(i) for i in range(sim.cyctxsim_device_count())]
    current = handle(ok(drv.cuCtxGetCurrent()))
    return sim.cyctxsim_stack_depth(), current, retains, sim.cyctxsim_live_contexts()


@pytest.fixture(autouse=True)
def _leaves_state_as_found():
    """Each test leaves this thread's stack, every reference count and the created
    contexts as it found them, and no fault pending."""
    before = _state()
    yield
    sim.cyctxsim_clear_faults()
    assert _state() == before


@pytest.fixture
def primary():
    """Device 0's primary context, retained for the test and released after."""
    ctx = ok(drv.cuDevicePrimaryCtxRetain(0))
    yield ctx
    ok(drv.cuDevicePrimaryCtxRelease(0))


def run_fresh(code, devices=None, timeout=60):
    """Run `code` in a new interpreter with the simulator loaded and cuda.bindings
    imported as `drv`, nothing called yet; return its stdout. tests/ is on its sys.path
    (for helpers), cyctx is not imported."""
    env = dict(
        os.environ,
        CYCTX_SIM_LIBRARY=SIM_PATH,
        PYTHONPATH=os.pathsep.join(filter(None, [TESTS_DIR, os.environ.get("PYTHONPATH")])),
    )
    env.pop("CYCTX_SIM_DEVICES", None)
    if devices is not None:
        env["CYCTX_SIM_DEVICES"] = str(devices)
    prelude = textwrap.dedent(f"""
        import ctypes, os, sys
        sim = ctypes.CDLL({SIM_PATH!r}, mode=ctypes.RTLD_GLOBAL)
        sim.cyctxsim_call_count.restype = ctypes.c_longlong
        from cuda.bindings import driver as drv
        R = drv.CUresult
        def rc(result):
            return int(result[0])
    """)
    return run_python(code, prelude, env=env, timeout=timeout).stdout


# --- library, versions, initialisation -----------------------------------------------


def test_identity_and_exports():
    assert sim.cyctxsim_is_simulated() == 1
    assert ok(drv.cuDriverGetVersion()) == 13000
    for exported in ("cuInit", "cuDriverGetVersion", "cuGetProcAddress", "cuGetProcAddress_v2"):
        assert hasattr(sim, exported)
    # every implementation is static: reachable only through cuGetProcAddress
    for hidden in (
        "cuCtxPushCurrent",
        "cuCtxPushCurrent_v2",
        "cuDevicePrimaryCtxRetain",
        "cuCtxGetCurrent",
        "cuGetErrorName",
        "sim_lookup",
    ):
        assert not hasattr(sim, hidden)


def test_before_cuinit_everything_but_the_loader_calls_is_not_initialized():
    out = run_fresh("""
        print(rc(drv.cuCtxGetCurrent()), rc(drv.cuDeviceGetCount()), rc(drv.cuDeviceGet(0)),
              rc(drv.cuDevicePrimaryCtxRetain(0)), rc(drv.cuCtxPushCurrent(None)),
              rc(drv.cuCtxPopCurrent()), rc(drv.cuCtxGetId(None)))
        print(rc(drv.cuDriverGetVersion()), rc(drv.cuGetErrorName(R.CUDA_ERROR_INVALID_VALUE)),
              rc(drv.cuGetErrorString(R.CUDA_ERROR_INVALID_VALUE)),
              rc(drv.cuGetProcAddress(b"cuCtxGetCurrent", 4000, 0)))
        print(sim.cyctxsim_configure(0), sim.cyctxsim_configure(65), sim.cyctxsim_configure(3),
              sim.cyctxsim_device_count())
        print(rc(drv.cuInit(1)), rc(drv.cuInit(0)), rc(drv.cuInit(0)), rc(drv.cuInit(1)))
        print(sim.cyctxsim_configure(2), drv.cuDeviceGetCount()[1], rc(drv.cuCtxGetCurrent()))
    """)
    lines = out.split("\n")
    assert lines[0].split() == ["3"] * 7
    assert lines[1].split() == ["0"] * 4
    assert lines[2].split() == ["-1", "-1", "0", "3"]
    assert lines[3].split() == ["1", "0", "0", "1"]  # cuInit(flags != 0) -> INVALID_VALUE
    assert lines[4].split() == ["-1", "3", "0"]  # configure after cuInit is refused


def test_get_proc_address_picks_the_newest_variant_not_newer_than_asked():
    # cuCtxCreate: _v2 at 3020, _v3 at 11040, _v4 at 12050 (the versions cuda.bindings asks)
    v2, v3, v4 = (gpa("cuCtxCreate", v)[1] for v in (3020, 11040, 12050))
    assert len({v2, v3, v4}) == 3
    assert gpa("cuCtxCreate", 11039)[1] == v2
    assert gpa("cuCtxCreate", 12049)[1] == v3
    assert gpa("cuCtxCreate", 13000)[1] == v4
    assert gpa("cuCtxGetDevice", 2000)[1] != gpa("cuCtxGetDevice", 13000)[1]
    assert gpa("cuCtxSynchronize", 2000)[1] != gpa("cuCtxSynchronize", 13000)[1]
    assert gpa("cuDevicePrimaryCtxSetFlags", 7000)[1] != gpa("cuDevicePrimaryCtxSetFlags", 11000)[1]
    assert gpa("cuDevicePrimaryCtxRelease", 7000)[1] != gpa("cuDevicePrimaryCtxRelease", 11000)[1]
    assert gpa("cuGetProcAddress", 12000)[1] == ctypes.cast(_gpa_v2, P).value
    assert gpa("cuGetProcAddress", 11030)[1] == ctypes.cast(_gpa_v1, P).value
    # as the H200 answers: too old for any variant, or an unknown name -> CUDA_SUCCESS, a
    # NULL pointer, and the status says which; newer than the driver -> INVALID_VALUE
    assert gpa("cuCtxCreate", 1999) == (SUCCESS, None, 2)  # VERSION_NOT_SUFFICIENT
    assert gpa("cuCtxGetId", 11080) == (SUCCESS, None, 2)
    assert gpa("cuNoSuchFunction", 13000) == (SUCCESS, None, 1)  # SYMBOL_NOT_FOUND
    assert gpa("cuMemAlloc", 3020) == (SUCCESS, None, 1)  # not modelled
    assert gpa("cuStreamGetCtx", 12050) == (SUCCESS, None, 1)
    assert gpa("cuCtxCreate", 13010) == (INVALID_VALUE, 0xDEAD, -1)
    assert gpa("cuCtxCreate", 12050, flags=4)[0] == INVALID_VALUE
    assert gpa("cuCtxCreate", 12050, flags=2)[0] == SUCCESS  # per-thread stream flag
    # the v1 ABI (no status argument) follows the same rule
    pfn = ctypes.c_void_p()
    assert _gpa_v1(b"cuCtxCreate", ctypes.byref(pfn), 11040, 0) == 0 and pfn.value == v3
    assert (
        _gpa_v1(b"cuNoSuchFunction", ctypes.byref(pfn), 13000, 0) == SUCCESS and pfn.value is None
    )
    assert _gpa_v1(None, ctypes.byref(pfn), 13000, 0) == INVALID_VALUE
    # through cuda.bindings too
    assert ok(drv.cuGetProcAddress(b"cuCtxCreate", 11040, 0))[0] == v3


@pytest.mark.parametrize(
    "symbol,version",
    [
        ("cuGetErrorString", 6000),
        ("cuGetErrorName", 6000),
        ("cuInit", 2000),
        ("cuDriverGetVersion", 2020),
        ("cuDeviceGet", 2000),
        ("cuDeviceGetCount", 2000),
        ("cuDeviceGetName", 2000),
        ("cuDeviceGetUuid", 11040),
        ("cuDeviceTotalMem", 3020),
        ("cuDeviceGetAttribute", 2000),
        ("cuDeviceComputeCapability", 2000),
        ("cuDevicePrimaryCtxRetain", 7000),
        ("cuDevicePrimaryCtxRelease", 11000),
        ("cuDevicePrimaryCtxSetFlags", 11000),
        ("cuDevicePrimaryCtxGetState", 7000),
        ("cuDevicePrimaryCtxReset", 11000),
        ("cuCtxCreate", 3020),
        ("cuCtxCreate", 11040),
        ("cuCtxCreate", 12050),
        ("cuCtxDestroy", 4000),
        ("cuCtxPushCurrent", 4000),
        ("cuCtxPopCurrent", 4000),
        ("cuCtxSetCurrent", 4000),
        ("cuCtxGetCurrent", 4000),
        ("cuCtxGetDevice", 2000),
        ("cuCtxGetDevice", 13000),
        ("cuCtxGetFlags", 7000),
        ("cuCtxSetFlags", 12010),
        ("cuCtxGetId", 12000),
        ("cuCtxSynchronize", 2000),
        ("cuCtxSynchronize", 13000),
        ("cuCtxGetApiVersion", 3020),
        ("cuCtxGetStreamPriorityRange", 5050),
        ("cuDeviceGetPCIBusId", 4010),
        ("cuDeviceGetByPCIBusId", 4010),
        ("cuGetProcAddress", 12000),
    ],
)
def test_every_function_cuda_bindings_asks_for_at_its_version_resolves(symbol, version):
    r, pfn, status = gpa(symbol, version)
    assert (r, status) == (SUCCESS, 0) and pfn


# --- errors ----------------------------------------------------------------------------

# Codes newer than the CUDA 13.0 driver (580.159) that the simulator stands for: the
# real one answered CUDA_ERROR_INVALID_VALUE to them.
NEWER_THAN_DRIVER = {47, 227, 917, 918, 919}


def test_error_names_match_every_code_of_the_bindings():
    for code in R:
        if int(code) in NEWER_THAN_DRIVER:
            assert err(drv.cuGetErrorName(code)) == INVALID_VALUE, code
            assert err(drv.cuGetErrorString(code)) == INVALID_VALUE, code
        else:
            assert ok(drv.cuGetErrorName(code)) == code.name.encode(), code
            assert ok(drv.cuGetErrorString(code))


# The codes the differential scenario error_names_and_strings does not ask about.
@pytest.mark.parametrize(
    "code,text",
    [
        (2, b"out of memory"),
        (500, b"named symbol not found"),
        (916, b"an error happened during the key rotation sequence"),
    ],
)
def test_error_strings(code, text):
    assert ok(drv.cuGetErrorString(R(code))) == text


def test_unknown_error_code_is_invalid_value_with_null_string():
    name = raw("cuGetErrorName", 6000, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
    out = ctypes.c_char_p(b"sentinel")
    assert name(12345, ctypes.byref(out)) == INVALID_VALUE and out.value is None
    assert name(709, None) == INVALID_VALUE
    assert name(709, ctypes.byref(out)) == 0 and out.value == b"CUDA_ERROR_CONTEXT_IS_DESTROYED"


# --- devices ---------------------------------------------------------------------------


def test_device_queries():
    n = ok(drv.cuDeviceGetCount())
    assert n == sim.cyctxsim_device_count() >= 1
    dev = ok(drv.cuDeviceGet(0))
    assert ok(drv.cuDeviceGetName(64, dev)).split(b"\0")[0] == b"cyctx simulated GPU"
    A = drv.CUdevice_attribute
    assert ok(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) == 9
    assert ok(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) == 0
    assert ok(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) == 132
    assert ok(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev)) == 32
    assert ok(drv.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_TCC_DRIVER, dev)) == 0
    assert ok(drv.cuDeviceTotalMem(dev)) > 100 << 30
    cc = raw("cuDeviceComputeCapability", 2000, PI, PI, ctypes.c_int)
    major, minor = ctypes.c_int(), ctypes.c_int()
    assert cc(ctypes.byref(major), ctypes.byref(minor), 0) == 0
    assert (major.value, minor.value) == (9, 0)
    bus = ok(drv.cuDeviceGetPCIBusId(32, dev)).split(b"\0")[0]
    assert int(ok(drv.cuDeviceGetByPCIBusId(bus))) == int(dev)
    assert err(drv.cuDeviceGetByPCIBusId(b"0000:ff:00.0")) == INVALID_DEVICE
    assert err(drv.cuDeviceGetByPCIBusId(b"not a bus id")) == INVALID_VALUE
    assert len(bytes(ok(drv.cuDeviceGetUuid(dev)).bytes)) == 16


def test_attribute_range():
    attr = raw("cuDeviceGetAttribute", 2000, PI, ctypes.c_int, ctypes.c_int)
    v = ctypes.c_int(-7)
    for bad in (0, -1, 148, 10**6):
        assert attr(ctypes.byref(v), bad, 0) == INVALID_VALUE and v.value == -7
    got = {}
    for good in range(1, 148):
        assert attr(ctypes.byref(v), good, 0) == 0
        got[good] = v.value
    # values an H200 with driver 580.159 reports
    assert (got[16], got[38], got[75], got[76], got[81], got[131]) == (
        132,
        62914560,
        9,
        0,
        233472,
        -1,
    )
    assert attr(None, 16, 0) == INVALID_VALUE


@pytest.mark.parametrize("bad", [-1, 99, 64, 2**31 - 1])
def test_invalid_device_everywhere(bad):
    assert err(drv.cuDeviceGet(bad)) == INVALID_DEVICE
    assert err(drv.cuDeviceGetName(16, bad)) == INVALID_DEVICE
    assert (
        err(drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_WARP_SIZE, bad))
        == INVALID_DEVICE
    )
    assert err(drv.cuDeviceTotalMem(bad)) == INVALID_DEVICE
    assert err(drv.cuDeviceGetUuid(bad)) == INVALID_DEVICE
    assert err(drv.cuDeviceGetPCIBusId(16, bad)) == INVALID_DEVICE
    assert err(drv.cuDevicePrimaryCtxRetain(bad)) == INVALID_DEVICE
    assert err(drv.cuDevicePrimaryCtxRelease(bad)) == INVALID_DEVICE
    assert err(drv.cuDevicePrimaryCtxGetState(bad)) == INVALID_DEVICE
    assert err(drv.cuDevicePrimaryCtxSetFlags(bad, 0)) == INVALID_DEVICE
    assert err(drv.cuDevicePrimaryCtxReset(bad)) == INVALID_DEVICE
    assert err(drv.cuCtxCreate(None, 0, bad)) == INVALID_DEVICE
    assert sim.cyctxsim_retain_count(bad) == -1 and sim.cyctxsim_primary_active(bad) == -1


def test_null_out_pointers_are_invalid_value():
    i, u = ctypes.c_int(), ctypes.c_uint()
    assert raw("cuDeviceGet", 2000, PI, ctypes.c_int)(None, 0) == INVALID_VALUE
    assert raw("cuDeviceGetCount", 2000, PI)(None) == INVALID_VALUE
    assert raw("cuDriverGetVersion", 2020, PI)(None) == INVALID_VALUE
    assert (
        raw("cuDeviceGetName", 2000, ctypes.c_char_p, ctypes.c_int, ctypes.c_int)(None, 10, 0)
        == INVALID_VALUE
    )
    assert raw("cuDeviceTotalMem", 3020, P, ctypes.c_int)(None, 0) == INVALID_VALUE
    assert raw("cuDeviceGetUuid", 11040, P, ctypes.c_int)(None, 0) == INVALID_VALUE
    assert raw("cuDevicePrimaryCtxRetain", 7000, PP, ctypes.c_int)(None, 0) == INVALID_VALUE
    assert (
        raw("cuDevicePrimaryCtxRetain", 7000, PP, ctypes.c_int)(None, 99) == INVALID_DEVICE
    )  # H200
    state = raw("cuDevicePrimaryCtxGetState", 7000, PU, PI, ctypes.c_int)
    assert state(None, ctypes.byref(i), 0) == INVALID_VALUE
    assert state(ctypes.byref(u), None, 0) == INVALID_VALUE
    assert raw("cuCtxGetCurrent", 4000, PP)(None) == INVALID_VALUE
    assert raw("cuCtxGetDevice", 2000, PI)(None) == INVALID_VALUE
    assert raw("cuCtxGetFlags", 7000, PU)(None) == INVALID_VALUE
    assert raw("cuCtxGetId", 12000, P, PULL)(None, None) == INVALID_VALUE
    assert (
        raw("cuCtxGetApiVersion", 3020, P, PU)(None, None) == INVALID_CONTEXT
    )  # context first (H200)
    assert raw("cuCtxCreate", 3020, PP, ctypes.c_uint, ctypes.c_int)(None, 0, 0) == INVALID_VALUE


# --- primary contexts ------------------------------------------------------------------


def test_primary_retain_release_counts_and_handle_is_stable():
    base = sim.cyctxsim_retain_count(0)
    a = ok(drv.cuDevicePrimaryCtxRetain(0))
    assert sim.cyctxsim_retain_count(0) == base + 1
    assert sim.cyctxsim_primary_active(0) == 1
    assert ok(drv.cuDevicePrimaryCtxGetState(0))[1] == 1
    b = ok(drv.cuDevicePrimaryCtxRetain(0))
    assert handle(a) == handle(b) and sim.cyctxsim_retain_count(0) == base + 2
    assert ok(drv.cuCtxGetId(a)) == ok(drv.cuCtxGetId(b))
    ok(drv.cuDevicePrimaryCtxRelease(0))
    ok(drv.cuDevicePrimaryCtxRelease(0))
    assert sim.cyctxsim_retain_count(0) == base
    assert sim.cyctxsim_primary_active(0) == (1 if base else 0)


def test_release_v1_abi_is_lenient_when_unbalanced():
    out = run_fresh("""
        drv.cuInit(0)
        addr = drv.cuGetProcAddress(b"cuDevicePrimaryCtxRelease", 7000, 0)[1]
        rel1 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(addr)
        print(rel1(0), rc(drv.cuDevicePrimaryCtxRelease(0)), sim.cyctxsim_retain_count(0))
    """)
    assert out.split() == ["0", "201", "0"]  # as the H200 answered


def test_lab_probe2_sequence_exactly():
    """The C probe's sequence on two H200s (docs/evidence.md: "Context ids come from one
    process-wide counter", "Reset keeps the handle and changes the id", "A reset keeps the retain
    count"): ids, stale codes, reference counts."""
    out = run_fresh(
        """
        def ok(r):
            if r[0] != 0:
                sys.exit(f"failed {r}")
            return r[1] if len(r) == 2 else r[1:]
        def cid(c):
            r = drv.cuCtxGetId(c)
            return r[1] if r[0] == 0 else 1000000000 + int(r[0])
        def active(dev=0):
            return ok(drv.cuDevicePrimaryCtxGetState(dev))[1]
        ok(drv.cuInit(0))
        print("devices", ok(drv.cuDeviceGetCount()))
        g = ok(drv.cuDevicePrimaryCtxRetain(0))
        print("retained id", cid(g))
        print("not current", int(ok(drv.cuCtxGetCurrent())) == 0, active())
        ok(drv.cuCtxPushCurrent(g))
        ok(drv.cuDevicePrimaryCtxReset(0))          # what cudaDeviceReset does
        cur = ok(drv.cuCtxGetCurrent())
        print("after reset", int(cur) == int(g), cid(cur), active(), rc(drv.cuCtxGetApiVersion(cur)),
              rc(drv.cuCtxGetDevice()))
        r = rc(drv.cuCtxPushCurrent(g)); print("push stale", r); ok(drv.cuCtxPopCurrent())
        g2 = ok(drv.cuDevicePrimaryCtxRetain(0))
        print("re-retain", int(g2) == int(g), cid(g2), rc(drv.cuCtxGetApiVersion(g2)))
        print("release1", rc(drv.cuDevicePrimaryCtxRelease(0)), active())
        print("release2", rc(drv.cuDevicePrimaryCtxRelease(0)), active())
        print("release3", rc(drv.cuDevicePrimaryCtxRelease(0)), sim.cyctxsim_retain_count(0))
        print("pop leftover", rc(drv.cuCtxPopCurrent()), int(ok(drv.cuCtxGetCurrent())) == 0)
        g = ok(drv.cuDevicePrimaryCtxRetain(0)); ok(drv.cuCtxPushCurrent(g))
        g1 = ok(drv.cuDevicePrimaryCtxRetain(1)); ok(drv.cuCtxPushCurrent(g1))
        print("dev1", cid(g1), int(ok(drv.cuCtxGetDevice())), "dev0", cid(g))
        ok(drv.cuCtxSetCurrent(g))                  # what cudaSetDevice(0) does inside
        x = ok(drv.cuCtxPopCurrent())
        print("popped dev0", int(x) == int(g), int(ok(drv.cuCtxGetCurrent())) == int(g))
    """,
        devices=2,
    )
    assert out.splitlines() == [
        "devices 2",
        "retained id 1",
        "not current True 1",
        "after reset True 1000000709 0 201 0",
        "push stale 0",
        "re-retain True 2 0",
        "release1 0 1",
        "release2 0 0",
        "release3 201 0",
        "pop leftover 0 True",
        "dev1 4 1 dev0 3",
        "popped dev0 True True",
    ]


def test_reset_keeps_refcount_new_id_and_other_threads_see_it(primary):
    base = sim.cyctxsim_retain_count(0)
    old_id = ok(drv.cuCtxGetId(primary))
    seen = {}
    reset_done, reactivated, done = threading.Event(), threading.Event(), threading.Event()

    def other():
        ok(drv.cuCtxPushCurrent(primary))
        reset_done.wait(30)
        seen["stale"] = (
            err(drv.cuCtxGetId(None)),
            err(drv.cuCtxGetApiVersion(None)),
            handle(ok(drv.cuCtxGetCurrent())),
            int(ok(drv.cuCtxGetDevice())),
        )
        done.set()
        reactivated.wait(30)
        seen["again"] = (ok(drv.cuCtxGetId(None)), ok(drv.cuCtxGetApiVersion(None)))
        ok(drv.cuCtxPopCurrent())

    with running(other):
        ok(drv.cuDevicePrimaryCtxReset(0))
        assert sim.cyctxsim_retain_count(0) == base  # reset keeps the references
        assert sim.cyctxsim_primary_active(0) == 0
        assert ok(drv.cuDevicePrimaryCtxGetState(0))[1] == 0
        assert err(drv.cuCtxGetId(primary)) == DESTROYED
        assert err(drv.cuCtxGetApiVersion(primary)) == INVALID_CONTEXT
        reset_done.set()
        done.wait(30)
        again = ok(drv.cuDevicePrimaryCtxRetain(0))  # re-activates: same handle, new id
        assert handle(again) == handle(primary)
        new_id = ok(drv.cuCtxGetId(primary))
        assert new_id > old_id
        reactivated.set()
    assert seen["stale"] == (DESTROYED, DESTROYED, handle(primary), 0)
    assert seen["again"] == (new_id, 3020)
    ok(drv.cuDevicePrimaryCtxRelease(0))


def test_reset_of_an_inactive_primary_is_harmless():
    out = run_fresh("""
        drv.cuInit(0)
        print(rc(drv.cuDevicePrimaryCtxReset(0)), sim.cyctxsim_primary_active(0),
              sim.cyctxsim_retain_count(0))
        c = drv.cuDevicePrimaryCtxRetain(0)[1]
        print(drv.cuCtxGetId(c)[1], rc(drv.cuDevicePrimaryCtxRelease(0)), rc(drv.cuCtxGetId(c)))
    """)
    assert out.split() == ["0", "0", "0", "1", "0", "709"]


def test_stale_primary_codes(primary):
    """The classic failure (docs/design.md, "The problem"): a current, non-NULL, dead handle."""
    ok(drv.cuCtxPushCurrent(primary))
    ok(drv.cuDevicePrimaryCtxReset(0))
    try:
        assert handle(ok(drv.cuCtxGetCurrent())) == handle(primary)
        assert err(drv.cuCtxGetApiVersion(primary)) == INVALID_CONTEXT  # lab: r201
        assert err(drv.cuCtxGetApiVersion(None)) == DESTROYED  # H200: via current
        assert err(drv.cuCtxGetId(primary)) == DESTROYED  # lab: 709
        assert err(drv.cuCtxGetId(None)) == DESTROYED
        assert int(ok(drv.cuCtxGetDevice())) == 0  # lab: ctxdev=0(r0)
        if HAS13:
            assert int(ok(drv.cuCtxGetDevice_v2(primary))) == 0
        assert ok(drv.cuCtxGetFlags()) == 0  # H200: 0 after reset
        assert err(drv.cuCtxSynchronize()) == DESTROYED  # H200
        if HAS13:
            assert err(drv.cuCtxSynchronize_v2(primary)) == DESTROYED
        assert err(drv.cuCtxGetStreamPriorityRange()) == DESTROYED
        assert err(drv.cuCtxSetFlags(0)) == DESTROYED  # H200 crashed here
        ok(drv.cuCtxPushCurrent(primary))  # lab: push stale r0
        ok(drv.cuCtxSetCurrent(primary))
        assert handle(ok(drv.cuCtxPopCurrent())) == handle(primary)
    finally:
        ok(drv.cuDevicePrimaryCtxRetain(0))
        ok(drv.cuDevicePrimaryCtxRelease(0))
        assert handle(ok(drv.cuCtxPopCurrent())) == handle(primary)


@pytest.mark.parametrize("flags", [0, 1, 2, 4, 0x10, 0x20, 0x40, 0x80, 0x04 | 0x10 | 0x80, 0xF1])
def test_primary_set_flags_valid(flags):
    before = ok(drv.cuDevicePrimaryCtxGetState(0))[0]
    ok(drv.cuDevicePrimaryCtxSetFlags(0, flags))
    assert ok(drv.cuDevicePrimaryCtxGetState(0))[0] == flags
    ok(drv.cuDevicePrimaryCtxSetFlags(0, before))


@pytest.mark.parametrize("flags", [3, 5, 6, 7, 0x08, 0xF9, 0xFF, 0x100, 0x83, 0xFFFFFFFF])
def test_primary_set_flags_invalid(flags):  # 0x08 (MAP_HOST) too, as on the H200
    before = ok(drv.cuDevicePrimaryCtxGetState(0))[0]
    assert err(drv.cuDevicePrimaryCtxSetFlags(0, flags)) == INVALID_VALUE
    assert ok(drv.cuDevicePrimaryCtxGetState(0))[0] == before


def test_primary_set_flags_v1_refuses_an_active_context(primary):
    v1 = raw("cuDevicePrimaryCtxSetFlags", 7000, ctypes.c_int, ctypes.c_uint)
    before = ok(drv.cuDevicePrimaryCtxGetState(0))[0]
    assert v1(0, 4) == R.CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
    ok(drv.cuDevicePrimaryCtxSetFlags(0, 4))  # the v2 ABI allows it
    ok(drv.cuCtxPushCurrent(primary))
    assert ok(drv.cuCtxGetFlags()) == 4 | 8  # the active context too, + MAP_HOST
    ok(drv.cuCtxSetFlags(2))  # the context's flags only (H200)
    assert ok(drv.cuCtxGetFlags()) == 2 | 8
    assert ok(drv.cuDevicePrimaryCtxGetState(0))[0] == 4
    ok(drv.cuCtxSetFlags(0x22))  # coredump bits are dropped
    assert ok(drv.cuCtxGetFlags()) == 2 | 8
    assert err(drv.cuCtxSetFlags(3)) == INVALID_VALUE
    assert err(drv.cuCtxSetFlags(0x100)) == INVALID_VALUE
    ok(drv.cuCtxPopCurrent())
    ok(drv.cuDevicePrimaryCtxSetFlags(0, before))


# --- the per-thread stack ----------------------------------------------------------------


def test_push_pop_order_and_empty_stack(primary):
    depth = sim.cyctxsim_stack_depth()
    mine = ok(drv.cuCtxCreate(None, 0, 0))  # pushed
    ok(drv.cuCtxPushCurrent(primary))
    assert sim.cyctxsim_stack_depth() == depth + 2
    assert handle(ok(drv.cuCtxGetCurrent())) == handle(primary)
    assert handle(ok(drv.cuCtxPopCurrent())) == handle(primary)
    assert handle(ok(drv.cuCtxGetCurrent())) == handle(mine)
    ok(drv.cuCtxDestroy(mine))
    assert sim.cyctxsim_stack_depth() == depth


def test_empty_stack_codes():
    # The calls the differential scenario stack_no_current does not make.
    def body():
        assert sim.cyctxsim_stack_depth() == 0
        assert raw("cuCtxPopCurrent", 4000, PP)(None) == INVALID_CONTEXT
        assert err(drv.cuCtxGetStreamPriorityRange()) == INVALID_CONTEXT
        assert sim.cyctxsim_stack_depth() == 0

    in_thread(body)


def test_pci_bus_id_short_buffer():
    buf = ctypes.create_string_buffer(b"x" * 16)
    pci = raw("cuDeviceGetPCIBusId", 4010, ctypes.c_char_p, ctypes.c_int, ctypes.c_int)
    assert pci(buf, 5, 0) == INVALID_VALUE and buf.value == b"0000"  # truncated, as on the H200
    assert pci(buf, 13, 0) == 0 and len(buf.value) == 12


def test_pop_with_null_pointer(primary):
    ok(drv.cuCtxPushCurrent(primary))
    depth = sim.cyctxsim_stack_depth()
    assert raw("cuCtxPopCurrent", 4000, PP)(None) == 0
    assert sim.cyctxsim_stack_depth() == depth - 1


@pytest.mark.parametrize("bogus", [0x1234, 0xDEADBEEF, 2**63 + 8])
def test_foreign_handles_are_invalid_context(bogus):
    # the real driver dereferences them and crashes; the simulator says 201
    c = drv.CUcontext(bogus)
    depth = sim.cyctxsim_stack_depth()
    assert err(drv.cuCtxPushCurrent(c)) == INVALID_CONTEXT
    assert err(drv.cuCtxSetCurrent(c)) == INVALID_CONTEXT
    assert err(drv.cuCtxDestroy(c)) == INVALID_CONTEXT
    assert err(drv.cuCtxGetId(c)) == INVALID_CONTEXT
    assert err(drv.cuCtxGetApiVersion(c)) == INVALID_CONTEXT
    if HAS13:
        assert err(drv.cuCtxGetDevice_v2(c)) == INVALID_CONTEXT
        assert err(drv.cuCtxSynchronize_v2(c)) == INVALID_CONTEXT
    assert sim.cyctxsim_stack_depth() == depth


def test_null_context_arguments(primary):
    # The differential scenarios stack_push_null and stack_with_current pin the rest: a NULL
    # push refused, NULL meaning "the current context" for the id, api version, device and sync.
    assert err(drv.cuCtxDestroy(None)) == INVALID_VALUE
    ok(drv.cuCtxPushCurrent(primary))
    assert ok(drv.cuCtxGetStreamPriorityRange()) == (0, -5)
    ok(drv.cuCtxPopCurrent())


def test_threads_hammering_push_pop_have_no_cross_talk(primary):
    n_threads, rounds = 16, 400
    barrier = threading.Barrier(n_threads)
    errors = []

    def worker(k):
        try:
            mine = ok(drv.cuCtxCreate(None, 0, 0))  # a context nobody else has
            my_id = ok(drv.cuCtxGetId(mine))
            barrier.wait()
            for i in range(rounds):
                ok(drv.cuCtxPushCurrent(primary))
                assert handle(ok(drv.cuCtxGetCurrent())) == handle(primary)
                ok(drv.cuCtxPushCurrent(mine))
                assert sim.cyctxsim_stack_depth() == 3
                assert ok(drv.cuCtxGetId(None)) == my_id
                ok(drv.cuCtxSetCurrent(primary))
                ok(drv.cuCtxSetCurrent(mine))
                assert handle(ok(drv.cuCtxPopCurrent())) == handle(mine)
                assert handle(ok(drv.cuCtxPopCurrent())) == handle(primary)
                assert handle(ok(drv.cuCtxGetCurrent())) == handle(mine)
                assert sim.cyctxsim_stack_depth() == 1
                if i % 50 == 0:
                    ok(drv.cuDevicePrimaryCtxRetain(0))
                    ok(drv.cuDevicePrimaryCtxRelease(0))
            ok(drv.cuCtxDestroy(mine))  # current here: popped
            assert sim.cyctxsim_stack_depth() == 0
        except BaseException as e:
            errors.append((k, e))
            barrier.abort()

    live = sim.cyctxsim_live_contexts()
    run_threads(*(functools.partial(worker, k) for k in range(n_threads)))
    assert not errors, errors[:3]
    assert sim.cyctxsim_live_contexts() == live


def test_concurrent_retain_release_balances():
    base = sim.cyctxsim_retain_count(0)

    def worker():
        for _ in range(500):
            ok(drv.cuDevicePrimaryCtxRetain(0))
            ok(drv.cuDevicePrimaryCtxRelease(0))

    run_threads(*[worker] * 16)
    assert sim.cyctxsim_retain_count(0) == base


def test_thread_exiting_with_contexts_on_its_stack(primary):
    def body():
        for _ in range(100):  # grows the stack past its first block
            ok(drv.cuCtxPushCurrent(primary))
        return sim.cyctxsim_stack_depth()

    assert in_thread(body) == 100
    assert in_thread(sim.cyctxsim_stack_depth) == 0


# --- created contexts --------------------------------------------------------------------


def test_create_pushes_and_destroy_pops(primary):
    live, depth = sim.cyctxsim_live_contexts(), sim.cyctxsim_stack_depth()
    prim_id = ok(drv.cuCtxGetId(primary))
    a = ok(drv.cuCtxCreate(None, 2, 0))  # CU_CTX_SCHED_YIELD
    assert sim.cyctxsim_live_contexts() == live + 1
    assert sim.cyctxsim_stack_depth() == depth + 1
    assert handle(ok(drv.cuCtxGetCurrent())) == handle(a)
    assert ok(drv.cuCtxGetFlags()) == 2
    assert int(ok(drv.cuCtxGetDevice())) == 0
    assert ok(drv.cuCtxGetApiVersion(a)) == 3020
    a_id = ok(drv.cuCtxGetId(a))
    assert a_id > prim_id
    b = ok(drv.cuCtxCreate(None, 0, 0))
    assert ok(drv.cuCtxGetId(b)) > a_id  # one counter for all contexts
    ok(drv.cuCtxSetFlags(4))
    assert ok(drv.cuCtxGetFlags()) == 4
    ok(drv.cuCtxDestroy(b))
    assert handle(ok(drv.cuCtxGetCurrent())) == handle(a)
    ok(drv.cuCtxDestroy(a))
    assert sim.cyctxsim_live_contexts() == live
    assert sim.cyctxsim_stack_depth() == depth
    # a destroyed handle, as the H200 treated one
    assert err(drv.cuCtxDestroy(a)) == DESTROYED  # twice
    assert err(drv.cuCtxGetId(a)) == DESTROYED
    assert err(drv.cuCtxGetApiVersion(a)) == INVALID_CONTEXT
    if HAS13:
        assert err(drv.cuCtxSynchronize_v2(a)) == DESTROYED
        assert int(ok(drv.cuCtxGetDevice_v2(a))) == 0
    ok(drv.cuCtxPushCurrent(a))  # can still be made current
    ok(drv.cuCtxSetCurrent(a))
    assert handle(ok(drv.cuCtxPopCurrent())) == handle(a)
    assert sim.cyctxsim_live_contexts() == live
    assert err(drv.cuCtxDestroy(primary)) == INVALID_CONTEXT
    assert sim.cyctxsim_primary_active(0) == 1


def test_destroy_twice_depends_on_whether_a_thread_had_it():
    # H200: destroyed while on some thread's stack -> the driver keeps a record, and a
    # second destroy says 709; destroyed while current nowhere -> nothing left, 201
    a = ok(drv.cuCtxCreate(None, 0, 0))
    ok(drv.cuCtxPopCurrent())
    ok(drv.cuCtxDestroy(a))
    assert err(drv.cuCtxDestroy(a)) == INVALID_CONTEXT
    assert err(drv.cuCtxGetApiVersion(a)) == INVALID_CONTEXT
    assert err(drv.cuCtxGetId(a)) == DESTROYED
    b = ok(drv.cuCtxCreate(None, 0, 0))
    ok(drv.cuCtxDestroy(b))  # current here: popped
    assert err(drv.cuCtxDestroy(b)) == DESTROYED
    c = ok(drv.cuCtxCreate(None, 0, 0))
    ok(drv.cuCtxPopCurrent())
    ok(drv.cuCtxPushCurrent(c))
    ok(drv.cuCtxSetCurrent(None))  # on no stack again
    ok(drv.cuCtxDestroy(c))
    assert err(drv.cuCtxDestroy(c)) == INVALID_CONTEXT


def test_destroyed_while_current_on_another_thread():
    created, destroyed, finished = threading.Event(), threading.Event(), threading.Event()
    box = {}

    def other():
        ok(drv.cuCtxPushCurrent(box["ctx"]))
        created.set()
        destroyed.wait(30)
        box["codes"] = (
            handle(ok(drv.cuCtxGetCurrent())),
            err(drv.cuCtxGetId(None)),
            err(drv.cuCtxGetApiVersion(None)),
            err(drv.cuCtxGetDevice()),
            err(drv.cuCtxGetFlags()),
            err(drv.cuCtxSynchronize()),
            err(drv.cuCtxPushCurrent(box["ctx"])),
            sim.cyctxsim_stack_depth(),
        )
        box["pop"] = handle(ok(drv.cuCtxPopCurrent()))
        ok(drv.cuCtxPopCurrent())
        finished.set()

    box["ctx"] = ok(drv.cuCtxCreate(None, 0, 0))
    with running(other):
        created.wait(30)
        ok(drv.cuCtxDestroy(box["ctx"]))  # current here too: popped here only
        destroyed.set()
        finished.wait(30)
    h = handle(box["ctx"])
    # H200: the id, api version, synchronise -> 709; its device and flags still answer;
    # it can be pushed again
    assert box["codes"] == (h, DESTROYED, DESTROYED, SUCCESS, SUCCESS, DESTROYED, SUCCESS, 2)
    assert box["pop"] == h


@pytest.mark.parametrize("flags", [3, 5, 7, 0x100, 0xFFFFFFFF])
def test_create_with_invalid_flags_creates_nothing(flags):
    live, depth = sim.cyctxsim_live_contexts(), sim.cyctxsim_stack_depth()
    assert err(drv.cuCtxCreate(None, flags, 0)) == INVALID_VALUE
    assert (sim.cyctxsim_live_contexts(), sim.cyctxsim_stack_depth()) == (live, depth)


def test_create_abi_variants():
    live = sim.cyctxsim_live_contexts()
    out = ctypes.c_void_p()
    v2 = raw("cuCtxCreate", 3020, PP, ctypes.c_uint, ctypes.c_int)
    assert v2(ctypes.byref(out), 0x10, 0) == 0 and out.value
    assert ok(drv.cuCtxGetFlags()) == 0x10
    ok(drv.cuCtxDestroy(drv.CUcontext(out.value)))
    v3 = raw("cuCtxCreate", 11040, PP, P, ctypes.c_int, ctypes.c_uint, ctypes.c_int)
    assert v3(ctypes.byref(out), None, 0, 0, 0) == 0
    ok(drv.cuCtxDestroy(drv.CUcontext(out.value)))
    param = (ctypes.c_int * 4)(0, 8, 0, 0)  # CUexecAffinityParam: SM count 8
    out.value = 0x77
    assert (
        v3(ctypes.byref(out), ctypes.cast(param, P), 1, 0, 0)
        == R.CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
    )
    assert v3(ctypes.byref(out), None, 1, 0, 0) == INVALID_VALUE
    assert out.value == 0x77
    assert v3(ctypes.byref(out), None, -1, 0, 0) == 0  # a count <= 0 is no affinity (H200)
    ok(drv.cuCtxDestroy(drv.CUcontext(out.value)))
    v4 = raw("cuCtxCreate", 12050, PP, P, ctypes.c_uint, ctypes.c_int)

    class Params(ctypes.Structure):
        _fields_ = [
            ("execAffinityParams", P),
            ("numExecAffinityParams", ctypes.c_int),
            ("cigParams", P),
        ]

    def v4_with(affinity, n, cig):
        params = ctypes.cast(ctypes.pointer(Params(affinity, n, cig)), P)
        return v4(ctypes.byref(out), params, 0, 0)

    assert v4_with(None, 0, None) == 0
    ok(drv.cuCtxDestroy(drv.CUcontext(out.value)))
    cig = (ctypes.c_int * 4)(0, 0, 0, 0)  # CUctxCigParam with no data type
    assert v4_with(None, 0, ctypes.addressof(cig)) == INVALID_VALUE
    cig[0] = 1  # D3D12 command queue: not on Linux
    assert v4_with(None, 0, ctypes.addressof(cig)) == R.CUDA_ERROR_NOT_SUPPORTED
    assert v4_with(ctypes.addressof(param), 1, None) == R.CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
    assert sim.cyctxsim_live_contexts() == live


@pytest.mark.skipif(not HAS13, reason="uses cuCtxGetDevice_v2, which only cuda-bindings 13 exposes")
def test_get_device_v1_and_v2():
    out = run_fresh(
        """
        drv.cuInit(0)
        c0 = drv.cuDevicePrimaryCtxRetain(0)[1]; c1 = drv.cuDevicePrimaryCtxRetain(1)[1]
        drv.cuCtxPushCurrent(c1)
        print(int(drv.cuCtxGetDevice()[1]), int(drv.cuCtxGetDevice_v2(c0)[1]),
              int(drv.cuCtxGetDevice_v2(None)[1]))
        mine = drv.cuCtxCreate(None, 0, 1)[1]
        print(int(drv.cuCtxGetDevice()[1]), int(drv.cuCtxGetDevice_v2(c0)[1]))
    """,
        devices=2,
    )
    assert out.split() == ["1", "0", "1", "1", "0"]


def test_several_devices():
    out = run_fresh(
        """
        drv.cuInit(0)
        n = drv.cuDeviceGetCount()[1]
        uuids = {bytes(drv.cuDeviceGetUuid(d)[1].bytes) for d in range(n)}
        buses = [drv.cuDeviceGetPCIBusId(32, d)[1].split(b"\\0")[0] for d in range(n)]
        back = [int(drv.cuDeviceGetByPCIBusId(b)[1]) for b in buses]
        prims = {int(drv.cuDevicePrimaryCtxRetain(d)[1]) for d in range(n)}
        print(n, len(uuids), len(set(buses)), back == list(range(n)), len(prims),
              [sim.cyctxsim_retain_count(d) for d in range(n)] == [1] * n,
              rc(drv.cuDeviceGet(n)), sim.cyctxsim_retain_count(n))
    """,
        devices=4,
    )
    assert out.split() == ["4", "4", "4", "True", "4", "True", "101", "-1"]


# --- fault injection and call counts -----------------------------------------------------


def test_fault_nth_call_fails_without_side_effect_then_normal(primary):
    depth = sim.cyctxsim_stack_depth()
    assert sim.cyctxsim_inject_fault(b"cuCtxPushCurrent", 2, 999, 1) == 0
    ok(drv.cuCtxPushCurrent(primary))  # 1st: normal
    assert err(drv.cuCtxPushCurrent(primary)) == R.CUDA_ERROR_UNKNOWN  # 2nd: the fault
    assert sim.cyctxsim_stack_depth() == depth + 1  # ... with no side effect
    ok(drv.cuCtxPushCurrent(primary))  # 3rd: normal again
    assert sim.cyctxsim_stack_depth() == depth + 2
    ok(drv.cuCtxPopCurrent())
    ok(drv.cuCtxPopCurrent())


def test_fault_count_and_untouched_out_params():
    base = sim.cyctxsim_retain_count(0)
    retain = raw("cuDevicePrimaryCtxRetain", 7000, PP, ctypes.c_int)
    out = ctypes.c_void_p(0x5151)
    assert sim.cyctxsim_inject_fault(b"cuDevicePrimaryCtxRetain", 1, 2, 2) == 0
    assert retain(ctypes.byref(out), 0) == 2 and out.value == 0x5151
    assert retain(ctypes.byref(out), 0) == 2 and out.value == 0x5151
    assert sim.cyctxsim_retain_count(0) == base
    assert retain(ctypes.byref(out), 0) == 0 and out.value != 0x5151
    assert sim.cyctxsim_retain_count(0) == base + 1
    ok(drv.cuDevicePrimaryCtxRelease(0))


@pytest.mark.skipif(not HAS13, reason="uses cuCtxGetDevice_v2, which only cuda-bindings 13 exposes")
def test_fault_matches_every_abi_variant(primary):
    ok(drv.cuCtxPushCurrent(primary))
    try:
        assert sim.cyctxsim_inject_fault(b"cuCtxGetDevice", 1, 201, 2) == 0
        assert err(drv.cuCtxGetDevice()) == INVALID_CONTEXT  # v1
        assert err(drv.cuCtxGetDevice_v2(None)) == INVALID_CONTEXT  # v2
        assert int(ok(drv.cuCtxGetDevice())) == 0
    finally:
        ok(drv.cuCtxPopCurrent())


def test_fault_on_release_leaves_refcount(primary):
    base = sim.cyctxsim_retain_count(0)
    sim.cyctxsim_inject_fault(b"cuDevicePrimaryCtxRelease", 1, 4, 1)
    assert err(drv.cuDevicePrimaryCtxRelease(0)) == R.CUDA_ERROR_DEINITIALIZED
    assert sim.cyctxsim_retain_count(0) == base


def test_independent_faults_and_clear():
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 1, 3, 1) == 0
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 3, 700, 1) == 0
    assert sim.cyctxsim_inject_fault(b"cuDeviceGetCount", 1, 999, 1) == 0
    assert err(drv.cuCtxGetCurrent()) == NOT_INITIALIZED
    ok(drv.cuCtxGetCurrent())
    assert err(drv.cuCtxGetCurrent()) == R.CUDA_ERROR_ILLEGAL_ADDRESS
    ok(drv.cuCtxGetCurrent())
    sim.cyctxsim_clear_faults()
    ok(drv.cuDeviceGetCount())


def test_fault_bad_arguments_and_table_limit():
    assert sim.cyctxsim_inject_fault(None, 1, 1, 1) == -1
    assert sim.cyctxsim_inject_fault(b"cuNoSuchFunction", 1, 1, 1) == -1
    assert sim.cyctxsim_inject_fault(b"cuCtxPushCurrent_v2", 1, 1, 1) == -1  # base names only
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 0, 1, 1) == -1
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 1, 0, 1) == -1
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 1, -5, 1) == -1
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 1, 1, 0) == -1
    for _ in range(64):
        assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 10**6, 1, 1) == 0
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 10**6, 1, 1) == -1
    sim.cyctxsim_clear_faults()
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 10**6, 1, 1) == 0
    sim.cyctxsim_clear_faults()
    ok(drv.cuCtxGetCurrent())


def test_fault_fires_exactly_count_times_across_threads():
    assert sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 1, 999, 5) == 0
    failures = []

    def worker():
        for _ in range(200):
            r = drv.cuCtxGetCurrent()
            if r[0] != SUCCESS:
                failures.append(r[0])

    run_threads(*[worker] * 8)
    assert failures == [R.CUDA_ERROR_UNKNOWN] * 5


def test_fault_wins_over_not_initialized():
    out = run_fresh("""
        sim.cyctxsim_inject_fault(b"cuCtxGetCurrent", 1, 999, 1)
        sim.cyctxsim_inject_fault(b"cuInit", 1, 100, 1)
        print(rc(drv.cuCtxGetCurrent()), rc(drv.cuCtxGetCurrent()), rc(drv.cuInit(0)),
              rc(drv.cuCtxGetCurrent()), rc(drv.cuInit(0)), rc(drv.cuCtxGetCurrent()))
    """)
    assert out.split() == ["999", "3", "100", "3", "0", "0"]


@pytest.mark.skipif(not HAS13, reason="uses cuCtxGetDevice_v2, which only cuda-bindings 13 exposes")
def test_call_counts():
    before = {n: count(n) for n in ("cuCtxGetCurrent", "cuCtxGetDevice", "cuCtxPushCurrent")}
    total = sim.cyctxsim_call_count(None)
    for _ in range(10):
        drv.cuCtxGetCurrent()
    drv.cuCtxGetDevice()
    drv.cuCtxGetDevice_v2(None)  # both variants count as cuCtxGetDevice
    sim.cyctxsim_inject_fault(b"cuCtxPushCurrent", 1, 1, 1)
    drv.cuCtxPushCurrent(None)  # a faulted call still counts
    assert count("cuCtxGetCurrent") - before["cuCtxGetCurrent"] == 10
    assert count("cuCtxGetDevice") - before["cuCtxGetDevice"] == 2
    assert count("cuCtxPushCurrent") - before["cuCtxPushCurrent"] == 1
    assert sim.cyctxsim_call_count(None) - total >= 13
    assert count("cuNoSuchFunction") == -1
    assert count("cuCtxPushCurrent_v2") == -1


def test_stall_holds_the_nth_call_until_unstalled():
    # The control that lets a test hold a thread inside a driver call (and race it).
    get_count = raw("cuDeviceGetCount", 2000, PI)  # ctypes: the GIL is dropped while it waits
    n = ctypes.c_int(-1)
    assert sim.cyctxsim_stall(b"cuDeviceGetCount", 2) == 0
    assert sim.cyctxsim_stall(b"cuDeviceGetCount", 1) == -1  # one stall at a time
    assert get_count(ctypes.byref(n)) == 0  # the 1st call passes
    before = count("cuDeviceGetCount")

    def held():
        out = ctypes.c_int(-1)
        return get_count(ctypes.byref(out)), out.value

    with running(held) as results:
        for _ in range(2000):
            if sim.cyctxsim_stalled() == 1:
                break
            threading.Event().wait(0.005)
        assert sim.cyctxsim_stalled() == 1
        assert count("cuDeviceGetCount") == before + 1  # counted, then held
        assert get_count(ctypes.byref(n)) == 0  # one call only: the next ones pass
        assert results == [None]
        sim.cyctxsim_unstall()
    assert results == [(0, n.value)] and sim.cyctxsim_stalled() == 0
    # Armed, then disarmed before it fired: the call passes.
    assert sim.cyctxsim_stall(b"cuDeviceGetCount", 1) == 0
    sim.cyctxsim_unstall()
    assert get_count(ctypes.byref(n)) == 0
    for bad in ((None, 1), (b"cuNoSuchFunction", 1), (b"cuDeviceGetCount", 0)):
        assert sim.cyctxsim_stall(*bad) == -1


def test_call_counts_are_exact_under_threads():
    # ctypes drops the GIL around each foreign call, so the threads do race in C
    get_current = raw("cuCtxGetCurrent", 4000, PP)
    before = count("cuCtxGetCurrent")

    def worker():
        out = ctypes.c_void_p()
        for _ in range(20000):
            get_current(ctypes.byref(out))

    run_threads(*[worker] * 8)
    assert count("cuCtxGetCurrent") - before == 160000


# C-speed stress: Python threads (even through ctypes) barely overlap inside the driver,
# so a small C harness drives the simulator's functions from real concurrent pthreads.
_STRESS_C = r"""
#include <pthread.h>
#include <stddef.h>
typedef int (*get_fn)(void **);
typedef int (*push_fn)(void *);
typedef int (*pop_fn)(void **);
typedef int (*set_fn)(void *);
typedef int (*retain_fn)(void **, int);
typedef int (*release_fn)(int);
struct fns { get_fn get; push_fn push; pop_fn pop; set_fn set; retain_fn retain; release_fn release; };
struct arg { const struct fns *f; void *mine, *shared; long iters, errors; };
static void *run(void *p) {
    struct arg *a = p;
    const struct fns *f = a->f;
    void *cur, *x;
    for (long i = 0; i < a->iters; i++) {
        if (f->push(a->mine)) a->errors++;
        if (f->push(a->shared)) a->errors++;
        if (f->set(a->mine) || f->get(&cur) || cur != a->mine) a->errors++;
        if (f->pop(&x) || x != a->mine) a->errors++;
        if (f->get(&cur) || cur != a->mine) a->errors++;
        if (f->pop(&x) || x != a->mine) a->errors++;
        if (f->get(&cur) || cur != NULL) a->errors++;
        if (f->retain(&x, 0) || x != a->shared || f->release(0)) a->errors++;
    }
    return NULL;
}
long stress(const struct fns *f, void **mine, void *shared, int n, long iters) {
    pthread_t t[64];
    struct arg a[64];
    long errors = 0;
    for (int i = 0; i < n; i++) {
        a[i] = (struct arg){f, mine[i], shared, iters, 0};
        pthread_create(&t[i], NULL, run, &a[i]);
    }
    for (int i = 0; i < n; i++) { pthread_join(t[i], NULL); errors += a[i].errors; }
    return errors;
}
"""


@pytest.fixture(scope="module")
def stress_harness(tmp_path_factory):
    from helpers.fakelibs import compiler, shared_library

    if not compiler():
        pytest.skip("no C compiler for the pthread stress harness")
    d = tmp_path_factory.mktemp("stress")
    shared_library(_STRESS_C, d / "stress.so", flags=("-O2", "-pthread"))
    lib = ctypes.CDLL(str(d / "stress.so"))
    lib.stress.restype = ctypes.c_long
    lib.stress.argtypes = [P, P, P, ctypes.c_int, ctypes.c_long]
    return lib


def test_pthreads_at_c_speed_no_cross_talk_exact_counts(stress_harness, primary):
    n, iters = 8, 50000
    fns = (ctypes.c_void_p * 6)(
        *(
            gpa(name, ver)[1]
            for name, ver in (
                ("cuCtxGetCurrent", 4000),
                ("cuCtxPushCurrent", 4000),
                ("cuCtxPopCurrent", 4000),
                ("cuCtxSetCurrent", 4000),
                ("cuDevicePrimaryCtxRetain", 7000),
                ("cuDevicePrimaryCtxRelease", 11000),
            )
        )
    )
    mine = []
    for _ in range(n):  # one private context per thread
        mine.append(ok(drv.cuCtxCreate(None, 0, 0)))
        ok(drv.cuCtxPopCurrent())
    handles = (ctypes.c_void_p * n)(*(handle(c) for c in mine))
    names = ("cuCtxGetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuDevicePrimaryCtxRetain")
    before = {k: count(k) for k in names}
    base = sim.cyctxsim_retain_count(0)
    errors = stress_harness.stress(
        ctypes.addressof(fns), ctypes.addressof(handles), handle(primary), n, iters
    )
    after = {k: count(k) - before[k] for k in names}
    for c in mine:
        ok(drv.cuCtxDestroy(c))
    assert errors == 0
    assert sim.cyctxsim_retain_count(0) == base
    assert after == {
        "cuCtxGetCurrent": 3 * n * iters,
        "cuCtxPushCurrent": 2 * n * iters,
        "cuCtxPopCurrent": 2 * n * iters,
        "cuDevicePrimaryCtxRetain": n * iters,
    }


def test_report_at_exit():
    code = textwrap.dedent(f"""
        import ctypes
        sim = ctypes.CDLL({SIM_PATH!r}, mode=ctypes.RTLD_GLOBAL)
        from cuda.bindings import driver as drv
        drv.cuInit(0)
        drv.cuDevicePrimaryCtxRetain(1); drv.cuDevicePrimaryCtxRetain(1)
        drv.cuDevicePrimaryCtxRetain(0); drv.cuDevicePrimaryCtxRelease(0)
        (drv.cuCtxCreate if drv.CUDA_VERSION >= 13000 else drv.cuCtxCreate_v4)(None, 0, 0)
    """)
    env = dict(os.environ, CYCTX_SIM_DEVICES="3", CYCTX_SIM_REPORT_AT_EXIT="1")
    proc = run_python(code, env=env, timeout=60)
    assert proc.stderr == "cyctxsim at exit: retains=[0, 2, 0] active=[0, 1, 0] live_contexts=1\n"
    env["CYCTX_SIM_REPORT_AT_EXIT"] = "0"
    proc = run_python(code, env=env, timeout=60)
    assert proc.stderr == ""


# --- fork --------------------------------------------------------------------------------


def test_fork_after_cuinit_child_gets_not_initialized(primary):
    ok(drv.cuCtxPushCurrent(primary))

    def child():
        return [
            int(x[0])
            for x in (
                drv.cuCtxGetCurrent(),
                drv.cuInit(0),
                drv.cuDevicePrimaryCtxRetain(0),
                drv.cuDeviceGetCount(),
                drv.cuCtxPopCurrent(),
                drv.cuCtxGetId(None),
                drv.cuDevicePrimaryCtxRelease(0),
                drv.cuInit(0),
            )
        ] + [
            int(drv.cuDriverGetVersion()[0]),
            int(drv.cuGetErrorName(R.CUDA_ERROR_INVALID_VALUE)[0]),
            sim.cyctxsim_configure(2),
        ]

    try:
        assert run_forked(child) == [3] * 8 + [0, 0, -1]
        # the parent is unaffected
        assert handle(ok(drv.cuCtxGetCurrent())) == handle(primary)
        ok(drv.cuCtxGetId(None))
    finally:
        ok(drv.cuCtxPopCurrent())


def test_fork_without_cuinit_child_can_initialise():
    out = run_fresh("""
        from helpers.forking import run_forked
        def child():
            codes = [rc(drv.cuCtxGetCurrent()), rc(drv.cuInit(0)), rc(drv.cuDeviceGetCount())]
            c = drv.cuDevicePrimaryCtxRetain(0)
            codes += [rc(c), rc(drv.cuCtxPushCurrent(c[1])), int(drv.cuCtxGetId(None)[1])]
            return " ".join(map(str, codes))
        print("child", run_forked(child))
        print("parent", rc(drv.cuCtxGetCurrent()), rc(drv.cuInit(0)), rc(drv.cuCtxGetCurrent()))
    """)
    assert out.splitlines() == ["child 3 0 0 0 0 1", "parent 3 0 0"]
