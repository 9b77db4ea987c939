// The strand of the code running on this thread (blocks.h): what differs between code that can
// interleave on one thread. Two builds read it (docs/design.md, "Block identity"):
// * tested (the CPython versions whose internals _cpython.h knows: those the suite runs on): the
//   thread state's contextvars Context and its chain of running generators' exception-state
//   items, read from the thread state's fields (_cpython.h).
// * plain (any other CPython, or CYCTX_PLAIN_PROTOCOL=1 at build time): public API only. Neither
//   the Context nor the generator chain can be read exactly (a generator-based scheduler, trio's
//   for one, sits outermost in every task's frames), so no strand is told from another: an exit
//   without its tag takes the guard's sole entry on the thread, or is refused.
// GIL: held by every caller.
// Not noexcept: block_context allocates, which can run Python code (methods.h says why).
#pragma once
#include <Python.h>
#include "_cpython.h"

#if defined(CYCTX_PLAIN_PROTOCOL) || !CYCTX_CPYTHON_KNOWN
#define CYCTX_PLAIN 1
#else
#define CYCTX_PLAIN 0
#endif

namespace cyctx {

#if CYCTX_PLAIN

static const char g_unknown_context = 0;  // the Context of every Python entry: unreadable here

inline PyThreadState *block_tstate() { return PyThreadState_Get(); }
inline const void *block_context(PyThreadState *) { return &g_unknown_context; }

// What a binding and the enter it announces share: the frame running both (`with` binds and
// enters from the frame of its own statement). A frame of another strand is another object,
// alive while that strand is suspended.
inline const void *block_item_now(PyThreadState *) { return PyEval_GetFrame(); }

inline void block_items(PyThreadState *, const void **inner, const void **root) {
    *inner = *root = nullptr;
}

inline bool block_running(PyThreadState *, const void *) { return false; }

// No strand is told from another: an exit without its tag takes the guard's sole entry on the
// thread, or refuses.
inline bool strand_told(const void *, const void *) { return false; }

#else  // tested

inline PyThreadState *block_tstate() { return cyctx_tstate(); }

// The thread's contextvars Context, made if it has none yet (what contextvars.copy_context()
// does on first use), so that strands that never set a context variable still differ. NULL
// only when memory ran out (the exception cleared: the block then has no strand of its own, and
// its exit is found by tag or refused).
inline const void *block_context(PyThreadState *ts) {
    if (!cyctx_ts_context(ts)) {
        PyObject *copy = PyContext_CopyCurrent();  // creates the thread's context first
        if (!copy) {
            PyErr_Clear();
            return nullptr;
        }
        Py_DECREF(copy);
    }
    return cyctx_ts_context(ts);
}

// Each running generator, CPython's or Cython's, pushes an exception-state item on the thread's
// chain (its base, ts->exc_state, is the thread's own).
inline const void *block_item_now(PyThreadState *ts) { return cyctx_ts_exc_info(ts); }

inline void block_items(PyThreadState *ts, const void **inner, const void **root) {
    _PyErr_StackItem *base = cyctx_ts_exc_base(ts), *it = cyctx_ts_exc_info(ts);
    if (it == base || !it) {
        *inner = *root = nullptr;
        return;
    }
    *inner = it;
    while (it->previous_item && it->previous_item != base) it = it->previous_item;
    *root = it;
}

inline bool block_running(PyThreadState *ts, const void *item) {
    _PyErr_StackItem *base = cyctx_ts_exc_base(ts);
    for (_PyErr_StackItem *it = cyctx_ts_exc_info(ts); it && it != base; it = it->previous_item)
        if (it == item) return true;
    return false;
}

inline bool strand_told(const void *ctx, const void *) { return ctx != nullptr; }

#endif

}  // namespace cyctx
