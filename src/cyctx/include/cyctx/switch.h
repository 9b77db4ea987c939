/* The record of one switch of the current context: what switch_to() replaced, for
 * switch_back(); a guard's per-thread entry (_cpp/thread_entries.h) holds one too, so a guard's exit and
 * switch_back() restore through the same code from the same record.
 *
 * It is part of the Cython contract (_guard.pxd declares it from here), so it is plain C: a
 * module that cimports cyctx includes it, whether compiled as C or C++. That module finds it
 * through cyctx.get_include(), under a directory named cyctx so that it cannot be taken for
 * a header of the module's own. */
#ifndef CYCTX_SWITCH_H
#define CYCTX_SWITCH_H

#include <cuda.h> /* through cyctx.get_include(): says what to do when none is on the path */

typedef struct cyctx_Switch {
    CUcontext prev;               /* current before the switch (NULL: none) */
    /* prev's cuCtxGetId at the switch. A handle can outlive its context and be reused for a
     * new one; the id tells whether prev is still what it was. 0: prev was already dead
     * (destroyed, its handle still known to the driver); CYCTX_PREV_UNKNOWN: the driver did
     * not know the handle at all, so no context found there later is prev. */
    unsigned long long prev_id;
    int switched;                 /* 1: the switch changed the current context */
} cyctx_Switch;

#define CYCTX_PREV_UNKNOWN (~0ULL)

#endif
