/*
 * simdriver.c -- cyctx's simulated CUDA driver, a stand-in for NVIDIA's libcuda.so.1.
 *
 * Built as a shared library with soname libcuda.so.1 and loaded (RTLD_GLOBAL) before
 * cuda.bindings first touches the driver, it is the driver that cuda.bindings uses:
 * cuda.bindings dlopens libcuda.so.1 (an already loaded library with that soname wins),
 * dlsyms cuDriverGetVersion and cuGetProcAddress_v2, and resolves every other function
 * through cuGetProcAddress_v2(name, &pfn, abiVersion, ...). So the only exported
 * symbols are cuInit, cuDriverGetVersion, cuGetProcAddress (v1 ABI),
 * cuGetProcAddress_v2 and the cyctxsim_* control API (simdriver.h); everything else is
 * static and reached through the proc table at the end of this file.
 *
 * What is modelled, and where each rule comes from. A quoted heading = that section of
 * docs/evidence.md, which quotes the probe output; "H200" = checked on an H200 with driver 580.159 (CUDA 13.0) by running one C probe
 * against that driver and this library and comparing every answer; "record" =
 * tests/sim/differential/real_h200.json; "doc" = the function's comment in cuda.h.
 *   - cuInit, devices and their attributes (the H200's values for all 147);
 *   - one primary context per device: a handle that never changes, a reference
 *     count, active/inactive, and a context id from one process-wide counter that
 *     every activation and every cuCtxCreate advances, starting at 1 ("Context
 *     ids come from one process-wide counter": retain -> id 1, reset + re-retain -> id 2, release to 0 + retain -> 3, then
 *     device 1 -> 4); its flags go back to 0 when it is deactivated (H200, record);
 *   - contexts made by cuCtxCreate and destroyed by cuCtxDestroy;
 *   - the per-thread context stack (thread-local, no lock);
 *   - "dead" contexts, which stay valid handles: an inactive primary (after the last
 *     release or a reset) and a destroyed created context; both answer alike (H200,
 *     see sim_resolve);
 *   - fork: in a child of a process that had initialised the driver, every call
 *     returns CUDA_ERROR_NOT_INITIALIZED except cuDriverGetVersion, cuGetProcAddress
 *     and cuGetError* ("A forked child gets CUDA_ERROR_NOT_INITIALIZED from
 *     every call"; H200);
 *   - cuGetErrorName / cuGetErrorString: the H200's 101 codes and texts, verbatim;
 *   - cuGetProcAddress: the H200's answers (see proc_lookup);
 *   - each thread's stream-capture mode (cuThreadExchangeStreamCaptureMode), without
 *     captures;
 *   - a CUDA 12+ runtime's cudaSetDevice and cudaDeviceReset, which make their driver calls
 *     through the traced entry points (see "The runtime's context calls");
 *   - off unless asked (cyctxsim_reuse_handles): a destroyed created context's handle given
 *     to the next one, which the H200 never did.
 * Not modelled: memory, streams, captures, modules, events, limits. A function the simulator
 * does not implement is not found through cuGetProcAddress, so a caller learns at once.
 *
 * Where the simulator departs from the H200 on purpose:
 *   - device name "cyctx simulated GPU", a distinct PCI bus (0x18 + ordinal) and UUID
 *     per device;
 *   - where the real driver crashed (segfault) the simulator returns an error:
 *     a handle it never made -> CUDA_ERROR_INVALID_CONTEXT; NULL out-pointers to
 *     cuGetErrorName/String and cuGetProcAddress, and cuDeviceGetName with len 0 ->
 *     CUDA_ERROR_INVALID_VALUE; cuCtxSetFlags on a dead context -> 709.
 * Still guesses (nothing showed them): which of several bad arguments is reported
 * first where the H200 was not asked; cuCtxSetFlags with CU_CTX_MAP_HOST refused like
 * cuDevicePrimaryCtxSetFlags; flags set while the primary is inactive survive a later
 * release that finds it already inactive; cuThreadExchangeStreamCaptureMode refusing a
 * mode outside 0..2 and a NULL pointer with CUDA_ERROR_INVALID_VALUE (doc names the code, the
 * H200 was not asked); a created context destroyed while current on
 * another thread only is kept as a record (709 on a second destroy), as one current on
 * the destroying thread is (H200).
 *
 * Compiles as C11 against cuda.h of CUDA 12.0 ... 13.x; it takes only types from the
 * header and uses numbers for everything newer than 12.0.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Default visibility for the four driver entry points that cuda.h declares and this
 * file defines (the build uses -fvisibility=hidden; everything static stays local). */
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop
#include "simdriver.h"
#include "cupti_hook.h"

/* cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the library must also export
 * the plain name with the v1 ABI (4 arguments), as the real libcuda does. */
#undef cuGetProcAddress

#define SIM_EXPORT __attribute__((visibility("default")))
/* What driver 580.159 reports, to cuDriverGetVersion and to cuCtxGetApiVersion on every
 * context ("Driver 580.159 reports CUDA 13000 and API version 3020"). */
#define SIM_DRIVER_VERSION 13000
#define SIM_API_VERSION 3020
#define SIM_MAX_DEVICES 64
#define SIM_ATTRIBUTE_END 148      /* CU_DEVICE_ATTRIBUTE_MAX of CUDA 13.0; the H200 refused 148+ */
#define SIM_CTX_FLAGS_VALID 0xFFu  /* CU_CTX_FLAGS_MASK of CUDA 13 (12.0 had 0x1F) */
#define SIM_CTX_SCHED_MASK 0x07u
#define SIM_CTX_MAP_HOST 0x08u
#define SIM_CTX_COREDUMP_BITS 0x60u  /* CU_CTX_COREDUMP_ENABLE | CU_CTX_USER_COREDUMP_ENABLE */
#define SIM_PRIMARY_FLAGS_VALID (SIM_CTX_FLAGS_VALID & ~SIM_CTX_MAP_HOST)

/* ------------------------------------------------------------------------------
 * Function table: every driver function implemented, by base name. The index is
 * what calls are counted and faults are matched by. (The X-macro argument is only
 * ever pasted or stringised, so cuda.h's renaming macros, e.g. cuCtxCreate ->
 * cuCtxCreate_v4, do not apply to it.)
 * ------------------------------------------------------------------------------ */
#define SIM_FUNCS(X)                                                                 \
    X(cuInit) X(cuDriverGetVersion) X(cuGetProcAddress) X(cuGetErrorName)            \
    X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)        \
    X(cuDeviceGetUuid) X(cuDeviceTotalMem) X(cuDeviceGetAttribute)                   \
    X(cuDeviceComputeCapability) X(cuDeviceGetPCIBusId) X(cuDeviceGetByPCIBusId)     \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                         \
    X(cuDevicePrimaryCtxSetFlags) X(cuDevicePrimaryCtxGetState)                      \
    X(cuDevicePrimaryCtxReset) X(cuCtxCreate) X(cuCtxDestroy) X(cuCtxPushCurrent)    \
    X(cuCtxPopCurrent) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice)       \
    X(cuCtxGetFlags) X(cuCtxSetFlags) X(cuCtxGetId) X(cuCtxSynchronize)              \
    X(cuCtxGetApiVersion) X(cuCtxGetStreamPriorityRange)                           \
    X(cuThreadExchangeStreamCaptureMode)

enum {
#define SIM_ENUM(n) F_##n,
    SIM_FUNCS(SIM_ENUM)
#undef SIM_ENUM
    F_COUNT
};

static const char *const g_fn_names[F_COUNT] = {
#define SIM_NAME(n) #n,
    SIM_FUNCS(SIM_NAME)
#undef SIM_NAME
};

static int fn_index(const char *name) {
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(g_fn_names[i], name) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------------------------
 * Global state. g_lock guards every mutation of devices and contexts; fields that
 * threads read without it are atomics. The context stack is thread-local.
 * ------------------------------------------------------------------------------ */
enum { ST_UNINIT, ST_READY, ST_FORKED };
enum { KIND_NONE, KIND_PRIMARY, KIND_CREATED };

typedef struct SimCtx {
    _Atomic int kind;                  /* KIND_NONE: a slot no handle points to yet */
    _Atomic int device;                /* set before kind is published; a reused handle's
                                          new context sets it again (g_reusable) */
    _Atomic int live;                  /* primary: active; created: not destroyed */
    _Atomic unsigned long long id;     /* cuCtxGetId; a primary gets a new one per activation */
    _Atomic unsigned int flags;        /* the context's flags (cuCtxGetFlags/SetFlags) */
    _Atomic unsigned int pflags;       /* primary: the device's flags for it
                                          (cuDevicePrimaryCtxSetFlags/GetState) */
    _Atomic int on_stacks;             /* entries on all threads' stacks */
    _Atomic int zombie;                /* created: destroyed while some thread had it */
} SimCtx;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_state = ST_UNINIT;
static _Atomic int g_ndev;                     /* fixed by the first successful cuInit */
static int g_configured;                       /* cyctxsim_configure(); 0 = use env */
static unsigned long long g_next_id = 1;       /* the first context has id 1 ("Context ids ...") */
static SimCtx g_prim[SIM_MAX_DEVICES];         /* primary handles = &g_prim[dev], forever */
static int g_refcount[SIM_MAX_DEVICES];

/* Created contexts are never freed, so a stale handle can always be recognised; they
 * live in chunks that are only ever appended (readers scan them without the lock). */
#define SIM_CHUNK 4096
#define SIM_MAX_CHUNKS 1024
static SimCtx *_Atomic g_chunks[SIM_MAX_CHUNKS];
static _Atomic int g_nchunks;
static int g_chunk_used;                       /* slots taken in the last chunk */
static _Atomic int g_live_created;
/* Handle reuse, off unless asked (cyctxsim_reuse_handles): the H200 gave no destroyed
 * context's handle value to a new one in 64 tries ("A destroyed context answers 709 to
 * cuCtxGetId"), other reports say drivers do. On, the next cuCtxCreate takes the handle of the
 * created context destroyed last, as a driver that frees its record and allocates the next
 * one there would; not while some thread still has it on its stack (the driver keeps a
 * destroyed context's record for those threads). Under g_lock. */
static int g_reuse;
static SimCtx *g_reusable;

static _Atomic long long g_calls[F_COUNT];

/* ------------------------------------------------------------------------------
 * Fault injection (cyctxsim_inject_fault). Checked at the very start of every call,
 * before the initialisation check: a fault models a failure at the API boundary, so
 * it wins over CUDA_ERROR_NOT_INITIALIZED. A call with no fault pending costs one
 * atomic load.
 * ------------------------------------------------------------------------------ */
#define SIM_MAX_FAULTS 64
typedef struct { int fn, skip, left, code; } SimFault;
static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;
static SimFault g_faults[SIM_MAX_FAULTS];
static int g_nfault_slots;
static _Atomic int g_nfaults;

/* Every pending fault on `fn` counts this call; the oldest one whose window it is
 * gives the code. Returns CUDA_SUCCESS when no fault fires. */
static CUresult fault_take(int fn) {
    CUresult code = CUDA_SUCCESS;
    pthread_mutex_lock(&g_fault_lock);
    for (int i = 0; i < g_nfault_slots;) {
        SimFault *f = &g_faults[i];
        if (f->fn == fn) {
            if (f->skip > 0) {
                f->skip--;
            } else {
                if (code == CUDA_SUCCESS) code = (CUresult)f->code;
                if (--f->left == 0) {
                    memmove(f, f + 1, (size_t)(g_nfault_slots - i - 1) * sizeof *f);
                    g_nfault_slots--;
                    atomic_fetch_sub(&g_nfaults, 1);
                    continue;
                }
            }
        }
        i++;
    }
    pthread_mutex_unlock(&g_fault_lock);
    return code;
}

/* ------------------------------------------------------------------------------
 * Stalls (cyctxsim_stall): the nth next call of one function waits, counted but before
 * it does anything, until cyctxsim_unstall(). A test holds a thread inside a driver call
 * that way (inside a guard's re-activation, without the GIL) and races it from another
 * thread. A call with no stall armed costs one atomic load. A stall at return
 * (cyctxsim_stall_at_return) lets a traced call do its work and holds it as it returns,
 * before its exit is reported to a CUPTI subscriber: what a driver call that is slow to
 * return after its effect (a destroy, long after "destroy starting") lets other threads do.
 * ------------------------------------------------------------------------------ */
static pthread_mutex_t g_stall_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_stall_cv = PTHREAD_COND_INITIALIZER;
static _Atomic int g_stall_fn = -1;            /* the armed function, or -1 */
static int g_stall_at_return;                  /* held as it returns, not as it starts */
static int g_stall_skip;                       /* calls still let through first */
static int g_stall_waiting;                    /* threads held now */
static unsigned g_stall_gen;                   /* bumped by cyctxsim_unstall */

static void stall_take(int fn, int at_return) {
    pthread_mutex_lock(&g_stall_lock);
    if (atomic_load(&g_stall_fn) == fn && g_stall_at_return == at_return) {
        if (g_stall_skip > 0) {
            g_stall_skip--;
        } else {
            atomic_store(&g_stall_fn, -1);     /* one call only */
            unsigned gen = g_stall_gen;
            g_stall_waiting++;
            while (gen == g_stall_gen) pthread_cond_wait(&g_stall_cv, &g_stall_lock);
            g_stall_waiting--;
        }
    }
    pthread_mutex_unlock(&g_stall_lock);
}

/* Entry of every driver function: count, inject, and (need_init) refuse before a
 * successful cuInit or in a forked child ("A forked child gets CUDA_ERROR_NOT_INITIALIZED from every call"). */
static inline CUresult sim_enter(int fn, int need_init) {
    atomic_fetch_add_explicit(&g_calls[fn], 1, memory_order_relaxed);
    if (atomic_load_explicit(&g_stall_fn, memory_order_acquire) == fn) stall_take(fn, 0);
    if (atomic_load_explicit(&g_nfaults, memory_order_acquire) > 0) {
        CUresult f = fault_take(fn);
        if (f != CUDA_SUCCESS) return f;
    }
    if (need_init && atomic_load_explicit(&g_state, memory_order_acquire) != ST_READY)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

#define ENTER(fn)                                                                    \
    do {                                                                             \
        CUresult enter_r_ = sim_enter((fn), 1);                                      \
        if (enter_r_ != CUDA_SUCCESS) return enter_r_;                               \
    } while (0)
#define ENTER_NOINIT(fn)                                                             \
    do {                                                                             \
        CUresult enter_r_ = sim_enter((fn), 0);                                      \
        if (enter_r_ != CUDA_SUCCESS) return enter_r_;                               \
    } while (0)

/* ------------------------------------------------------------------------------
 * Handles and the per-thread stack
 * ------------------------------------------------------------------------------ */
static int in_block(uintptr_t p, const SimCtx *base, size_t n) {
    uintptr_t off = p - (uintptr_t)base;   /* wraps to huge when p < base */
    return off < n * sizeof(SimCtx) && off % sizeof(SimCtx) == 0;
}

/* The SimCtx behind a handle, or NULL for anything the simulator did not hand out
 * (never dereferences a foreign pointer). */
static SimCtx *sim_lookup(CUcontext h) {
    uintptr_t p = (uintptr_t)h;
    SimCtx *c = NULL;
    if (in_block(p, g_prim, SIM_MAX_DEVICES)) {
        c = (SimCtx *)h;
    } else {
        int n = atomic_load_explicit(&g_nchunks, memory_order_acquire);
        for (int i = 0; i < n && !c; i++)
            if (in_block(p, atomic_load_explicit(&g_chunks[i], memory_order_relaxed), SIM_CHUNK))
                c = (SimCtx *)h;
    }
    if (c && atomic_load_explicit(&c->kind, memory_order_acquire) == KIND_NONE) c = NULL;
    return c;
}

static int is_live(SimCtx *c) { return atomic_load_explicit(&c->live, memory_order_acquire); }
static int is_primary(SimCtx *c) { return atomic_load_explicit(&c->kind, memory_order_relaxed) == KIND_PRIMARY; }

typedef struct { SimCtx **v; int n, cap; } SimStack;
static _Thread_local SimStack t_stack;
static pthread_key_t g_stack_key;   /* its destructor frees a thread's stack at exit */

static void stack_free(void *v) {
    if (t_stack.v == v) {
        for (int i = 0; i < t_stack.n; i++) atomic_fetch_sub(&t_stack.v[i]->on_stacks, 1);
        t_stack.v = NULL;
        t_stack.n = t_stack.cap = 0;
    }
    free(v);
}

static CUresult stack_push(SimCtx *c) {
    SimStack *s = &t_stack;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        SimCtx **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
        s->v = v;
        s->cap = cap;
        pthread_setspecific(g_stack_key, v);
    }
    s->v[s->n++] = c;
    atomic_fetch_add_explicit(&c->on_stacks, 1, memory_order_relaxed);
    return CUDA_SUCCESS;
}

static SimCtx *stack_pop(void) {   /* the stack is not empty */
    SimCtx *c = t_stack.v[--t_stack.n];
    atomic_fetch_sub_explicit(&c->on_stacks, 1, memory_order_relaxed);
    return c;
}

static SimCtx *stack_top(void) { return t_stack.n ? t_stack.v[t_stack.n - 1] : NULL; }

/* The context a call works on: `ctx`, or the calling thread's current one if NULL;
 * no such context (or a handle the simulator never made) -> CUDA_ERROR_INVALID_CONTEXT.
 * A dead context -- an inactive primary, or a created context after cuCtxDestroy --
 * stays a valid handle and gives `dead_code` (0: the call works on it anyway). What
 * the H200 answered, the same for both kinds: cuCtxGetDevice*, cuCtxGetFlags,
 * cuCtxPushCurrent, cuCtxSetCurrent work ("A reset leaves a dead handle current", "A dead
 * context can be pushed and popped"); cuCtxGetId, cuCtxSynchronize*,
 * cuCtxGetStreamPriorityRange give 709; cuCtxGetApiVersion gives 709 through the current
 * context and 201 when passed ("A dead context answers 201 through its handle and 709
 * through NULL"). */
static CUresult sim_resolve(CUcontext ctx, SimCtx **out, CUresult dead_code) {
    SimCtx *c = ctx ? sim_lookup(ctx) : stack_top();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!is_live(c) && dead_code != CUDA_SUCCESS) return dead_code;
    *out = c;
    return CUDA_SUCCESS;
}

static int dev_ok(CUdevice d) {
    return d >= 0 && d < atomic_load_explicit(&g_ndev, memory_order_relaxed);
}

/* The CU_CTX_* bits (0xFF) with "only one of the scheduling flags" (doc: 0, SPIN 1,
 * YIELD 2, BLOCKING_SYNC 4); the H200 refused 3, 5, 6, 7 and bits above 0xFF.
 * cuCtxCreate takes CU_CTX_MAP_HOST; cuDevicePrimaryCtxSetFlags refuses it (H200). */
static int flags_ok(unsigned int flags, unsigned int valid) {
    unsigned int sched = flags & SIM_CTX_SCHED_MASK;
    return (flags & ~valid) == 0 && (sched & (sched - 1)) == 0;
}

/* ------------------------------------------------------------------------------
 * Initialisation, version, errors
 * ------------------------------------------------------------------------------ */

/* CYCTX_SIM_DEVICES: unset or empty -> 1; an integer 0..64 -> that many (0 models a
 * machine without GPUs); anything else -> 0. */
static int env_device_count(void) {
    const char *s = getenv("CYCTX_SIM_DEVICES");
    if (!s || !*s) return 1;
    char *end;
    long n = strtol(s, &end, 10);
    return (*end == '\0' && n >= 0 && n <= SIM_MAX_DEVICES) ? (int)n : 0;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
    ENTER_NOINIT(F_cuInit);
    int st = atomic_load(&g_state);
    if (st == ST_FORKED) return CUDA_ERROR_NOT_INITIALIZED;   /* "A forked child gets ..." */
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;            /* doc: Flags must be 0 */
    if (st == ST_READY) return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_state) == ST_UNINIT) {
        int n = g_configured ? g_configured : env_device_count();
        if (n <= 0) {
            r = CUDA_ERROR_NO_DEVICE;   /* what cuInit says on a machine with no GPU */
        } else {
            for (int d = 0; d < n; d++) {
                g_prim[d].device = d;
                atomic_store_explicit(&g_prim[d].kind, KIND_PRIMARY, memory_order_release);
            }
            atomic_store(&g_ndev, n);
            atomic_store_explicit(&g_state, ST_READY, memory_order_release);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
    ENTER_NOINIT(F_cuDriverGetVersion);
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* The codes and texts of driver 580.159 (CUDA 13.0) on an H200, read back with
 * cuGetErrorName/cuGetErrorString for every code 0..1000: these 101. Codes that newer
 * headers add (47, 227, 917-919) are unknown to it: CUDA_ERROR_INVALID_VALUE. */
static const struct { int code; const char *name, *text; } g_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {5, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled while using external profiling tool"},
    {6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized: call cudaProfilerInitialize()"},
    {7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "API call is not supported in the installed CUDA driver"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {205, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {207, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {210, "CUDA_ERROR_ALREADY_ACQUIRED", "resource already acquired"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "resource not mapped as array"},
    {213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "resource not mapped as pointer"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "limit is not supported on this architecture"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "exclusive-thread device already in use by a different thread"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid OpenGL or DirectX context"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error detected during the execution"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation was disabled"},
    {224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the provided execution affinity is not supported"},
    {225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "the provided PTX contains unsupported call to cudaDeviceSynchronize"},
    {226, "CUDA_ERROR_CONTAINED", "Invalid access of peer GPU memory over nvlink or a hardware error"},
    {300, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object initialization failed"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {402, "CUDA_ERROR_LOSSY_QUERY", "attempted introspection would be semantically lossy"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch uses incompatible texturing mode"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {710, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {711, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "operation not supported on global/shared address space"},
    {718, "CUDA_ERROR_INVALID_PC", "invalid program counter"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory not completely freed"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED", "MPS client failed to connect to the MPS control daemon or the MPS server"},
    {806, "CUDA_ERROR_MPS_RPC_FAILURE", "the remote procedural call between the MPS server and the MPS client failed"},
    {807, "CUDA_ERROR_MPS_SERVER_NOT_READY", "MPS server is not ready to accept new MPS client requests"},
    {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "the hardware resources required to create MPS client have been exhausted"},
    {809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "the hardware resources required to support device connections have been exhausted"},
    {810, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "the MPS client has been terminated by the server"},
    {811, "CUDA_ERROR_CDP_NOT_SUPPORTED", "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not support it"},
    {812, "CUDA_ERROR_CDP_VERSION_MISMATCH", "unsupported interaction between different versions of CUDA Dynamic Parallelism"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {909, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE", "an async error has occured in external entity outside of CUDA"},
    {912, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "a kernel launch error has occurred due to cluster misconfiguration"},
    {913, "CUDA_ERROR_FUNCTION_NOT_LOADED", "the function handle is not loaded when calling an API that requires a loaded function"},
    {914, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "one or more resources passed in are not valid resource types for the operation"},
    {915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "one or more resources are insufficient or non-applicable for the operation"},
    {916, "CUDA_ERROR_KEY_ROTATION", "an error happened during the key rotation sequence"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int error_index(CUresult e) {
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == (int)e) return (int)i;
    return -1;
}

/* doc: an unrecognised error sets *pStr to NULL and returns CUDA_ERROR_INVALID_VALUE. */
static CUresult sim_get_error_name(CUresult error, const char **pStr) {
    ENTER_NOINIT(F_cuGetErrorName);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    int i = error_index(error);
    *pStr = i < 0 ? NULL : g_errors[i].name;
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult sim_get_error_string(CUresult error, const char **pStr) {
    ENTER_NOINIT(F_cuGetErrorString);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    int i = error_index(error);
    *pStr = i < 0 ? NULL : g_errors[i].text;
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------
 * Devices: an H200-like device per ordinal
 * ------------------------------------------------------------------------------ */
static int pci_bus(int dev) { return 0x18 + dev; }

static CUresult sim_device_get(CUdevice *device, int ordinal) {
    ENTER(F_cuDeviceGet);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static CUresult sim_device_get_count(int *count) {
    ENTER(F_cuDeviceGetCount);
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = atomic_load(&g_ndev);
    return CUDA_SUCCESS;
}

static CUresult sim_device_get_name(char *name, int len, CUdevice dev) {
    ENTER(F_cuDeviceGetName);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", "cyctx simulated GPU");
    return CUDA_SUCCESS;
}

/* Both ABIs (9020 and 11040) share this signature. "cyctxsim" + ordinal: distinct. */
static CUresult sim_device_get_uuid(CUuuid *uuid, CUdevice dev) {
    ENTER(F_cuDeviceGetUuid);
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    static const char prefix[8] = {'c', 'y', 'c', 't', 'x', 's', 'i', 'm'};
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    memcpy(uuid->bytes, prefix, sizeof prefix);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

static CUresult sim_device_total_mem_v2(size_t *bytes, CUdevice dev) {
    ENTER(F_cuDeviceTotalMem);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)150109880320ull;   /* what the H200 reported */
    return CUDA_SUCCESS;
}

/* cuDeviceGetAttribute of an H200 under driver 580.159, attributes 1..147 in order,
 * as read on the GPU machine; PCI_BUS_ID (33) is made distinct per device below. */
static const int g_h200_attributes[SIM_ATTRIBUTE_END - 1] = {
    1024, 1024, 1024, 64, 2147483647, 65535, 65535, 49152,  /* 1.. */
    65536, 32, 2147483647, 65536, 1980000, 512, 1, 132,  /* 9.. */
    0, 0, 1, 0, 131072, 131072, 65536, 16384,  /* 17.. */
    16384, 16384, 32768, 32768, 2048, 512, 1, 1,  /* 25.. */
    0, 6, 0, 3201000, 6016, 62914560, 2048, 3,  /* 33.. */
    1, 32768, 2048, 1, 32768, 32768, 8192, 8192,  /* 41.. */
    32768, 0, 32, 32768, 32768, 2046, 32768, 131072,  /* 49.. */
    65536, 16384, 16384, 16384, 32768, 2048, 32768, 32768,  /* 57.. */
    2048, 32768, 32768, 2046, 268435456, 131072, 65000, 2097120,  /* 65.. */
    32768, 32768, 9, 0, 32768, 1, 1, 1,  /* 73.. */
    233472, 65536, 1, 0, 0, 0, 2, 0,  /* 81.. */
    1, 1, 1, 0, 0, 0, 1, 1,  /* 89.. */
    232448, 0, 1, 0, 0, 1, 1, 0,  /* 97.. */
    0, 32, 1, 39321600, 134217728, 1, 1024, 1,  /* 105.. */
    1, 1, 1, 1, 1, 100, 9, 1,  /* 113.. */
    1, 1, 1, 1, 1, 4, 1, 1,  /* 121.. */
    1, 0, -1, 1, 0, 0, 0, 0,  /* 129.. */
    0, 0, 590680286, 415174878, 1, 1, 0, 1,  /* 137.. */
    1, 0, 0,  /* 145.. */
};

static int attribute_value(int attr, int dev) {
    return attr == 33 ? pci_bus(dev) : g_h200_attributes[attr - 1];   /* 33: PCI_BUS_ID */
}

static CUresult sim_device_get_attribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    ENTER(F_cuDeviceGetAttribute);
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if ((int)attrib < 1 || (int)attrib >= SIM_ATTRIBUTE_END) return CUDA_ERROR_INVALID_VALUE;
    *pi = attribute_value((int)attrib, dev);
    return CUDA_SUCCESS;
}

static CUresult sim_device_compute_capability(int *major, int *minor, CUdevice dev) {
    ENTER(F_cuDeviceComputeCapability);
    if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *major = 9;
    *minor = 0;
    return CUDA_SUCCESS;
}

/* doc: "[domain]:[bus]:[device].[function]", hexadecimal. */
static CUresult sim_device_get_pci_bus_id(char *pciBusId, int len, CUdevice dev) {
    ENTER(F_cuDeviceGetPCIBusId);
    if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    /* H200: a short buffer gets the truncated id and INVALID_VALUE */
    int need = snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", pci_bus(dev));
    return need < len ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* doc accepts "[domain]:[bus]:[device].[function]", "[domain]:[bus]:[device]" and
 * "[bus]:[device].[function]". */
static CUresult sim_device_get_by_pci_bus_id(CUdevice *dev, const char *pciBusId) {
    ENTER(F_cuDeviceGetByPCIBusId);
    if (!dev || !pciBusId) return CUDA_ERROR_INVALID_VALUE;
    unsigned int a, b, c, d;
    int bus = -1;
    char tail;
    if (sscanf(pciBusId, "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4 ||
        sscanf(pciBusId, "%x:%x:%x%c", &a, &b, &c, &tail) == 3) {
        if (a == 0 && c == 0) bus = (int)b;
    } else if (sscanf(pciBusId, "%x:%x.%x%c", &a, &b, &c, &tail) == 3) {
        if (b == 0) bus = (int)a;
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; bus >= 0 && dev_ok(i); i++)
        if (pci_bus(i) == bus) { *dev = i; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* ------------------------------------------------------------------------------
 * What a CUPTI callback subscriber sees on the real driver, for the context calls the
 * simulator implements, reported to the simulated CUPTI (simcupti.c, libcupti.so.13 beside
 * this library) through cupti_hook.h, so that cyctx's tracer runs on it unchanged. The data
 * is CUPTI's (cupti_callbacks.h of CUDA 13): CUpti_CallbackData and CUpti_ResourceData
 * layouts, domains, callback ids (cupti_driver_cbid.h) and parameter structs
 * (generated_cuda_meta.h: the function's arguments in order). As the H200 showed
 * (docs/evidence.md, "CUPTI callbacks"): the callback runs on the calling thread at entry
 * and exit of each enabled call, failed calls included; "context created" fires inside the
 * call that activates or creates a context and "context destroy starting" inside the one
 * that destroys it, while the context is still valid. Here they fire with g_lock held, as
 * the real driver holds its own locks there: a callback that waits for something a thread
 * inside the driver holds (the GIL) deadlocks here too.
 * Modelled, not seen: the destroy event of a primary context released to zero (the doc
 * says the last release destroys it); the entry/exit `context` is the one current at that
 * callback, as CUPTI's documentation describes it. Calls not enabled cost one relaxed load.
 * ------------------------------------------------------------------------------ */
#define SIM_CB_DOMAIN_DRIVER_API 1
#define SIM_CB_DOMAIN_RESOURCE 3
#define SIM_CBID_CONTEXT_CREATED 1
#define SIM_CBID_CONTEXT_DESTROY_STARTING 2
/* CUPTI_DRIVER_TRACE_CBID_* of cupti_driver_cbid.h */
#define CB_cuCtxCreate_v2 235
#define CB_cuCtxSetCurrent 303
#define CB_cuCtxDestroy_v2 322
#define CB_cuCtxPushCurrent_v2 323
#define CB_cuCtxPopCurrent_v2 324
#define CB_cuDevicePrimaryCtxRetain 386
#define CB_cuDevicePrimaryCtxRelease 387
#define CB_cuDevicePrimaryCtxReset 389
#define CB_cuDevicePrimaryCtxRelease_v2 544
#define CB_cuDevicePrimaryCtxReset_v2 545
#define CB_cuCtxCreate_v3 645
#define CB_cuCtxCreate_v4 757

typedef struct {                       /* CUpti_CallbackData */
    int callbackSite;                  /* CUPTI_API_ENTER 0, CUPTI_API_EXIT 1 */
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    CUcontext context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} SimCallbackData;
typedef struct {                       /* CUpti_ResourceData */
    CUcontext context;
    union { CUstream stream; } resourceHandle;
    void *resourceDescriptor;
} SimResourceData;

static CyctxsimCuptiHook g_cupti;              /* written by the simulated CUPTI */
static _Atomic uint32_t g_sub_correlation;

SIM_EXPORT CyctxsimCuptiHook *cyctxsim_cupti_hook(void) { return &g_cupti; }

static int cb_wanted(int domain, uint32_t cbid) {
    if (!atomic_load_explicit(&g_cupti.any, memory_order_relaxed)) return 0;
    return (atomic_load_explicit(&g_cupti.enabled[domain][cbid / 64], memory_order_acquire) >> (cbid % 64)) & 1;
}

static void cb_fire(int domain, uint32_t cbid, const void *data) {
    CyctxsimCuptiFire fire = atomic_load(&g_cupti.fire);
    if (fire) fire(domain, cbid, data);
}

/* Under g_lock (see above): the resource events. */
static void cb_resource(uint32_t cbid, SimCtx *c) {
    if (!cb_wanted(SIM_CB_DOMAIN_RESOURCE, cbid)) return;
    SimResourceData d = {(CUcontext)c, {NULL}, NULL};
    cb_fire(SIM_CB_DOMAIN_RESOURCE, cbid, &d);
}

typedef struct { SimCallbackData d; uint64_t corr; } SimApiCall;

static void cb_api_data(SimApiCall *a, const char *name, const void *params, CUresult *ret) {
    SimCtx *cur = stack_top();
    a->corr = 0;
    a->d = (SimCallbackData){0, name, params, ret, name, (CUcontext)cur,
                             cur ? (uint32_t)atomic_load(&cur->id) : 0u, &a->corr,
                             atomic_fetch_add(&g_sub_correlation, 1) + 1};
}

static void cb_api_enter(SimApiCall *a, int domain, uint32_t cbid, const char *name,
                         const void *params, CUresult *ret) {
    cb_api_data(a, name, params, ret);
    cb_fire(domain, cbid, &a->d);
}

static void cb_api_exit(SimApiCall *a, int domain, uint32_t cbid) {
    SimCtx *cur = stack_top();
    a->d.callbackSite = 1;
    a->d.context = (CUcontext)cur;
    a->d.contextUid = cur ? (uint32_t)atomic_load(&cur->id) : 0u;
    cb_fire(domain, cbid, &a->d);
}

/* One traced driver function: `impl` does the work; the wrapper reports entry and exit,
 * each if enabled when it happens: a call that was running when its callback was enabled
 * reports its exit only, as a subscriber that starts while other threads are inside the
 * driver sees. */
#define SIM_TRACED(cbid, name, impl, params, ...)                                    \
    do {                                                                             \
        CUresult r_ = CUDA_SUCCESS;                                                  \
        SimApiCall a_;                                                               \
        if (!cb_wanted(SIM_CB_DOMAIN_DRIVER_API, (cbid))) {                          \
            r_ = impl(__VA_ARGS__);                                                  \
            stall_at_return(cbid);                                                   \
            if (!cb_wanted(SIM_CB_DOMAIN_DRIVER_API, (cbid))) return r_;             \
            cb_api_data(&a_, (name), (params), &r_);                                 \
        } else {                                                                     \
            cb_api_enter(&a_, SIM_CB_DOMAIN_DRIVER_API, (cbid), (name), (params), &r_); \
            r_ = impl(__VA_ARGS__);                                                  \
            stall_at_return(cbid);                                                   \
        }                                                                            \
        cb_api_exit(&a_, SIM_CB_DOMAIN_DRIVER_API, (cbid));                          \
        return r_;                                                                   \
    } while (0)

/* ------------------------------------------------------------------------------
 * Primary contexts
 * ------------------------------------------------------------------------------ */

/* Under g_lock. A new activation is a new context: new id ("Reset keeps the handle
 * and changes the id"). */
static void primary_activate(SimCtx *c) {
    atomic_store(&c->id, g_next_id++);
    atomic_store(&c->flags, atomic_load(&c->pflags));
    atomic_store_explicit(&c->live, 1, memory_order_release);
    cb_resource(SIM_CBID_CONTEXT_CREATED, c);
}

/* doc: retaining activates it; unlike cuCtxCreate it is not pushed. */
static CUresult impl_primary_retain(CUcontext *pctx, CUdevice dev) {
    ENTER(F_cuDevicePrimaryCtxRetain);
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;   /* before pctx (H200) */
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (g_refcount[dev] == INT_MAX) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_refcount[dev]++;
    if (!is_live(&g_prim[dev])) primary_activate(&g_prim[dev]);
    pthread_mutex_unlock(&g_lock);
    *pctx = (CUcontext)&g_prim[dev];
    return CUDA_SUCCESS;
}

/* The last release destroys it (doc: "automatically reset once the last reference
 * ... is released"; "A reset keeps the retain count": "active after release#2=0"); an
 * unbalanced release fails with 201 (there: "release#3 (unbalanced) r201") in the v2 ABI (11000) and
 * is a no-op success in the v1 ABI (7000; seen on the H200). Never pops (doc). The
 * deactivation sets the flags back to 0, as a reset does (H200). */
static CUresult primary_release(CUdevice dev, CUresult unbalanced) {
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount[dev] == 0) {
        r = unbalanced;
    } else if (--g_refcount[dev] == 0 && is_live(&g_prim[dev])) {
        cb_resource(SIM_CBID_CONTEXT_DESTROY_STARTING, &g_prim[dev]);
        atomic_store_explicit(&g_prim[dev].live, 0, memory_order_release);
        atomic_store(&g_prim[dev].pflags, 0u);   /* differential record: flags back to 0 */
        atomic_store(&g_prim[dev].flags, 0u);
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

static CUresult impl_primary_release_v1(CUdevice dev) {
    ENTER(F_cuDevicePrimaryCtxRelease);
    return primary_release(dev, CUDA_SUCCESS);
}

static CUresult impl_primary_release_v2(CUdevice dev) {
    ENTER(F_cuDevicePrimaryCtxRelease);
    return primary_release(dev, CUDA_ERROR_INVALID_CONTEXT);
}

/* Sets the device's flags for its primary context, and those of the active context
 * too (H200: after SetFlags(2) on the active primary, cuCtxGetFlags said 0xa). */
static CUresult primary_set_flags(CUdevice dev, unsigned int flags, int refuse_active) {
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (!flags_ok(flags, SIM_PRIMARY_FLAGS_VALID)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (refuse_active && is_live(&g_prim[dev])) {
        r = CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
    } else {
        atomic_store(&g_prim[dev].pflags, flags);
        if (is_live(&g_prim[dev])) atomic_store(&g_prim[dev].flags, flags);
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* v1 (CUDA 7.0 ABI): before CUDA 11 setting flags on an active primary context
 * failed with CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE; the v2 ABI (11000) allows it. */
static CUresult sim_primary_set_flags_v1(CUdevice dev, unsigned int flags) {
    ENTER(F_cuDevicePrimaryCtxSetFlags);
    return primary_set_flags(dev, flags, 1);
}

static CUresult sim_primary_set_flags_v2(CUdevice dev, unsigned int flags) {
    ENTER(F_cuDevicePrimaryCtxSetFlags);
    return primary_set_flags(dev, flags, 0);
}

static CUresult sim_primary_get_state(CUdevice dev, unsigned int *flags, int *active) {
    ENTER(F_cuDevicePrimaryCtxGetState);
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    *flags = atomic_load(&g_prim[dev].pflags);
    *active = is_live(&g_prim[dev]);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* Destroys the context but keeps the references (doc: "Resetting the primary context
 * does not release it"; "A reset keeps the retain count": after cudaDeviceReset the
 * driver's retain survived, re-retain then needed two releases). The handle stays; the next retain activates it
 * with a new id. The flags go back to 0 (seen on the H200: SetFlags(4), retain, reset
 * -> GetState flags 0). */
static void primary_reset(CUdevice dev) {
    pthread_mutex_lock(&g_lock);
    if (is_live(&g_prim[dev])) cb_resource(SIM_CBID_CONTEXT_DESTROY_STARTING, &g_prim[dev]);
    atomic_store_explicit(&g_prim[dev].live, 0, memory_order_release);
    atomic_store(&g_prim[dev].pflags, 0u);
    atomic_store(&g_prim[dev].flags, 0u);
    pthread_mutex_unlock(&g_lock);
}

static CUresult impl_primary_reset(CUdevice dev) {
    ENTER(F_cuDevicePrimaryCtxReset);
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    primary_reset(dev);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------
 * Created contexts
 * ------------------------------------------------------------------------------ */

/* Layout of CUctxCreateParams (CUDA 12.5+), mirrored so that this file also builds
 * against older headers. */
typedef struct {
    void *execAffinityParams;
    int numExecAffinityParams;
    void *cigParams;
} SimCtxCreateParams;
#if CUDA_VERSION >= 12050
_Static_assert(sizeof(SimCtxCreateParams) == sizeof(CUctxCreateParams), "CUctxCreateParams layout");
#endif

/* Execution affinity is only supported under MPS (doc of cuCtxCreate); there is none.
 * A count <= 0 means none, whatever the array (the H200 made a context with -1). */
static CUresult check_affinity(const void *params, int n) {
    if (n <= 0) return CUDA_SUCCESS;
    return params ? CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY : CUDA_ERROR_INVALID_VALUE;
}

/* doc: the new context gets a usage count of 1 and is pushed on the calling thread. */
static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    if (!flags_ok(flags, SIM_CTX_FLAGS_VALID)) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    SimCtx *c = g_reusable && atomic_load(&g_reusable->on_stacks) == 0 ? g_reusable : NULL;
    if (c) {
        g_reusable = NULL;
        atomic_store(&c->zombie, 0);
    } else {
        int nchunks = atomic_load(&g_nchunks);
        if (nchunks == 0 || g_chunk_used == SIM_CHUNK) {
            SimCtx *chunk = nchunks < SIM_MAX_CHUNKS ? calloc(SIM_CHUNK, sizeof *chunk) : NULL;
            if (!chunk) {
                pthread_mutex_unlock(&g_lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            atomic_store_explicit(&g_chunks[nchunks], chunk, memory_order_relaxed);
            atomic_store_explicit(&g_nchunks, ++nchunks, memory_order_release);
            g_chunk_used = 0;
        }
        c = &atomic_load(&g_chunks[nchunks - 1])[g_chunk_used++];
    }
    atomic_store(&c->device, dev);
    atomic_store(&c->flags, flags);
    atomic_store(&c->id, g_next_id++);
    atomic_store(&c->live, 1);
    atomic_store_explicit(&c->kind, KIND_CREATED, memory_order_release);
    atomic_fetch_add(&g_live_created, 1);
    cb_resource(SIM_CBID_CONTEXT_CREATED, c);
    pthread_mutex_unlock(&g_lock);
    CUresult r = stack_push(c);
    if (r != CUDA_SUCCESS) {
        atomic_store(&c->live, 0);
        atomic_fetch_sub(&g_live_created, 1);
        return r;
    }
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

static CUresult impl_ctx_create_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    ENTER(F_cuCtxCreate);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

static CUresult impl_ctx_create_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                   int numParams, unsigned int flags, CUdevice dev) {
    ENTER(F_cuCtxCreate);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_affinity(paramsArray, numParams);
    return r != CUDA_SUCCESS ? r : ctx_create(pctx, flags, dev);
}

static CUresult impl_ctx_create_v4(CUcontext *pctx, SimCtxCreateParams *params,
                                   unsigned int flags, CUdevice dev) {
    ENTER(F_cuCtxCreate);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (params) {
        /* doc: the two are mutually exclusive; CIG fails with NOT_SUPPORTED where the
         * device does not support it (no simulated device does; Linux has no D3D12). */
        if (params->execAffinityParams && params->cigParams) return CUDA_ERROR_INVALID_VALUE;
        if (params->cigParams) {
            /* CUctxCigParam starts with its CUcigDataType; 0 is no type (the H200 said
             * INVALID_VALUE to an all-zero one). */
            return *(const int *)params->cigParams == 0 ? CUDA_ERROR_INVALID_VALUE
                                                        : CUDA_ERROR_NOT_SUPPORTED;
        }
        CUresult r = check_affinity(params->execAffinityParams, params->numExecAffinityParams);
        if (r != CUDA_SUCCESS) return r;
    }
    return ctx_create(pctx, flags, dev);
}

/* doc: destroyed however many threads have it current; popped if current on this
 * thread; other threads keep it current and get CUDA_ERROR_CONTEXT_IS_DESTROYED.
 * H200: NULL -> INVALID_VALUE, a primary context -> 201 (and it stays active); a second
 * destroy -> 709 if a thread had it on its stack at the first (the driver keeps a
 * destroyed record for those threads), else 201 (nothing left of it). */
static CUresult impl_ctx_destroy(CUcontext ctx) {
    ENTER(F_cuCtxDestroy);
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    SimCtx *c = sim_lookup(ctx);
    if (!c || is_primary(c)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_lock);
    if (is_live(c)) cb_resource(SIM_CBID_CONTEXT_DESTROY_STARTING, c);
    int was_live = atomic_exchange(&c->live, 0);
    if (was_live) {
        atomic_fetch_sub(&g_live_created, 1);
        atomic_store(&c->zombie, atomic_load(&c->on_stacks) > 0);
        if (g_reuse) g_reusable = c;
    }
    pthread_mutex_unlock(&g_lock);
    if (!was_live)
        return atomic_load(&c->zombie) ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
    if (stack_top() == c) stack_pop();
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------
 * The current context: per-thread stack, no lock
 * ------------------------------------------------------------------------------ */

/* A dead context can be pushed ("A dead context can be pushed and popped"; the H200 also
 * pushed a destroyed created one). NULL -> INVALID_VALUE (H200). */
static CUresult impl_ctx_push_current(CUcontext ctx) {
    ENTER(F_cuCtxPushCurrent);
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    SimCtx *c = sim_lookup(ctx);
    return c ? stack_push(c) : CUDA_ERROR_INVALID_CONTEXT;
}

/* Empty stack -> 201 (doc); a dead context is popped like any other ("A dead
 * context can be pushed and popped"). pctx may be NULL. */
static CUresult impl_ctx_pop_current(CUcontext *pctx) {
    ENTER(F_cuCtxPopCurrent);
    if (t_stack.n == 0) return CUDA_ERROR_INVALID_CONTEXT;
    SimCtx *c = stack_pop();
    if (pctx) *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

/* doc: replaces the top of the stack; NULL pops the top (a no-op on an empty stack);
 * on an empty stack a context is pushed. */
static CUresult impl_ctx_set_current(CUcontext ctx) {
    ENTER(F_cuCtxSetCurrent);
    if (!ctx) {
        if (t_stack.n) stack_pop();
        return CUDA_SUCCESS;
    }
    SimCtx *c = sim_lookup(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_stack.n == 0) return stack_push(c);
    SimCtx *old = t_stack.v[t_stack.n - 1];
    if (old != c) {
        atomic_fetch_add_explicit(&c->on_stacks, 1, memory_order_relaxed);
        t_stack.v[t_stack.n - 1] = c;
        atomic_fetch_sub_explicit(&old->on_stacks, 1, memory_order_relaxed);
    }
    return CUDA_SUCCESS;
}

/* Returns whatever is current, dead or not ("A reset leaves a dead handle current"). */
static CUresult sim_ctx_get_current(CUcontext *pctx) {
    ENTER(F_cuCtxGetCurrent);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)stack_top();
    return CUDA_SUCCESS;
}

/* Works on a dead context ("A reset leaves a dead handle current": "ctxdev=0(r0)"). */
static CUresult sim_ctx_get_device(CUdevice *device) {
    ENTER(F_cuCtxGetDevice);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    SimCtx *c;
    CUresult r = sim_resolve(NULL, &c, CUDA_SUCCESS);
    if (r == CUDA_SUCCESS) *device = c->device;
    return r;
}

static CUresult sim_ctx_get_device_v2(CUdevice *device, CUcontext ctx) {
    ENTER(F_cuCtxGetDevice);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    SimCtx *c;
    CUresult r = sim_resolve(ctx, &c, CUDA_SUCCESS);
    if (r == CUDA_SUCCESS) *device = c->device;
    return r;
}

/* H200: an active primary context reports CU_CTX_MAP_HOST on top of its flags (doc of
 * cuDevicePrimaryCtxRetain: "the primary context always supports pinned allocations");
 * a created context reports its creation flags; a dead one answers too (a reset
 * primary: 0). */
static CUresult sim_ctx_get_flags(unsigned int *flags) {
    ENTER(F_cuCtxGetFlags);
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    SimCtx *c;
    CUresult r = sim_resolve(NULL, &c, CUDA_SUCCESS);
    if (r == CUDA_SUCCESS)
        *flags = atomic_load(&c->flags) | (is_primary(c) && is_live(c) ? SIM_CTX_MAP_HOST : 0u);
    return r;
}

/* doc: flag values as for cuDevicePrimaryCtxSetFlags. H200: changes the context only,
 * not what cuDevicePrimaryCtxGetState reports; the coredump flags, which take effect at
 * creation (doc), are accepted and dropped. On a dead context the H200 crashed; here it
 * is 709. */
static CUresult sim_ctx_set_flags(unsigned int flags) {
    ENTER(F_cuCtxSetFlags);
    SimCtx *c;
    CUresult r = sim_resolve(NULL, &c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    if (r != CUDA_SUCCESS) return r;
    if (!flags_ok(flags, SIM_PRIMARY_FLAGS_VALID)) return CUDA_ERROR_INVALID_VALUE;
    atomic_store(&c->flags, flags & ~SIM_CTX_COREDUMP_BITS);
    return CUDA_SUCCESS;
}

/* A dead context -> CUDA_ERROR_CONTEXT_IS_DESTROYED ("A dead context answers 201
 * through its handle and 709 through NULL"; doc lists it). */
static CUresult sim_ctx_get_id(CUcontext ctx, unsigned long long *ctxId) {
    ENTER(F_cuCtxGetId);
    if (!ctxId) return CUDA_ERROR_INVALID_VALUE;
    SimCtx *c = ctx ? sim_lookup(ctx) : stack_top();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!is_live(c)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctxId = atomic_load(&c->id);
    return CUDA_SUCCESS;
}

static CUresult sim_ctx_synchronize(void) {
    ENTER(F_cuCtxSynchronize);
    SimCtx *c;
    return sim_resolve(NULL, &c, CUDA_ERROR_CONTEXT_IS_DESTROYED);   /* no work is pending */
}

static CUresult sim_ctx_synchronize_v2(CUcontext ctx) {
    ENTER(F_cuCtxSynchronize);
    SimCtx *c;
    return sim_resolve(ctx, &c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

/* 3020 on a live context; a dead one passed -> 201 ("A reset leaves a dead handle
 * current", "Before CUDA 12.0, cudaSetDevice leaves the primary context inactive"), dead and
 * current -> 709 ("A dead context answers 201 through its handle and 709 through NULL"). The context is
 * checked before the pointer (H200: no current context and NULL -> 201). */
static CUresult sim_ctx_get_api_version(CUcontext ctx, unsigned int *version) {
    ENTER(F_cuCtxGetApiVersion);
    SimCtx *c;
    CUresult r = sim_resolve(ctx, &c, ctx ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_CONTEXT_IS_DESTROYED);
    if (r != CUDA_SUCCESS) return r;
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_API_VERSION;
    return CUDA_SUCCESS;
}

/* Hopper: priorities 0 (least) .. -5 (greatest); either pointer may be NULL (doc). */
static CUresult sim_ctx_get_stream_priority_range(int *leastPriority, int *greatestPriority) {
    ENTER(F_cuCtxGetStreamPriorityRange);
    SimCtx *c;
    CUresult r = sim_resolve(NULL, &c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    if (r != CUDA_SUCCESS) return r;
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------
 * The traced context calls: each reports its entry and exit to a subscriber that enabled
 * its callback id, with the parameter struct of generated_cuda_meta.h.
 * ------------------------------------------------------------------------------ */
/* The function of each traced callback id: what a stall at return is armed on. */
static const struct { uint32_t cbid; int fn; } g_traced_fn[] = {
    {CB_cuCtxSetCurrent, F_cuCtxSetCurrent}, {CB_cuCtxPushCurrent_v2, F_cuCtxPushCurrent},
    {CB_cuCtxPopCurrent_v2, F_cuCtxPopCurrent}, {CB_cuDevicePrimaryCtxRetain, F_cuDevicePrimaryCtxRetain},
    {CB_cuDevicePrimaryCtxRelease, F_cuDevicePrimaryCtxRelease},
    {CB_cuDevicePrimaryCtxRelease_v2, F_cuDevicePrimaryCtxRelease},
    {CB_cuDevicePrimaryCtxReset, F_cuDevicePrimaryCtxReset}, {CB_cuDevicePrimaryCtxReset_v2, F_cuDevicePrimaryCtxReset},
    {CB_cuCtxCreate_v2, F_cuCtxCreate}, {CB_cuCtxCreate_v3, F_cuCtxCreate}, {CB_cuCtxCreate_v4, F_cuCtxCreate},
    {CB_cuCtxDestroy_v2, F_cuCtxDestroy},
};
#define SIM_N_TRACED ((int)(sizeof g_traced_fn / sizeof g_traced_fn[0]))

static int traced_fn(uint32_t cbid) {
    for (int i = 0; i < SIM_N_TRACED; i++)
        if (g_traced_fn[i].cbid == cbid) return g_traced_fn[i].fn;
    return -1;
}

static inline void stall_at_return(uint32_t cbid) {
    if (atomic_load_explicit(&g_stall_fn, memory_order_acquire) >= 0) stall_take(traced_fn(cbid), 1);
}

static CUresult sim_primary_retain(CUcontext *pctx, CUdevice dev) {
    struct { CUcontext *pctx; CUdevice dev; } p = {pctx, dev};
    SIM_TRACED(CB_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", impl_primary_retain, &p, pctx, dev);
}
static CUresult sim_primary_release_v1(CUdevice dev) {
    struct { CUdevice dev; } p = {dev};
    SIM_TRACED(CB_cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", impl_primary_release_v1, &p, dev);
}
static CUresult sim_primary_release_v2(CUdevice dev) {
    struct { CUdevice dev; } p = {dev};
    SIM_TRACED(CB_cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2", impl_primary_release_v2, &p, dev);
}
static CUresult sim_primary_reset_v1(CUdevice dev) {
    struct { CUdevice dev; } p = {dev};
    SIM_TRACED(CB_cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", impl_primary_reset, &p, dev);
}
static CUresult sim_primary_reset_v2(CUdevice dev) {
    struct { CUdevice dev; } p = {dev};
    SIM_TRACED(CB_cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset_v2", impl_primary_reset, &p, dev);
}
static CUresult sim_ctx_create_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    struct { CUcontext *pctx; unsigned int flags; CUdevice dev; } p = {pctx, flags, dev};
    SIM_TRACED(CB_cuCtxCreate_v2, "cuCtxCreate_v2", impl_ctx_create_v2, &p, pctx, flags, dev);
}
static CUresult sim_ctx_create_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                  int numParams, unsigned int flags, CUdevice dev) {
    struct { CUcontext *pctx; CUexecAffinityParam *paramsArray; int numParams; unsigned int flags; CUdevice dev; } p =
        {pctx, paramsArray, numParams, flags, dev};
    SIM_TRACED(CB_cuCtxCreate_v3, "cuCtxCreate_v3", impl_ctx_create_v3, &p, pctx, paramsArray, numParams, flags, dev);
}
static CUresult sim_ctx_create_v4(CUcontext *pctx, SimCtxCreateParams *params,
                                  unsigned int flags, CUdevice dev) {
    struct { CUcontext *pctx; SimCtxCreateParams *ctxCreateParams; unsigned int flags; CUdevice dev; } p =
        {pctx, params, flags, dev};
    SIM_TRACED(CB_cuCtxCreate_v4, "cuCtxCreate_v4", impl_ctx_create_v4, &p, pctx, params, flags, dev);
}
static CUresult sim_ctx_destroy(CUcontext ctx) {
    struct { CUcontext ctx; } p = {ctx};
    SIM_TRACED(CB_cuCtxDestroy_v2, "cuCtxDestroy_v2", impl_ctx_destroy, &p, ctx);
}
static CUresult sim_ctx_push_current(CUcontext ctx) {
    struct { CUcontext ctx; } p = {ctx};
    SIM_TRACED(CB_cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2", impl_ctx_push_current, &p, ctx);
}
static CUresult sim_ctx_pop_current(CUcontext *pctx) {
    struct { CUcontext *pctx; } p = {pctx};
    SIM_TRACED(CB_cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2", impl_ctx_pop_current, &p, pctx);
}
static CUresult sim_ctx_set_current(CUcontext ctx) {
    struct { CUcontext ctx; } p = {ctx};
    SIM_TRACED(CB_cuCtxSetCurrent, "cuCtxSetCurrent", impl_ctx_set_current, &p, ctx);
}

/* ------------------------------------------------------------------------------
 * The runtime's context calls (simdriver.h, "Runtime"): cudaSetDevice and cudaDeviceReset of
 * a CUDA 12+ libcudart, as a CUPTI subscriber sees them on the H200 (docs/evidence.md, "CUPTI
 * callbacks"): each is a runtime-domain call, and cudaSetDevice makes its driver calls through
 * the traced entry points above, so they are reported inside it: cuCtxSetCurrent of the
 * device's primary context, then, the first time for the device, cuDevicePrimaryCtxRetain (the
 * runtime's own retain, which activates the context: "Since CUDA 12.0, cudaSetDevice activates
 * the primary context"). cudaDeviceReset makes no driver call a subscriber sees: the primary
 * context's "destroy starting" is reported inside it. Modelled, not seen: it resets the device
 * of the current context (else the thread's cudaSetDevice device, else 0) and gives up the
 * runtime's retain, so the next cudaSetDevice of the device retains and activates it again.
 * Results are driver codes (0: success), as the first failing driver call gave them.
 * ------------------------------------------------------------------------------ */
#define SIM_CB_DOMAIN_RUNTIME 2
#define CB_cudaSetDevice_v3020 16      /* CUPTI_RUNTIME_TRACE_CBID_* of cupti_runtime_cbid.h */
#define CB_cudaDeviceReset_v3020 164

static pthread_mutex_t g_rt_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_rt_retained[SIM_MAX_DEVICES];     /* under g_rt_lock: the runtime holds a retain */
static _Thread_local int t_rt_device;          /* the thread's cudaSetDevice device */

static CUresult rt_set_device(int dev) {
    CUresult r = cuInit(0);                    /* the runtime initialises the driver itself */
    if (r != CUDA_SUCCESS) return r;
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    r = sim_ctx_set_current((CUcontext)&g_prim[dev]);
    if (r != CUDA_SUCCESS) return r;
    t_rt_device = dev;
    pthread_mutex_lock(&g_rt_lock);
    if (!g_rt_retained[dev]) {
        CUcontext ctx;
        r = sim_primary_retain(&ctx, dev);
        g_rt_retained[dev] = r == CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_rt_lock);
    return r;
}

static CUresult rt_device_reset(int unused) {
    (void)unused;
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) return r;
    SimCtx *cur = stack_top();
    int dev = cur ? atomic_load(&cur->device) : t_rt_device;
    pthread_mutex_lock(&g_rt_lock);
    primary_reset(dev);
    if (g_rt_retained[dev]) {
        g_rt_retained[dev] = 0;
        primary_release(dev, CUDA_SUCCESS);
    }
    pthread_mutex_unlock(&g_rt_lock);
    return CUDA_SUCCESS;
}

/* One runtime call, reported in the runtime domain as SIM_TRACED reports a driver call. */
static CUresult rt_traced(uint32_t cbid, const char *name, const void *params,
                          CUresult (*impl)(int), int arg) {
    CUresult r = CUDA_SUCCESS;
    SimApiCall a;
    int entered = cb_wanted(SIM_CB_DOMAIN_RUNTIME, cbid);
    if (entered) cb_api_enter(&a, SIM_CB_DOMAIN_RUNTIME, cbid, name, params, &r);
    r = impl(arg);
    if (!entered) {
        if (!cb_wanted(SIM_CB_DOMAIN_RUNTIME, cbid)) return r;
        cb_api_data(&a, name, params, &r);
    }
    cb_api_exit(&a, SIM_CB_DOMAIN_RUNTIME, cbid);
    return r;
}

int cyctxsim_cudaSetDevice(int device) {
    struct { int device; } p = {device};       /* cudaSetDevice_v3020_params */
    return (int)rt_traced(CB_cudaSetDevice_v3020, "cudaSetDevice", &p, rt_set_device, device);
}

int cyctxsim_cudaDeviceReset(void) {
    struct { char dummy; } p = {0};            /* cudaDeviceReset_v3020_params */
    return (int)rt_traced(CB_cudaDeviceReset_v3020, "cudaDeviceReset", &p, rt_device_reset, 0);
}

/* ------------------------------------------------------------------------------
 * Stream-capture mode: each thread's own, GLOBAL until it exchanges it (doc; H200: the
 * exchange on a thread that never set one returned global, "Context operations leave a
 * stream capture valid"). There are no streams or captures here, only the mode.
 * ------------------------------------------------------------------------------ */
static _Thread_local int t_capture_mode;   /* CU_STREAM_CAPTURE_MODE_GLOBAL = 0 */

static CUresult sim_thread_exchange_stream_capture_mode(CUstreamCaptureMode *mode) {
    ENTER(F_cuThreadExchangeStreamCaptureMode);
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    int m = (int)*mode;
    if (m < CU_STREAM_CAPTURE_MODE_GLOBAL || m > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = (CUstreamCaptureMode)t_capture_mode;
    t_capture_mode = m;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------
 * cuGetProcAddress
 * ------------------------------------------------------------------------------ */
static CUresult proc_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *symbolStatus);

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus) {
    ENTER_NOINIT(F_cuGetProcAddress);
    return proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* The CUDA 11.3 ABI, without the status argument; still exported by the real driver. */
SIM_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                             cuuint64_t flags);
SIM_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                             cuuint64_t flags) {
    ENTER_NOINIT(F_cuGetProcAddress);
    return proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

/* NVRTC (libnvrtc) dlopens libcuda.so.1 and, when it loads, calls cuGetExportTable without
 * checking that the symbol exists: a process that compiled a kernel with NVRTC on the
 * simulated driver crashed inside nvrtcCompileProgram. The simulator has no private tables
 * to offer; NOT_FOUND with a NULL table lets NVRTC go on without the driver, as it does on
 * a machine with no driver at all. */
SIM_EXPORT CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    (void)pExportTableId;
    if (ppExportTable) *ppExportTable = NULL;
    return CUDA_ERROR_NOT_FOUND;
}

/* (function, CUDA version that introduced this ABI variant, implementation). The
 * versions are the ones cuda.bindings asks with (e.g. cuCtxCreate 3020 = _v2, 11040 =
 * _v3, 12050 = _v4; cuCtxGetDevice 13000 = _v2). */
typedef struct { int fn, version; void *pfn; } SimProc;
static const SimProc g_procs[] = {
    {F_cuInit, 2000, (void *)cuInit},
    {F_cuDriverGetVersion, 2020, (void *)cuDriverGetVersion},
    {F_cuGetProcAddress, 11030, (void *)cuGetProcAddress},
    {F_cuGetProcAddress, 12000, (void *)cuGetProcAddress_v2},
    {F_cuGetErrorName, 6000, (void *)sim_get_error_name},
    {F_cuGetErrorString, 6000, (void *)sim_get_error_string},
    {F_cuDeviceGet, 2000, (void *)sim_device_get},
    {F_cuDeviceGetCount, 2000, (void *)sim_device_get_count},
    {F_cuDeviceGetName, 2000, (void *)sim_device_get_name},
    {F_cuDeviceGetUuid, 9020, (void *)sim_device_get_uuid},
    {F_cuDeviceGetUuid, 11040, (void *)sim_device_get_uuid},
    {F_cuDeviceTotalMem, 3020, (void *)sim_device_total_mem_v2},
    {F_cuDeviceGetAttribute, 2000, (void *)sim_device_get_attribute},
    {F_cuDeviceComputeCapability, 2000, (void *)sim_device_compute_capability},
    {F_cuDeviceGetPCIBusId, 4010, (void *)sim_device_get_pci_bus_id},
    {F_cuDeviceGetByPCIBusId, 4010, (void *)sim_device_get_by_pci_bus_id},
    {F_cuDevicePrimaryCtxRetain, 7000, (void *)sim_primary_retain},
    {F_cuDevicePrimaryCtxRelease, 7000, (void *)sim_primary_release_v1},
    {F_cuDevicePrimaryCtxRelease, 11000, (void *)sim_primary_release_v2},
    {F_cuDevicePrimaryCtxSetFlags, 7000, (void *)sim_primary_set_flags_v1},
    {F_cuDevicePrimaryCtxSetFlags, 11000, (void *)sim_primary_set_flags_v2},
    {F_cuDevicePrimaryCtxGetState, 7000, (void *)sim_primary_get_state},
    {F_cuDevicePrimaryCtxReset, 7000, (void *)sim_primary_reset_v1},
    {F_cuDevicePrimaryCtxReset, 11000, (void *)sim_primary_reset_v2},
    {F_cuCtxCreate, 2000, (void *)sim_ctx_create_v2},   /* v1: same C signature */
    {F_cuCtxCreate, 3020, (void *)sim_ctx_create_v2},
    {F_cuCtxCreate, 11040, (void *)sim_ctx_create_v3},
    {F_cuCtxCreate, 12050, (void *)sim_ctx_create_v4},
    {F_cuCtxDestroy, 4000, (void *)sim_ctx_destroy},
    {F_cuCtxPushCurrent, 4000, (void *)sim_ctx_push_current},
    {F_cuCtxPopCurrent, 4000, (void *)sim_ctx_pop_current},
    {F_cuCtxSetCurrent, 4000, (void *)sim_ctx_set_current},
    {F_cuCtxGetCurrent, 4000, (void *)sim_ctx_get_current},
    {F_cuCtxGetDevice, 2000, (void *)sim_ctx_get_device},
    {F_cuCtxGetDevice, 13000, (void *)sim_ctx_get_device_v2},
    {F_cuCtxGetFlags, 7000, (void *)sim_ctx_get_flags},
    {F_cuCtxSetFlags, 12010, (void *)sim_ctx_set_flags},
    {F_cuCtxGetId, 12000, (void *)sim_ctx_get_id},
    {F_cuCtxSynchronize, 2000, (void *)sim_ctx_synchronize},
    {F_cuCtxSynchronize, 13000, (void *)sim_ctx_synchronize_v2},
    {F_cuCtxGetApiVersion, 3020, (void *)sim_ctx_get_api_version},
    {F_cuCtxGetStreamPriorityRange, 5050, (void *)sim_ctx_get_stream_priority_range},
    {F_cuThreadExchangeStreamCaptureMode, 10010, (void *)sim_thread_exchange_stream_capture_mode},
};

/* The real rule (doc of cuGetProcAddress): the variant with the highest introducing
 * version <= cudaVersion. Works before cuInit (the runtime resolves everything first).
 * As the H200 answered: a version newer than the driver's -> INVALID_VALUE (doc too); an
 * unknown name, or a version older than the first variant -> CUDA_SUCCESS with *pfn NULL
 * and the status saying which (doc); NULL symbol or pfn crashed it, here INVALID_VALUE. */
static CUresult proc_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *symbolStatus) {
    /* LEGACY_STREAM (1) / PER_THREAD_DEFAULT_STREAM (2) select stream variants; no
     * function modelled here has a per-thread variant, so both give the same. */
    if (!symbol || !pfn || cudaVersion > SIM_DRIVER_VERSION || (flags & ~(cuuint64_t)3) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fn = fn_index(symbol);
    const SimProc *best = NULL;
    for (size_t i = 0; fn >= 0 && i < sizeof g_procs / sizeof g_procs[0]; i++)
        if (g_procs[i].fn == fn && g_procs[i].version <= cudaVersion &&
            (!best || g_procs[i].version > best->version))
            best = &g_procs[i];
    if (best) {
        *pfn = best->pfn;
        if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    if (symbolStatus)
        *symbolStatus = fn >= 0 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------
 * Fork and load
 * ------------------------------------------------------------------------------ */
static void atfork_prepare(void) {
    pthread_mutex_lock(&g_stall_lock);
    pthread_mutex_lock(&g_fault_lock);
    pthread_mutex_lock(&g_lock);
}

static void atfork_parent(void) {
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_fault_lock);
    pthread_mutex_unlock(&g_stall_lock);
}

/* In a child forked after cuInit, every call (cuInit included) returns
 * CUDA_ERROR_NOT_INITIALIZED ("A forked child gets CUDA_ERROR_NOT_INITIALIZED from every
 * call"). A child of a process that never initialised
 * the driver can initialise it normally. */
static void atfork_child(void) {
    if (atomic_load(&g_state) == ST_READY) atomic_store(&g_state, ST_FORKED);
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_fault_lock);
    pthread_mutex_unlock(&g_stall_lock);
}

__attribute__((constructor)) static void sim_load(void) {
    pthread_key_create(&g_stack_key, stack_free);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* CYCTX_SIM_REPORT_AT_EXIT=1: print the primary contexts' state when the library is
 * unloaded at process exit, after the interpreter has finalised, so a test can check
 * that shutdown released every retain (simdriver.h). No lock: exit is single-threaded
 * as far as this library can tell, and a report must not hang on a lock that a
 * thread killed by exit still holds. */
__attribute__((destructor)) static void sim_unload(void) {
    const char *e = getenv("CYCTX_SIM_REPORT_AT_EXIT");
    if (!e || !*e || strcmp(e, "0") == 0) return;
    int n = atomic_load(&g_state) != ST_UNINIT ? atomic_load(&g_ndev) : 0;
    char buf[64 * 2 * 14 + 128];
    size_t len = 0;
    len += (size_t)snprintf(buf + len, sizeof buf - len, "cyctxsim at exit: retains=[");
    for (int d = 0; d < n; d++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%d", d ? ", " : "", g_refcount[d]);
    len += (size_t)snprintf(buf + len, sizeof buf - len, "] active=[");
    for (int d = 0; d < n; d++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%d", d ? ", " : "", is_live(&g_prim[d]));
    snprintf(buf + len, sizeof buf - len, "] live_contexts=%d\n", atomic_load(&g_live_created));
    fputs(buf, stderr);
    fflush(stderr);
}

/* ------------------------------------------------------------------------------
 * Control API (simdriver.h)
 * ------------------------------------------------------------------------------ */
int cyctxsim_is_simulated(void) { return 1; }

int cyctxsim_configure(int device_count) {
    int r = -1;
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_state) == ST_UNINIT && device_count >= 1 && device_count <= SIM_MAX_DEVICES) {
        g_configured = device_count;
        r = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

int cyctxsim_device_count(void) {
    pthread_mutex_lock(&g_lock);
    int n = atomic_load(&g_state) != ST_UNINIT ? atomic_load(&g_ndev)
            : g_configured                     ? g_configured
                                               : env_device_count();
    pthread_mutex_unlock(&g_lock);
    return n;
}

int cyctxsim_retain_count(int ordinal) {
    if (ordinal < 0 || ordinal >= cyctxsim_device_count()) return -1;
    pthread_mutex_lock(&g_lock);
    int n = g_refcount[ordinal];
    pthread_mutex_unlock(&g_lock);
    return n;
}

int cyctxsim_primary_active(int ordinal) {
    if (ordinal < 0 || ordinal >= cyctxsim_device_count()) return -1;
    return is_live(&g_prim[ordinal]);
}

int cyctxsim_stack_depth(void) { return t_stack.n; }

int cyctxsim_live_contexts(void) { return atomic_load(&g_live_created); }

int cyctxsim_reuse_handles(int on) {
    pthread_mutex_lock(&g_lock);
    int was = g_reuse;
    g_reuse = on != 0;
    if (!g_reuse) g_reusable = NULL;
    pthread_mutex_unlock(&g_lock);
    return was;
}

int cyctxsim_inject_fault(const char *name, int nth, int code, int count) {
    int fn = name ? fn_index(name) : -1;
    if (fn < 0 || nth < 1 || count < 1 || code <= 0) return -1;
    int r = -1;
    pthread_mutex_lock(&g_fault_lock);
    if (g_nfault_slots < SIM_MAX_FAULTS) {
        g_faults[g_nfault_slots++] = (SimFault){fn, nth - 1, count, code};
        atomic_fetch_add(&g_nfaults, 1);
        r = 0;
    }
    pthread_mutex_unlock(&g_fault_lock);
    return r;
}

void cyctxsim_clear_faults(void) {
    pthread_mutex_lock(&g_fault_lock);
    g_nfault_slots = 0;
    atomic_store(&g_nfaults, 0);
    pthread_mutex_unlock(&g_fault_lock);
}

static int stall_arm(int fn, int nth, int at_return) {
    if (fn < 0 || nth < 1) return -1;
    pthread_mutex_lock(&g_stall_lock);
    int busy = atomic_load(&g_stall_fn) >= 0 || g_stall_waiting > 0;
    if (!busy) {
        g_stall_skip = nth - 1;
        g_stall_at_return = at_return;
        atomic_store(&g_stall_fn, fn);
    }
    pthread_mutex_unlock(&g_stall_lock);
    return busy ? -1 : 0;
}

int cyctxsim_stall(const char *name, int nth) { return stall_arm(name ? fn_index(name) : -1, nth, 0); }

int cyctxsim_stall_at_return(const char *name, int nth) {
    int fn = name ? fn_index(name) : -1;
    int traced = 0;
    for (int i = 0; i < SIM_N_TRACED && fn >= 0; i++) traced |= g_traced_fn[i].fn == fn;
    return stall_arm(traced ? fn : -1, nth, 1);
}

int cyctxsim_stalled(void) {
    pthread_mutex_lock(&g_stall_lock);
    int n = g_stall_waiting;
    pthread_mutex_unlock(&g_stall_lock);
    return n;
}

void cyctxsim_unstall(void) {
    pthread_mutex_lock(&g_stall_lock);
    atomic_store(&g_stall_fn, -1);
    g_stall_gen++;
    pthread_cond_broadcast(&g_stall_cv);
    pthread_mutex_unlock(&g_stall_lock);
}

long long cyctxsim_call_count(const char *name) {
    if (!name) {
        long long total = 0;
        for (int i = 0; i < F_COUNT; i++) total += atomic_load(&g_calls[i]);
        return total;
    }
    int fn = fn_index(name);
    return fn < 0 ? -1 : atomic_load(&g_calls[fn]);
}
