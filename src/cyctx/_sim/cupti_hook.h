/*
 * cupti_hook.h -- what the simulated driver (simdriver.c, libcuda.so.1) and the simulated CUPTI
 * (simcupti.c, libcupti.so.13) share, as NVIDIA's CUPTI and driver share a private interface.
 * C only; neither library's users see it.
 *
 * The driver owns one CyctxsimCuptiHook and hands it out (cyctxsim_cupti_hook). The simulated
 * CUPTI keeps in it the union of its subscribers' enabled callbacks (`enabled`, `any`) and the
 * function that delivers a callback to them (`fire`); the driver reads `any` and `enabled`
 * without a lock before each traced call, and calls `fire` at each enabled entry, exit and
 * resource event, on the calling thread (resource events with the driver's lock held).
 */
#ifndef CYCTX_CUPTI_HOOK_H
#define CYCTX_CUPTI_HOOK_H

#include <stdatomic.h>
#include <stdint.h>

#define CYCTXSIM_CB_DOMAINS 7     /* CUPTI_CB_DOMAIN_SIZE of CUDA 13 (INVALID .. STATE) */
#define CYCTXSIM_CB_IDS 1024      /* callback ids per domain the bitmaps hold */

typedef void (*CyctxsimCuptiFire)(int domain, uint32_t cbid, const void *data);

typedef struct {
    _Atomic int any;                                                 /* some callback enabled */
    _Atomic uint64_t enabled[CYCTXSIM_CB_DOMAINS][CYCTXSIM_CB_IDS / 64];
    _Atomic(CyctxsimCuptiFire) fire;                                 /* NULL until attached */
} CyctxsimCuptiHook;

/* Exported by the simulated libcuda.so.1. */
CyctxsimCuptiHook *cyctxsim_cupti_hook(void);

#endif /* CYCTX_CUPTI_HOOK_H */
