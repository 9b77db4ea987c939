"""Which driver this test process runs on, and small driver calls the tests share.

Importable from subprocesses too: `select()` there repeats the parent's choice, so a child
runs on the same driver (the simulated one must be loaded before any driver call).
"""

import contextlib
import os

KIND = None  # "real" or "sim"
SIM = None  # cyctx.testing.Sim when KIND == "sim"
SIM_DEVICES = 2
# The driver calls that change context state (cuInit aside): what a read-only check must not make.
STATE_CHANGING = (
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset",
    "cuDevicePrimaryCtxSetFlags",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuCtxSetCurrent",
    "cuCtxCreate",
    "cuCtxDestroy",
    "cuCtxSetFlags",
)


def select(requested, init=True):
    global KIND, SIM
    from cyctx import testing

    if requested == "auto":
        requested = "real" if testing.real_driver_available() else "sim"
    if requested == "sim":
        SIM = testing.use_simulated_driver(device_count=SIM_DEVICES)
    elif not testing.real_driver_available():
        raise SystemExit("--driver=real but no NVIDIA driver with a GPU loads here")
    KIND = requested
    if init:
        ok(driver().cuInit(0))
    os.environ["CYCTX_TEST_DRIVER"] = requested  # children follow
    return requested


def driver():
    from cuda.bindings import driver as d

    return d


def ok(result):
    """Unwrap a cuda.bindings call: assert CUDA_SUCCESS, return the value(s)."""
    d = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert err == d.CUresult.CUDA_SUCCESS, f"driver call failed: {err!r}"
    return rest[0] if len(rest) == 1 else tuple(rest) if rest else None


def handed_over():
    """Calls that could hand a context to the driver (cuCtxSetCurrent and cuCtxPushCurrent, as
    the simulated driver counts them); None on the real driver, which counts nothing."""
    if SIM is None:
        return None
    return SIM.call_count("cuCtxSetCurrent") + SIM.call_count("cuCtxPushCurrent")


def sim_set_current(sim):
    """The simulated driver's cuCtxSetCurrent as a ctypes function (through its
    cuGetProcAddress_v2): a call that reaches the driver through _ctypes and libffi."""
    import ctypes

    lib = sim._lib
    fn = ctypes.c_void_p()
    lib.cuGetProcAddress_v2.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_void_p,
    ]
    assert lib.cuGetProcAddress_v2(b"cuCtxSetCurrent", ctypes.byref(fn), 4000, 0, None) == 0
    return ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(fn.value)


def create_context(dev=0, flags=0, current=True):
    """cuCtxCreate on both majors: bindings 13 take (params, flags, dev), 12 take (flags, dev).
    The new context is pushed, as the driver does; current=False pops it again."""
    d = driver()
    try:
        ctx = ok(d.cuCtxCreate(None, flags, ok(d.cuDeviceGet(dev))))
    except TypeError:
        ctx = ok(d.cuCtxCreate(flags, ok(d.cuDeviceGet(dev))))
    if not current:
        ok(d.cuCtxPopCurrent())
    return ctx


def device_count():
    d = driver()
    ok(d.cuInit(0))
    return ok(d.cuDeviceGetCount())


def second_device():
    """Device 1 where there are two devices (the simulator always has two), else 0: tests that
    want a second context use it, and still run on a one-GPU machine."""
    return min(1, device_count() - 1)


def current():
    """The calling thread's current context as an int (0: none)."""
    return int(ok(driver().cuCtxGetCurrent()))


def set_current(ctx):
    """cuCtxSetCurrent on the calling thread (``ctx``: a CUcontext, or None for none)."""
    ok(driver().cuCtxSetCurrent(ctx))


def primary_state(dev):
    """(flags, active) of a device's primary context, through the driver."""
    flags, active = ok(driver().cuDevicePrimaryCtxGetState(dev))
    return flags, bool(active)


def reset_primary(dev):
    """cuDevicePrimaryCtxReset of a device: what cudaDeviceReset does to the primary context."""
    d = driver()
    ok(d.cuDevicePrimaryCtxReset(ok(d.cuDeviceGet(dev))))


def retains():
    """Every device's primary-context refcount on the simulated driver, less the retain the
    process holds for guards the collector freed (see process_retains); None on the real one,
    which cannot show it."""
    if SIM is None:
        return None
    from cyctx._guard import process_retains

    return [SIM.retain_count(i) - process_retains(i) for i in range(SIM.device_count)]


def drop_process_retains():
    """Release the process's retains of collected guards, so the next test starts without."""
    from cyctx._guard import _drop_process_retains

    return _drop_process_retains()


@contextlib.contextmanager
def retains_unchanged():
    """The block releases every retain it takes: each device's primary-context refcount is the
    same after it as before. Checked on the simulated driver; on the real one, which cannot
    show refcounts, the block runs unchecked. Yields the counts before (None on the real
    driver), for a test that also checks them inside the block."""
    before = retains()
    yield before
    assert retains() == before, f"primary-context refcounts changed: {before} -> {retains()}"


def sim_thread_state(sim):
    """The calling thread's current context and stack depth, and every device's retains, on
    the simulated driver: what a failed driver call must leave as it found it."""
    return {"current": current(), "depth": sim.stack_depth(), "retains": retains()}


def thread_state():
    from cyctx._guard import open_entries

    return {
        "current": current(),
        "stack_depth": SIM.stack_depth() if SIM else None,
        "open_guard_entries": open_entries(),
        "retains": retains(),
    }


def describe():
    return f"cyctx test driver: {KIND}" + (
        f" (simulated, {SIM.device_count} devices, {SIM.path})" if SIM else ""
    )


_cudart = False


def cudart():
    """ctypes handle on libcudart, or None."""
    global _cudart
    if _cudart is False:
        try:
            import ctypes

            from cuda.pathfinder import load_nvidia_dynamic_lib

            _cudart = ctypes.CDLL(load_nvidia_dynamic_lib("cudart").abs_path)
        except Exception:
            _cudart = None
    return _cudart
