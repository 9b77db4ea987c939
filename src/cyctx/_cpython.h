/* CPython's internals that cyctx reads, in one file, so that a new CPython release is this file:
 * the versions whose layout is known, the thread state's fields that the Python-protocol layer
 * reads (_protocol/strand.h), the frame layout that the tracer reads (_trace/tracer.c), whether
 * the interpreter is finalizing, and what a free-threaded build needs besides (a reference
 * taken only from a live object, a wait that lets the interpreter stop the thread).
 *
 * Stateless (macros and static inline functions), so both extensions compile it; plain C, so the
 * guard (C++) and the tracer (C) both can. The frame layout needs the interpreter's core
 * headers, which only a C file may include: a file defines CYCTX_CPYTHON_WANT_FRAMES before
 * including this one to get it. */
#ifndef CYCTX_CPYTHON_H
#define CYCTX_CPYTHON_H

#include <Python.h>
#include <sched.h>
#include <stdint.h>

/* The versions whose internals are known here: those the suite runs on. Any other gets public
 * API only (the protocol layer's plain build; no Python frames in a trace). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x03100000
#define CYCTX_CPYTHON_KNOWN 1
#else
#define CYCTX_CPYTHON_KNOWN 0
#endif

/* Free-threaded CPython (no GIL). */
#ifdef Py_GIL_DISABLED
#define CYCTX_FREE_THREADED 1
#else
#define CYCTX_FREE_THREADED 0
#endif

/* Whether the interpreter is finalizing (public API from 3.13). No GIL needed. */
static inline int cyctx_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* The calling thread's state, NULL where it has none. No GIL needed; never fails. */
static inline PyThreadState *cyctx_tstate(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

/* A reference to an object that another thread may be freeing: taken only while its count is
 * above zero (0: not taken). Free-threaded 3.14+: PyUnstable_TryIncRef, for an object that
 * cyctx_enable_try_ref was given once (its count made shared, so that no try can miss it).
 * Elsewhere the GIL is held by the reader and by the last reference's drop, so the object is
 * alive: a plain reference (3.13t has no such call; there the GIL stays on, setup.py). */
#if CYCTX_FREE_THREADED && PY_VERSION_HEX >= 0x030E0000
static inline void cyctx_enable_try_ref(PyObject *o) { PyUnstable_EnableTryIncRef(o); }
static inline int cyctx_try_ref(void *o) { return PyUnstable_TryIncRef((PyObject *)o); }
#else
static inline void cyctx_enable_try_ref(PyObject *o) { (void)o; }
static inline int cyctx_try_ref(void *o) {
    Py_INCREF((PyObject *)o);
    return 1;
}
#endif

/* One turn of a wait for another thread (free-threaded builds), detached from the interpreter
 * meanwhile: it may need to stop every thread (its collector), and a thread that spins attached
 * would hold that up. Called with the thread attached. */
static inline void cyctx_yield_detached(void) {
    Py_BEGIN_ALLOW_THREADS
    sched_yield();
    Py_END_ALLOW_THREADS
}

#if CYCTX_CPYTHON_KNOWN
/* The thread state's contextvars Context (NULL: none made yet) and its chain of exception-state
 * items: each running generator or coroutine pushes one (exc_info, the innermost), down to the
 * thread's own (exc_state). Not public API; one load each. */
static inline PyObject *cyctx_ts_context(PyThreadState *ts) { return ts->context; }
static inline _PyErr_StackItem *cyctx_ts_exc_info(PyThreadState *ts) { return ts->exc_info; }
static inline _PyErr_StackItem *cyctx_ts_exc_base(PyThreadState *ts) { return &ts->exc_state; }
#endif

/* The frame layout (the tracer's): on GIL builds of the known versions, and on the
 * free-threaded 3.14. */
#if defined(CYCTX_CPYTHON_WANT_FRAMES) && CYCTX_CPYTHON_KNOWN && \
    (!CYCTX_FREE_THREADED || (PY_VERSION_HEX >= 0x030E0000 && PY_VERSION_HEX < 0x030F0000))
#define CYCTX_CPYTHON_FRAMES 1
#define Py_BUILD_CORE 1
#if PY_VERSION_HEX >= 0x030E0000
/* 3.14 moved the frame's inline helpers to pycore_interpframe.h; its f_executable is a
 * _PyStackRef (a tagged pointer: PyStackRef_AsPyObjectBorrow strips the tag). */
#include "internal/pycore_interpframe.h"
#else
#include "internal/pycore_frame.h"
#endif
#if CYCTX_FREE_THREADED
#include "internal/pycore_pystate.h" /* HEAD_LOCK */
#endif
#undef Py_BUILD_CORE

#if CYCTX_FREE_THREADED
/* The bytecode f's instruction pointer points into, NULL where that is not known for sure.
 * 3.14t gives each thread its own copy of a code object's bytecode, found in an array that
 * another thread replaces when it grows it and frees once every attached thread has moved on:
 * a thread that is not attached (inside a C call without the GIL) does not hold that back. So
 * the copy's address is taken only where the instruction pointer lies inside it. */
static inline _Py_CODEUNIT *cyctx_frame_bytecode(_PyInterpreterFrame *f, PyCodeObject *co) {
    _Py_CODEUNIT *base = _PyCode_CODE(co); /* copy 0: the code object's own */
    if (f->tlbc_index != 0) {
        _PyCodeArray *tlbc = _PyCode_GetTLBCArray(co);
        if (!tlbc || f->tlbc_index < 0 || f->tlbc_index >= tlbc->size) return NULL;
        base = (_Py_CODEUNIT *)tlbc->entries[f->tlbc_index];
    }
    if (!base || f->instr_ptr < base || f->instr_ptr >= base + Py_SIZE(co)) return NULL;
    return base;
}

/* The interpreter's list of its thread states, which an ending thread unlinks under this
 * lock (its memory freed after): held, the list may be read without the GIL. Nothing may
 * allocate or call Python while it is held. */
static inline void cyctx_threads_lock(void) { HEAD_LOCK(&_PyRuntime); }
static inline void cyctx_threads_unlock(void) { HEAD_UNLOCK(&_PyRuntime); }
#endif

/* The thread's innermost frame (NULL: none), and the one that called f. */
static inline _PyInterpreterFrame *cyctx_frame_top(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030D0000
    return ts->current_frame;
#else
    return ts->cframe ? ts->cframe->current_frame : NULL;
#endif
}

static inline _PyInterpreterFrame *cyctx_frame_next(_PyInterpreterFrame *f) { return f->previous; }

/* The code object f runs, NULL for a frame that is not a complete Python function's (one being
 * set up, or the interpreter's own). */
static inline PyCodeObject *cyctx_frame_code(_PyInterpreterFrame *f) {
#if CYCTX_FREE_THREADED
    /* _PyFrame_IsIncomplete, with cyctx_frame_bytecode's check. */
    if (f->owner >= FRAME_OWNED_BY_INTERPRETER || PyStackRef_IsNull(f->f_executable)) return NULL;
    PyObject *ex = PyStackRef_AsPyObjectBorrow(f->f_executable);
    if (!ex || !PyCode_Check(ex)) return NULL;
    PyCodeObject *co = (PyCodeObject *)ex;
    _Py_CODEUNIT *base = cyctx_frame_bytecode(f, co);
    if (base && f->owner != FRAME_OWNED_BY_GENERATOR && f->instr_ptr < base + co->_co_firsttraceable)
        return NULL;
    return co;
#else
    if (_PyFrame_IsIncomplete(f)) return NULL;
#if PY_VERSION_HEX >= 0x030E0000
    if (PyStackRef_IsNull(f->f_executable)) return NULL;
    PyObject *ex = PyStackRef_AsPyObjectBorrow(f->f_executable);
    return ex && PyCode_Check(ex) ? (PyCodeObject *)ex : NULL;
#elif PY_VERSION_HEX >= 0x030D0000
    PyObject *ex = f->f_executable;
    return ex && PyCode_Check(ex) ? (PyCodeObject *)ex : NULL;
#else
    return f->f_code;
#endif
#endif
}

/* The line f is at (f runs co, from cyctx_frame_code); -1 where it is not known. */
static inline int cyctx_frame_line(_PyInterpreterFrame *f, PyCodeObject *co) {
#if CYCTX_FREE_THREADED
    _Py_CODEUNIT *base = cyctx_frame_bytecode(f, co);
    return base ? PyCode_Addr2Line(co, (int)(f->instr_ptr - base) * (int)sizeof(_Py_CODEUNIT)) : -1;
#else
    return PyCode_Addr2Line(co, _PyInterpreterFrame_LASTI(f) * (int)sizeof(_Py_CODEUNIT));
#endif
}

/* An address inside the C stack frame of the eval loop that runs the thread's innermost Python
 * frame (0: none known): 3.11 and 3.12 keep that activation's _PyCFrame, a local of it, in the
 * thread state; from 3.13 the activation's entry frame, a local of it too, is the first frame
 * of the chain that the C stack owns. A native walk stops at the frame that holds it: the
 * native code called by that Python frame is all below. */
static inline uintptr_t cyctx_eval_boundary(PyThreadState *ts) {
#if PY_VERSION_HEX < 0x030D0000
    return ts->cframe && ts->cframe != &ts->root_cframe ? (uintptr_t)ts->cframe : 0;
#else
    for (_PyInterpreterFrame *f = ts->current_frame; f; f = f->previous) {
#if PY_VERSION_HEX >= 0x030E0000
        if (f->owner >= FRAME_OWNED_BY_INTERPRETER) return (uintptr_t)f;
#else
        if (f->owner == FRAME_OWNED_BY_CSTACK) return (uintptr_t)f;
#endif
    }
    return 0;
#endif
}
#else
#define CYCTX_CPYTHON_FRAMES 0
static inline uintptr_t cyctx_eval_boundary(PyThreadState *ts) {
    (void)ts;
    return 0;
}
#endif

#endif
