# The driver entry points cyctx calls, resolved by cyctx at fixed ABI versions (_cpp/driver.h
# says why: one build works with every cuda-bindings major). Declarations only: there is
# no _driver module. Types come from cuda.bindings' cydriver.
from cuda.bindings cimport cydriver

cdef extern from "_cpp/driver.h" namespace "cyctx" nogil:
    ctypedef struct DriverApi:
        cydriver.CUresult (*Init)(unsigned int) noexcept nogil
        cydriver.CUresult (*DeviceGetCount)(int*) noexcept nogil
        cydriver.CUresult (*DeviceGet)(cydriver.CUdevice*, int) noexcept nogil
        cydriver.CUresult (*PrimaryCtxRetain)(cydriver.CUcontext*, cydriver.CUdevice) noexcept nogil
        cydriver.CUresult (*PrimaryCtxRelease)(cydriver.CUdevice) noexcept nogil
        cydriver.CUresult (*PrimaryCtxGetState)(cydriver.CUdevice, unsigned int*, int*) noexcept nogil
        cydriver.CUresult (*CtxGetCurrent)(cydriver.CUcontext*) noexcept nogil
        cydriver.CUresult (*CtxSetCurrent)(cydriver.CUcontext) noexcept nogil
        cydriver.CUresult (*CtxPushCurrent)(cydriver.CUcontext) noexcept nogil
        cydriver.CUresult (*CtxPopCurrent)(cydriver.CUcontext*) noexcept nogil
        cydriver.CUresult (*CtxGetDevice)(cydriver.CUdevice*) noexcept nogil
        cydriver.CUresult (*CtxGetId)(cydriver.CUcontext, unsigned long long*) noexcept nogil
        cydriver.CUresult (*GetErrorName)(cydriver.CUresult, const char**) noexcept nogil
        cydriver.CUresult (*GetErrorString)(cydriver.CUresult, const char**) noexcept nogil
        cydriver.CUresult (*StreamGetCtx)(cydriver.CUstream, cydriver.CUcontext*) noexcept nogil
        cydriver.CUresult (*CtxFromGreenCtx)(cydriver.CUcontext*, cydriver.CUgreenCtx) noexcept nogil

    # The table, or NULL before the first successful driver_load. Lock-free. GIL: not needed.
    const DriverApi* driver_api() noexcept nogil
    # Load libcuda.so.1 and resolve the table once; CUDA_SUCCESS or the reason as a CUresult,
    # and the reason in words in problem[0:n] (the caller's buffer). GIL: not needed.
    cydriver.CUresult driver_load(const DriverApi** out, char* problem, size_t n) noexcept nogil
