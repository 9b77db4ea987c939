"""Example: a kernel compiled at run time with NVRTC, loaded on every device inside a cyctx
guard, and launched from many threads without the GIL, each on its own stream."""

from __future__ import annotations

import threading

import cyctx
from cyctx_kernels._launch import MODES, DeviceKernel, launch_on, run_worker

__all__ = [
    "KERNEL_SOURCE",
    "MODES",
    "DeviceKernel",
    "compile_kernel",
    "launch_on",
    "load",
    "run_threads",
    "run_worker",
]

KERNEL_SOURCE = b"""
extern "C" __global__ void add(float* x, int n, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
"""


def compile_kernel(arch: str = "sm_90") -> bytes:
    """The kernel as a CUBIN for ``arch``, compiled by NVRTC (the nvidia-cuda-nvrtc wheel)."""
    from cuda.bindings import nvrtc

    def ok(result):
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC failed: {err!r}")
        return rest[0] if len(rest) == 1 else rest

    prog = ok(nvrtc.nvrtcCreateProgram(KERNEL_SOURCE, b"add.cu", 0, [], []))
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={arch}".encode()])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(
                f"NVRTC could not compile the kernel: {log.decode(errors='replace')}"
            )
        size = ok(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        ok((nvrtc.nvrtcGetCUBIN(prog, cubin)[0], None))
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def load(devices: list[int]) -> list[DeviceKernel]:
    """One DeviceKernel per device, each with a long-lived guard (ContextGuard.shared), for the
    architecture of that device."""
    from cuda.bindings import driver as d

    kernels = []
    for dev in devices:
        guard = cyctx.ContextGuard.shared(dev)
        with guard:  # its first use retains the primary context (and initialises the driver)
            err, major = d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
            )
            err2, minor = d.cuDeviceGetAttribute(
                d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
            )
        if err != d.CUresult.CUDA_SUCCESS or err2 != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cannot read the compute capability of device {dev}")
        kernels.append(DeviceKernel(guard, compile_kernel(f"sm_{major}{minor}"), b"add"))
    return kernels


def run_threads(
    kernels: list[DeviceKernel],
    threads: int,
    launches: int,
    n: int = 4096,
    mode: str = "guard_per_launch",
    check: bool = True,
) -> dict:
    """``threads`` Python threads, spread round-robin over ``kernels`` (one per device), each
    running run_worker without the GIL on its own stream. Returns the wrong elements per
    thread, the aggregate launches per second, and the wall time."""
    results: list = [None] * threads
    start = threading.Barrier(threads + 1)

    def body(i):
        start.wait()
        results[i] = run_worker(kernels[i % len(kernels)], n, launches, mode, check)

    ts = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    for t in ts:
        t.join()
    wrong = [r[0] for r in results]
    # Each thread timed its own launch loop; the slowest one bounds the aggregate rate.
    slowest = max(r[1] for r in results)
    return {
        "wrong": wrong,
        "launches_per_s": threads * launches / (slowest / 1e9),
        "ns_per_launch_per_thread": [r[1] / launches for r in results],
    }
