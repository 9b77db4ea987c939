/*
 * simdriver.h -- control API of cyctx's simulated CUDA driver.
 *
 * The simulator is a shared library with soname libcuda.so.1 (simdriver.c). Loaded
 * before cuda.bindings resolves the driver, it stands in for NVIDIA's libcuda and
 * models devices, primary contexts, created contexts and the per-thread context
 * stack as the real driver behaves (docs/evidence.md, "Driver behaviour"). The functions
 * below are not part of any CUDA API: tests use them (through ctypes, cyctx.testing) to set
 * the simulator up, to look at state the driver API cannot show, and to inject
 * faults. All of them are thread-safe and never touch the GIL.
 */
#ifndef CYCTX_SIMDRIVER_H
#define CYCTX_SIMDRIVER_H

#if defined(__GNUC__)
#define CYCTXSIM_API __attribute__((visibility("default")))
#else
#define CYCTXSIM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Always 1: lets a caller tell the simulator from the real libcuda.so.1. */
CYCTXSIM_API int cyctxsim_is_simulated(void);

/* Number of simulated devices, 1..64. Only before cuInit succeeded (and not in a
 * child forked after it): 0 ok, -1 otherwise. Without it, cuInit reads the
 * environment variable CYCTX_SIM_DEVICES (default 1; "0" or a value that is not a
 * number in 0..64 makes cuInit fail with CUDA_ERROR_NO_DEVICE, as the real
 * driver does on a machine without a usable GPU). */
CYCTXSIM_API int cyctxsim_configure(int device_count);

/* Devices the simulator has (after cuInit), or would have (before it). */
CYCTXSIM_API int cyctxsim_device_count(void);

/* Reference count of the device's primary context (cuDevicePrimaryCtxRetain minus
 * Release; cuDevicePrimaryCtxReset keeps it). -1 for a bad ordinal. */
CYCTXSIM_API int cyctxsim_retain_count(int ordinal);

/* 1 if the device's primary context is active, 0 if not, -1 for a bad ordinal. */
CYCTXSIM_API int cyctxsim_primary_active(int ordinal);

/* Depth of the calling thread's context stack (0: no current context). */
CYCTXSIM_API int cyctxsim_stack_depth(void);

/* Contexts made by cuCtxCreate and not yet destroyed by cuCtxDestroy. */
CYCTXSIM_API int cyctxsim_live_contexts(void);

/* Handle reuse, off by default (as on the H200). `on` nonzero: from now on, cuCtxCreate gives
 * the new context the handle of the created context destroyed last (not destroyed before this
 * call), unless some thread still has that one on its context stack; the new context has a
 * new id (cuCtxGetId), so the handle alone no longer tells the two apart. 0: off, and no
 * destroyed handle is given again. Returns the previous setting (0 or 1). */
CYCTXSIM_API int cyctxsim_reuse_handles(int on);

/* Make the nth next call (1 = the very next) of the driver function `name` and the
 * count-1 calls after it return `code` without any side effect (out-parameters are
 * left untouched, nothing is counted as done). `name` is the base name as passed to
 * cuGetProcAddress ("cuCtxSetCurrent"); every ABI variant matches. A fault wins over
 * every other outcome, CUDA_ERROR_NOT_INITIALIZED included: it models a failure at
 * the API boundary. Up to 64 faults may be pending; they count calls independently.
 * Returns 0, or -1 for an unknown name, nth < 1, count < 1, code <= 0, or a full
 * table. */
CYCTXSIM_API int cyctxsim_inject_fault(const char *name, int nth, int code, int count);

/* Drop every pending fault. */
CYCTXSIM_API void cyctxsim_clear_faults(void);

/* Calls of the driver function `name` since the library was loaded, all ABI
 * variants together, failed and faulted calls included. NULL: all driver calls.
 * -1 for a name the simulator does not implement. */
CYCTXSIM_API long long cyctxsim_call_count(const char *name);

/* Make the nth next call (1 = the very next) of the driver function `name` (base name,
 * every ABI variant) wait, on whichever thread makes it, until cyctxsim_unstall(): it is
 * counted, then held before it does anything (faults and the initialisation check come
 * after). One stall at a time. Returns 0, or -1 for an unknown name, nth < 1, or a stall
 * already armed or holding a thread. */
CYCTXSIM_API int cyctxsim_stall(const char *name, int nth);

/* As cyctxsim_stall, but the call does its work first and is held as it returns: after all
 * it did (its CUPTI resource events included), before its exit is reported to a CUPTI
 * subscriber. Only for the context calls a subscriber sees (see "Callbacks"); -1 for any
 * other name. It shares cyctxsim_stalled, cyctxsim_unstall and "one stall at a time". */
CYCTXSIM_API int cyctxsim_stall_at_return(const char *name, int nth);

/* Threads held by a stall now (0 or 1). */
CYCTXSIM_API int cyctxsim_stalled(void);

/* Let a held call go on (and disarm a stall that has not fired). */
CYCTXSIM_API void cyctxsim_unstall(void);

/* Callbacks: CUPTI's callback API for the context calls the simulator implements is the
 * simulated libcupti.so.13 beside this library (simcupti.c), which a CUPTI client (cyctx's
 * tracer) finds and loads as it would NVIDIA's. The runtime calls below report
 * themselves in its runtime domain (2). */

/* Runtime: the context calls of a CUDA 12+ runtime (libcudart), made as it makes them, so that
 * a CUPTI subscriber sees the driver calls inside them (simdriver.c, "The runtime's context
 * calls"). cudaSetDevice: the device's primary context made current, and retained by the
 * runtime the first time. cudaDeviceReset: the current device's primary context reset, the
 * runtime's retain given up. Both report themselves in the runtime domain (2) with
 * CUpti_CallbackData; they return driver codes (0: success). */
CYCTXSIM_API int cyctxsim_cudaSetDevice(int device);
CYCTXSIM_API int cyctxsim_cudaDeviceReset(void);

/* Not a function: with the environment variable CYCTX_SIM_REPORT_AT_EXIT set (and not
 * "0"), the library prints one line to stderr when it is unloaded at process exit,
 *   cyctxsim at exit: retains=[r0, r1, ...] active=[a0, a1, ...] live_contexts=N
 * (per device: primary reference count, 1 if active), so a test can check that
 * interpreter shutdown released everything. */

#ifdef __cplusplus
}
#endif

#endif /* CYCTX_SIMDRIVER_H */
