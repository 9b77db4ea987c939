// Which `with guard:` block a Python enter or exit belongs to (the `block` of thread_entries.h's
// Entry). GIL: held by every caller (Python's __enter__/__exit__).
//
// A block is keyed by what stays the same from its enter to its exit, and differs between
// blocks that can be open at once on one thread:
// * Inside a generator or coroutine (CPython's or Cython's, which has no frame of its own), the
//   running generator: the thread's exception-state item, `tstate->exc_info`, which each running
//   generator pushes (it lies inside the generator object). A generator's block is left from
//   the generator itself, also when it is closed from elsewhere or collected, so its enter and
//   its exit see the same item. Tagged with the low bit (frames are never odd).
// * Elsewhere (a thread's or a greenlet's plain code), the Python frame running the statement.
// Frames that only forward the protocol are skipped first: any `__enter__`, `__exit__`,
// `__aenter__` or `__aexit__` (a subclass or a wrapper object calling the guard's own), and
// contextlib's (ExitStack, AsyncExitStack), so the key is that of the code running the `with`.
// Skipping a generator or coroutine frame (an `async def __aexit__`) also pops its item.
// The common case, a frame that forwards nothing, is one code-object look.
#pragma once
#include <Python.h>
#include <cstdint>
#include "_cpp/thread_entries.h"

namespace cyctx {

struct BlockNames {
    PyObject *enter, *exit, *aenter, *aexit;  // interned method names
    PyObject *contextlib;                     // contextlib's co_filename
};
static BlockNames g_block_names;  // set once at module import (block_names_init)

inline bool block_ended(const void *block, const void *exit_key) noexcept;

inline int block_names_init(PyObject *contextlib_file) noexcept {
    block_ended_hook = block_ended;
    g_block_names.enter = PyUnicode_InternFromString("__enter__");
    g_block_names.exit = PyUnicode_InternFromString("__exit__");
    g_block_names.aenter = PyUnicode_InternFromString("__aenter__");
    g_block_names.aexit = PyUnicode_InternFromString("__aexit__");
    Py_INCREF(contextlib_file);
    g_block_names.contextlib = contextlib_file;
    return g_block_names.enter && g_block_names.exit && g_block_names.aenter && g_block_names.aexit ? 0 : -1;
}

inline PyThreadState *block_tstate() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

// A frame that only forwards the protocol to the guard.
inline bool block_forwards(PyCodeObject *co) noexcept {
    PyObject *n = co->co_name;
    const BlockNames &b = g_block_names;
    return n == b.exit || n == b.enter || n == b.aexit || n == b.aenter || co->co_filename == b.contextlib;
}

inline const void *block_tag(_PyErr_StackItem *item) noexcept {
    return reinterpret_cast<const void *>(reinterpret_cast<std::uintptr_t>(item) | 1);
}

inline bool block_is_frame(const void *block) noexcept {
    return block && !(reinterpret_cast<std::uintptr_t>(block) & 1);
}

__attribute__((noinline)) inline const void *block_key_slow(PyFrameObject *f, PyThreadState *ts) noexcept {
    _PyErr_StackItem *item = ts->exc_info;
    Py_INCREF(f);
    while (f) {
        PyCodeObject *co = PyFrame_GetCode(f);
        bool fwd = block_forwards(co);
        bool gen = co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE);
        Py_DECREF(co);
        if (!fwd) break;
        if (gen && item != &ts->exc_state && item->previous_item) item = item->previous_item;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    // A frame found here is running (the chain from the current frame), so its reference may go.
    Py_XDECREF(f);
    return item != &ts->exc_state ? block_tag(item) : static_cast<const void *>(f);
}

// The key of the block that the current Python code is entering or leaving.
inline const void *block_key() noexcept {
    PyThreadState *ts = block_tstate();
    PyFrameObject *f = PyEval_GetFrame();  // borrowed
    if (f) {
        PyCodeObject *co = PyFrame_GetCode(f);
        bool fwd = block_forwards(co);
        Py_DECREF(co);
        if (fwd) return block_key_slow(f, ts);
    }
    _PyErr_StackItem *item = ts->exc_info;
    return item != &ts->exc_state ? block_tag(item) : static_cast<const void *>(f);
}

// A Python exit's pop (the nogil exit's is thread_entries.h's tls_pop_own): its block's key
// into *key, then the entry taken as tls_pop_own_slow does. When the innermost entry is this
// guard's and was made by the code running now (this frame, or this generator), it is the
// exit's own and no frame is looked at: a block's exit mostly runs where its enter ran. (Were
// the running frame one that forwards, at the address of a returned frame that made the entry,
// block_key() would lead to the same entry, since tls_pop_own_slow takes an ended block's
// entry.) Otherwise the key is block_key()'s.
inline int tls_pop_python(unsigned long long token, cyctx_Switch *out, std::size_t *dropped,
                          const void **key) noexcept {
    Stack &s = *my_stack();
    if (s.depth) {
        Entry *e = slot(s, s.depth - 1);
        if (e->token == token) {
            // The running generator first: a Cython generator runs on its caller's frame.
            PyThreadState *ts = block_tstate();
            _PyErr_StackItem *item = ts->exc_info;
            const void *here =
                item != &ts->exc_state ? block_tag(item) : static_cast<const void *>(PyEval_GetFrame());
            if (e->block == here) {
                *key = here;
                *out = e->sw;
                s.depth--;
                return 0;
            }
        }
    }
    *key = block_key();
    return tls_pop_own_slow(token, *key, out, dropped);
}

// Whether the block of the entry `block`, innermost but not the exit's own, has ended: its
// frame has returned. Slow path of a Python exit whose key is `exit_key`. Frames are compared
// by address, never touched.
// * The exit runs in plain code (its key a frame F): an entry made after F's own by plain code
//   can only be a callee's of F, and the only frames running above F now are the ones that
//   forward this exit; so the entry's frame has returned. No frame is walked: frame objects of
//   the frames below F are made on demand, and a new one may sit at the freed frame's address.
// * The exit runs in a generator: the entry may be that of a frame that resumed it, so the
//   running stack is searched (a frame made on demand at a freed address can only make an
//   ended block look running: the exit is then refused, never given a wrong entry).
// With greenlet loaded a frame off the running stack may be a suspended greenlet's: taken as
// running.
inline bool block_ended(const void *block, const void *exit_key) noexcept {
    if (!block_is_frame(block)) return false;
    if (!block_is_frame(exit_key) && exit_key) {
        PyFrameObject *f = PyEval_GetFrame();
        Py_XINCREF(f);
        while (f) {
            // A frame that forwards is no block: one may run at the address of the frame that
            // died (frames are freed and reused).
            PyCodeObject *co = PyFrame_GetCode(f);
            bool fwd = block_forwards(co);
            Py_DECREF(co);
            if (!fwd && static_cast<const void *>(f) == block) {
                Py_DECREF(f);
                return false;
            }
            PyFrameObject *back = PyFrame_GetBack(f);
            Py_DECREF(f);
            f = back;
        }
    }
    PyObject *name = PyUnicode_FromString("greenlet");
    if (!name) {
        PyErr_Clear();
        return false;
    }
    PyObject *m = PyImport_GetModule(name);
    Py_DECREF(name);
    if (!m) {
        PyErr_Clear();
        return true;
    }
    Py_DECREF(m);
    return false;
}

}  // namespace cyctx
