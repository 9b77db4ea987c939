"""GPU tasks for thread pools (concurrent.futures, Dask): each task guards its own device.

A pool thread runs tasks one after another and keeps whatever context the last one left
current. A task that relies on "the current context" therefore runs on whichever device the
previous task of that thread used. Each task here names its device and enters that device's
process-wide guard, ``cyctx.device(device)``: the primary context is retained once per
process and stays alive between tasks, the task's driver calls run on the right device, and
on leaving the thread has again what it had before (no context, for a pool thread).

Imported by threadpool_example.py and dask_example.py, and by cyctx's tests.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

import cyctx


def _check(result, what: str):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err!r}")
    return rest[0] if len(rest) == 1 else rest


def device_task(device: int, i: int) -> dict:
    """One task on ``device``: driver work inside the device's shared guard.

    On a GPU: allocate 1 MiB, fill it with ``i``, read it back, and check
    that the driver put it on ``device``. On cyctx's simulated driver (no
    memory): check the current context's device. Returns what the thread
    had current before and after."""
    before = cyctx.current_handle()
    with cyctx.device(device):
        dev = int(_check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))
        if dev != device:
            raise AssertionError(f"task for device {device} ran on device {dev}")
        if not _simulated():
            _memory_roundtrip(device, i)
    after = cyctx.current_handle()
    return {"thread": threading.get_ident(), "device": device, "before": before, "after": after}


def _memory_roundtrip(device: int, i: int) -> None:
    n = 1 << 18  # 32-bit words: 1 MiB
    ptr = _check(driver.cuMemAlloc(4 * n), "cuMemAlloc")
    try:
        _check(driver.cuMemsetD32(ptr, i, n), "cuMemsetD32")
        host = bytearray(4 * n)
        _check(driver.cuMemcpyDtoH(host, ptr, 4 * n), "cuMemcpyDtoH")
        if host != i.to_bytes(4, "little") * n:
            raise AssertionError(f"task {i}: wrong data on device {device}")
        attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        where = int(_check(driver.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute"))
        if where != device:
            raise AssertionError(f"task {i}: memory on device {where}, not {device}")
    finally:
        _check(driver.cuMemFree(ptr), "cuMemFree")


def careless_task(device: int) -> int:
    """What not to do: make a context current and leave it (as ``cudaSetDevice`` or a push
    without a pop does). The next task on this thread finds it current."""
    cyctx.device(device).__enter__()  # entered, never left
    return threading.get_ident()


def thread_state() -> dict:
    """What this thread has: its current context, its open guard entries, and (on the
    simulated driver) each primary context's retain count in this process."""
    from cyctx._guard import open_entries

    sim = _sim()
    return {
        "thread": threading.get_ident(),
        "current": cyctx.current_handle(),
        "open_entries": open_entries(),
        "retains": [sim.retain_count(k) for k in range(sim.device_count)] if sim else None,
    }


def device_count() -> int:
    _check(driver.cuInit(0), "cuInit")
    return int(_check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))


def _sim():
    from cyctx import testing

    return testing.simulated()


def _simulated() -> bool:
    return _sim() is not None
