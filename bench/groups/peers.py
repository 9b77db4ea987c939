"""Peers: other libraries' ways to make device 0's context current and restore the previous
one, each measured from Python in processes of its own (harness.py says why), beside cyctx's
own rows measured again there (control_cases).

A peer is its set-up, registered with `@peer(NAME)` (imports, runtime initialisation, device
objects: untimed; ImportError when the library is not installed), and its rows, registered
with `@case(NAME, ...)`, each on every start path. The bodies are plain functions of the
prepared objects and n, one `for _ in range(n):` around the enter and the exit, as in
from_python.py.
"""

from functools import partial
from types import SimpleNamespace

from . import PATHS, registrar
from .from_python import with_object

PEERS = {}  # name -> set-up(env), in the order run_all.py runs them

RESTORE_NOTES = {
    "cuda_core": "cuda.core has no context manager: d0.set_current(), then the previous device's "
    "set_current() (d0 again on the fast path, d1 from device 1), or "
    "cuda.bindings.driver.cuCtxSetCurrent(NULL) from no context; the previous device "
    "is known to the loop, not looked up (favours cuda.core)",
    "cuda_bindings": "push+pop restores by popping; retain+push+pop+release as a naive guard does it",
}


def peer(name):
    def register(setup):
        PEERS[name] = setup
        return setup

    return register


def case(name, row_id, label):
    return registrar(f"peer:{name}", layer="peer", python=True)(row_id, label, paths=PATHS)


# --- cuda.bindings' driver module, from Python -----------------------------------------------


@peer("cuda_bindings")
def setup_cuda_bindings(env):
    env.dev0 = env.driver.cuDeviceGet(0)[1]
    env.c0 = env.driver.cuDevicePrimaryCtxRetain(env.dev0)[1]  # held until the process ends


def push_pop(driver, ctx, n):
    for _ in range(n):
        driver.cuCtxPushCurrent(ctx)
        driver.cuCtxPopCurrent()


def retain_push_pop_release(driver, dev, n):
    for _ in range(n):
        driver.cuCtxPushCurrent(driver.cuDevicePrimaryCtxRetain(dev)[1])
        driver.cuCtxPopCurrent()
        driver.cuDevicePrimaryCtxRelease(dev)


@case("cuda_bindings", "cuda_bindings.pushpop", "cuda.bindings.driver push+pop, from Python")
def cuda_bindings_pushpop(env, path):
    return partial(push_pop, env.driver, env.c0)


@case(
    "cuda_bindings",
    "cuda_bindings.full",
    "cuda.bindings.driver retain+push+pop+release, from Python",
)
def cuda_bindings_full(env, path):
    return partial(retain_push_pop_release, env.driver, env.dev0)


# --- CuPy --------------------------------------------------------------------------------------


@peer("cupy")
def setup_cupy(env):
    import cupy

    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))
    env.cupy, env.d0 = cupy, cupy.cuda.Device(0)


def cupy_new_device(cupy, n):
    for _ in range(n):
        with cupy.cuda.Device(0):
            pass


@case("cupy", "cupy.device", "cupy: with d0 (a pre-built cupy.cuda.Device(0))")
def cupy_device(env, path):
    return partial(with_object, env.d0)


@case("cupy", "cupy.device_new", "cupy: with cupy.cuda.Device(0) (constructed each time)")
def cupy_device_new(env, path):
    return partial(cupy_new_device, env.cupy)


# --- cuda.core ---------------------------------------------------------------------------------


@peer("cuda_core")
def setup_cuda_core(env):
    try:
        from cuda.core import Device
    except ImportError:  # cuda.core before 1.0
        from cuda.core.experimental import Device

    env.d0 = Device(0)
    env.d0.set_current()
    if env.ndev > 1:
        env.d1 = Device(1)
        env.d1.set_current()


def set_current_then(d0, previous, n):
    for _ in range(n):
        d0.set_current()
        previous.set_current()


def set_current_then_none(d0, driver, null, n):
    for _ in range(n):
        d0.set_current()
        driver.cuCtxSetCurrent(null)


@case(
    "cuda_core", "cuda_core.set_current", "cuda.core: d0.set_current(), then restore the previous"
)
def cuda_core_set_current(env, path):
    # No context manager in cuda.core: restore with the previous device's set_current(), and
    # with cuda.bindings' cuCtxSetCurrent(NULL) where there was no context.
    if path == "from_none":
        return partial(set_current_then_none, env.d0, env.driver, env.null)
    return partial(set_current_then, env.d0, env.d1 if path == "from_other" else env.d0)


# --- torch -------------------------------------------------------------------------------------


@peer("torch")
def setup_torch(env):
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    env.torch, env.td0 = torch, torch.cuda.device(0)


def torch_new_device(torch, n):
    for _ in range(n):
        with torch.cuda.device(0):
            pass


@case("torch", "torch.device", "torch: with torch.cuda.device(0)")
def torch_device(env, path):
    return partial(torch_new_device, env.torch)


@case("torch", "torch.device_prebuilt", "torch: with td0 (a pre-built torch.cuda.device(0))")
def torch_device_prebuilt(env, path):
    return partial(with_object, env.td0)


# --- numba -------------------------------------------------------------------------------------


@peer("numba")
def setup_numba(env):
    from numba import cuda

    len(cuda.gpus)
    env.cuda = cuda


def numba_gpu0(cuda, n):
    for _ in range(n):
        with cuda.gpus[0]:
            pass


@case("numba", "numba.gpus", "numba: with cuda.gpus[0]")
def numba_gpus(env, path):
    return partial(numba_gpu0, env.cuda)


# --- the process -------------------------------------------------------------------------------


def open_peer(bench, name):
    """One peer's process state: its set-up (ImportError when it is not installed), the start
    context of each path (the primary contexts, which the peers use too), and cyctx's guard
    and empty `with` for the control rows."""
    from cuda.bindings import driver as d

    import cyctx

    env = SimpleNamespace(bench=bench, driver=d, null=d.CUcontext(0), info={})
    d.cuInit(0)
    env.ndev = d.cuDeviceGetCount()[1]
    PEERS[name](env)
    # Retained until the process ends.
    ctx = [d.cuDevicePrimaryCtxRetain(d.cuDeviceGet(i)[1])[1] for i in range(min(env.ndev, 2))]
    env.starts = {"fast": int(ctx[0]), "from_none": 0}
    if env.ndev > 1:
        env.starts["from_other"] = int(ctx[1])
    by_int = {int(c): c for c in ctx}
    by_int[0] = env.null

    def set_start(handle):
        (err,) = d.cuCtxSetCurrent(by_int[handle])
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuCtxSetCurrent failed: {err!r}")

    env.set_start, env.current, env.h0 = set_start, cyctx.current_handle, env.starts["fast"]
    set_start(0)
    env.g0, env.empty = cyctx.ContextGuard(0), bench.Empty()
    return env
