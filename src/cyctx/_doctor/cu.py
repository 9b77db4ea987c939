"""Calling cuda.bindings' driver API: :func:`call`, :func:`error_name`, :func:`cstr` and the
``CUresult`` codes the doctor reasons about, by name.

A leaf: it imports nothing of cyctx, so every module of the doctor can use it. Importing
cuda.bindings.driver loads no driver, its first call does, so ``python -m cyctx doctor
--simulate`` still loads the simulated one first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuda.bindings import driver

__all__ = [
    "CONTEXT_IS_DESTROYED",
    "INVALID_CONTEXT",
    "NOT_FOUND",
    "NOT_INITIALIZED",
    "NOT_SUPPORTED",
    "NO_DEVICE",
    "STUB_LIBRARY",
    "call",
    "cstr",
    "driver",
    "error_name",
]

# The CUresult values the doctor reasons about, by name; plain ints, as call() returns codes.
NOT_INITIALIZED = int(driver.CUresult.CUDA_ERROR_NOT_INITIALIZED)
NO_DEVICE = int(driver.CUresult.CUDA_ERROR_NO_DEVICE)
INVALID_CONTEXT = int(driver.CUresult.CUDA_ERROR_INVALID_CONTEXT)
CONTEXT_IS_DESTROYED = int(driver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED)
# What cyctx's driver loader answers for a library it cannot use (_cpp/driver.h, driver_load).
STUB_LIBRARY = int(driver.CUresult.CUDA_ERROR_STUB_LIBRARY)
NOT_SUPPORTED = int(driver.CUresult.CUDA_ERROR_NOT_SUPPORTED)
NOT_FOUND = int(driver.CUresult.CUDA_ERROR_NOT_FOUND)


def call(fn: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    """Call a cuda.bindings function: (code as int, value or tuple of values or None)."""
    res = fn(*args)
    if not isinstance(res, tuple):
        res = (res,)
    err, *vals = res
    return int(err), (vals[0] if len(vals) == 1 else tuple(vals) if vals else None)


def error_name(code: int) -> str:
    """``CUDA_ERROR_INVALID_CONTEXT (201)`` for 201; no driver call."""
    try:
        return f"{driver.CUresult(code).name} ({code})"
    except Exception:  # a code this cuda-bindings does not know
        return f"CUresult {code}"


def cstr(b: bytes) -> str:
    """A C string from a fixed-size buffer (cuDeviceGetName, cuDeviceGetPCIBusId)."""
    return b.split(b"\0", 1)[0].decode(errors="replace").strip()
