// The driver entry points cyctx calls, resolved by cyctx itself with cuGetProcAddress_v2 at
// fixed ABI versions, so that one build works with every cuda-bindings (docs/design.md, "The
// driver, resolved by cyctx"): one table per process, published lock-free on first use.
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>

#include <cuda.h>

namespace cyctx {

struct DriverApi {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxRelease)(CUdevice);
    CUresult (*PrimaryCtxGetState)(CUdevice, unsigned int *, int *);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*CtxGetDevice)(CUdevice *);
    CUresult (*CtxGetId)(CUcontext, unsigned long long *);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*GetErrorString)(CUresult, const char **);
    // Optional: NULL when the driver lacks them (cyctx's simulated driver has no streams).
    CUresult (*StreamGetCtx)(CUstream, CUcontext *);
    CUresult (*CtxFromGreenCtx)(CUcontext *, CUgreenCtx);
};

typedef CUresult (*GetProcAddressFn)(const char *, void **, int, cuuint64_t,
                                     CUdriverProcAddressQueryResult *);

// (name, ABI version, required). The version picks the ABI variant the field's type
// declares: the CUDA version that introduced it (cuCtxPushCurrent 4000 = _v2,
// cuDevicePrimaryCtxRelease 11000 = _v2, cuCtxGetDevice 2000 = the one without a context
// argument; CUDA 13's cuCtxGetDevice_v2 takes one).
struct ProcSpec {
    const char *name;
    int version;
    bool required;
};

static const ProcSpec kProcs[] = {
    {"cuInit", 2000, true},
    {"cuDeviceGetCount", 2000, true},
    {"cuDeviceGet", 2000, true},
    {"cuDevicePrimaryCtxRetain", 7000, true},
    {"cuDevicePrimaryCtxRelease", 11000, true},
    {"cuDevicePrimaryCtxGetState", 7000, true},
    {"cuCtxGetCurrent", 4000, true},
    {"cuCtxSetCurrent", 4000, true},
    {"cuCtxPushCurrent", 4000, true},
    {"cuCtxPopCurrent", 4000, true},
    {"cuCtxGetDevice", 2000, true},
    {"cuCtxGetId", 12000, true},
    {"cuGetErrorName", 6000, true},
    {"cuGetErrorString", 6000, true},
    {"cuStreamGetCtx", 9020, false},
    {"cuCtxFromGreenCtx", 12040, false},
};
static_assert(sizeof(kProcs) / sizeof(kProcs[0]) == sizeof(DriverApi) / sizeof(void *),
              "one ProcSpec per DriverApi field, in order");

inline std::atomic<const DriverApi *> g_api{nullptr};

// The resolved table, or NULL before the first successful driver_load. Lock-free.
inline const DriverApi *driver_api() noexcept { return g_api.load(std::memory_order_acquire); }

// Resolve the table (once per process); CUDA_SUCCESS, or a CUresult with `problem` (n bytes,
// the caller's: no thread-local buffer, so the module's TLS stays the small per-thread stack of
// thread_entries.h) saying why: CUDA_ERROR_NO_DEVICE when no libcuda.so.1 loads,
// CUDA_ERROR_NOT_SUPPORTED when it predates CUDA 12.0, CUDA_ERROR_STUB_LIBRARY when it is the
// toolkit's stub, CUDA_ERROR_NOT_FOUND when a required function is missing. GIL: not needed.
inline CUresult driver_load(const DriverApi **out, char *problem, std::size_t n) noexcept {
    const DriverApi *api = driver_api();
    if (api) {
        *out = api;
        return CUDA_SUCCESS;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        const char *why = dlerror();
        std::snprintf(problem, n, "dlopen(\"libcuda.so.1\") failed: %s",
                      why ? why : "unknown reason");
        return CUDA_ERROR_NO_DEVICE;
    }
    // cuGetProcAddress_v2 (with the status argument) exists in drivers of CUDA 12.0+.
    GetProcAddressFn get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(lib, "cuGetProcAddress_v2"));
    if (!get_proc) {
        std::snprintf(problem, n,
                      "the loaded libcuda.so.1 has no cuGetProcAddress_v2: its driver is older "
                      "than CUDA 12.0, which cyctx needs");
        dlclose(lib);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    DriverApi *fresh = static_cast<DriverApi *>(std::calloc(1, sizeof(DriverApi)));
    if (!fresh) {
        std::snprintf(problem, n, "out of memory");
        dlclose(lib);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void **slots = reinterpret_cast<void **>(fresh);
    for (std::size_t i = 0; i < sizeof(kProcs) / sizeof(kProcs[0]); i++) {
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
        void *p = nullptr;
        CUresult err = get_proc(kProcs[i].name, &p, kProcs[i].version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        if (err == CUDA_ERROR_STUB_LIBRARY) {
            // The toolkit's stub libcuda.so.1 (lib64/stubs) was found instead of the driver.
            std::snprintf(problem, n,
                          "the libcuda.so.1 that loaded is the CUDA toolkit's stub, not the NVIDIA driver");
            std::free(fresh);
            dlclose(lib);
            return CUDA_ERROR_STUB_LIBRARY;
        }
        if (err != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) p = nullptr;
        if (!p && kProcs[i].required) {
            std::snprintf(problem, n,
                          "the loaded libcuda.so.1 does not provide %s (ABI of CUDA %d.%d): "
                          "cuGetProcAddress returned %d, status %d",
                          kProcs[i].name, kProcs[i].version / 1000, (kProcs[i].version % 1000) / 10,
                          (int)err, (int)status);
            std::free(fresh);
            dlclose(lib);
            return CUDA_ERROR_NOT_FOUND;
        }
        slots[i] = p;
    }
    // The library stays loaded for the life of the process (the table points into it).
    const DriverApi *expected = nullptr;
    if (!g_api.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        std::free(fresh);  // another thread published first; same pointers
        dlclose(lib);
        *out = expected;
        return CUDA_SUCCESS;
    }
    *out = fresh;
    return CUDA_SUCCESS;
}

}  // namespace cyctx
