// The bound __enter__/__exit__ a `with` makes of an exact ContextGuard: small method objects
// from a free list that call the guard's C code directly and stand for the plain bound methods
// in everything else (docs/design.md, "The quick bound methods"). Public CPython API only.
// GIL: held; on a free-threaded build other threads run meanwhile: the binding serial is an
// atomic counter there, and there is no free list (one list for all threads would need a lock;
// the interpreter's allocator keeps a heap per thread).
// No function here is noexcept: each can run Python code (a call, a finalizer, a warning), and
// a daemon thread that wants the GIL back while the interpreter finalizes is ended there by
// pthread_exit (CPython 3.11-3.13), whose unwinding a noexcept frame turns into std::terminate.
#pragma once
#include <Python.h>
#include "blocks.h"

namespace cyctx {

typedef PyObject *(*enter_impl_t)(PyObject *self);
// `serial`: the binding's (blocks.h's tag), 0 when called as the plain method.
typedef PyObject *(*exit_impl_t)(PyObject *self, PyObject *exc_type, PyObject *exc, PyObject *tb,
                                 unsigned long long serial);
typedef void *(*announced_of_t)(PyObject *self);

struct Slot {
    PyObject_HEAD
    PyObject *method;        // the method it replaces (a Cython function), for everything else
    PyTypeObject *owner;     // ContextGuard: only its exact instances get a Bound
    enter_impl_t enter;      // one of the two is set
    exit_impl_t exit;
    announced_of_t announced_of;  // where the guard keeps its exit binding's announcement (blocks.h)
};

struct Bound {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *self;          // the guard (a strong reference)
    Slot *slot;              // borrowed: a Slot lives in the class's dict for the process's life
    PyObject *weakreflist;   // weak references to it (weakref.ref, WeakSet, finalize)
    unsigned long long serial;  // an exit binding's, never reused (blocks.h's tag); 0 for __enter__
    Bound *next_free;
};

static unsigned long long g_serial = 0;  // the last serial given (next_serial)

inline unsigned long long next_serial() {
#ifdef Py_GIL_DISABLED
    return __atomic_add_fetch(&g_serial, 1, __ATOMIC_RELAXED);
#else
    return ++g_serial;  // the GIL orders every binding
#endif
}

// The plain bound method a Bound stands for (a new reference), for everything but the call.
inline PyObject *bound_plain(Bound *b) {
    PyObject *m = b->slot->method;
    return Py_TYPE(m)->tp_descr_get(m, b->self, reinterpret_cast<PyObject *>(Py_TYPE(b->self)));
}

// A call the quick path does not take (other arguments, keywords): the plain method's, which
// also gives its errors.
inline PyObject *bound_call_plain(Bound *b, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *m = bound_plain(b);
    if (!m) return nullptr;
    PyObject *r = PyObject_Vectorcall(m, args, nargsf, kwnames);
    Py_DECREF(m);
    return r;
}

inline PyObject *bound_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Bound *b = reinterpret_cast<Bound *>(callable);
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (!kwnames) {
        if (b->slot->enter && n == 0) return b->slot->enter(b->self);
        if (b->slot->exit && n == 3) {
            block_called(b->slot->announced_of(b->self), b->serial);
            return b->slot->exit(b->self, args[0], args[1], args[2], b->serial);
        }
    }
    return bound_call_plain(b, args, nargsf, kwnames);
}

#ifdef Py_GIL_DISABLED
enum { kFreeMax = 0 };  // see the head comment
#else
enum { kFreeMax = 16 };
#endif
static Bound *g_free = nullptr;
static int g_nfree = 0;

inline void bound_dealloc(PyObject *o) {
    Bound *b = reinterpret_cast<Bound *>(o);
    if (b->weakreflist) PyObject_ClearWeakRefs(o);
    PyObject *self = b->self;
    b->self = nullptr;
    if (g_nfree < kFreeMax) {
        b->next_free = g_free;
        g_free = b;
        g_nfree++;
    } else {
        PyObject_Free(b);
    }
    Py_DECREF(self);  // last: freeing the guard may run Python code (its ResourceWarning)
}

inline PyObject *bound_getattro(PyObject *o, PyObject *name) {
    PyObject *m = bound_plain(reinterpret_cast<Bound *>(o));
    if (!m) return nullptr;
    PyObject *r = PyObject_GetAttr(m, name);
    Py_DECREF(m);
    return r;
}

inline PyObject *bound_repr(PyObject *o) {
    PyObject *m = bound_plain(reinterpret_cast<Bound *>(o));
    if (!m) return nullptr;
    PyObject *r = PyObject_Repr(m);
    Py_DECREF(m);
    return r;
}

static PyTypeObject BoundType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// As a method object: equal to another bound to the same guard for the same function,
// whether it is one of these or a plain method (types.MethodType(ContextGuard.__enter__, g));
// the hash is the plain method's.
inline PyObject *bound_richcompare(PyObject *a, PyObject *b, int op) {
    if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
    Bound *x = reinterpret_cast<Bound *>(a);
    bool eq;
    if (Py_TYPE(b) == &BoundType) {
        Bound *y = reinterpret_cast<Bound *>(b);
        eq = x->self == y->self && x->slot == y->slot;
    } else if (PyMethod_Check(b)) {
        eq = PyMethod_GET_SELF(b) == x->self && PyMethod_GET_FUNCTION(b) == x->slot->method;
    } else {
        Py_RETURN_NOTIMPLEMENTED;
    }
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

inline Py_hash_t bound_hash(PyObject *o) {
    PyObject *m = bound_plain(reinterpret_cast<Bound *>(o));
    if (!m) return -1;
    Py_hash_t h = PyObject_Hash(m);
    Py_DECREF(m);
    return h;
}

// type(m)(func, self), as weakref.WeakMethod rebuilds the method it holds: a plain method.
inline PyObject *bound_new(PyTypeObject *, PyObject *args, PyObject *kw) {
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "bound_method() takes no keyword arguments");
        return nullptr;
    }
    PyObject *func, *self;
    if (!PyArg_UnpackTuple(args, "bound_method", 2, 2, &func, &self)) return nullptr;
    return PyMethod_New(func, self);
}

inline PyObject *slot_get(PyObject *descr, PyObject *obj, PyObject *type) {
    Slot *s = reinterpret_cast<Slot *>(descr);
    if (!obj || Py_TYPE(obj) != s->owner) return Py_TYPE(s->method)->tp_descr_get(s->method, obj, type);
    Bound *b = kFreeMax > 0 ? g_free : nullptr;
    if (b) {
        g_free = b->next_free;
        g_nfree--;
        // A free-listed Bound is a freed object: made live again as a new one.
        (void)PyObject_Init(reinterpret_cast<PyObject *>(b), &BoundType);
    } else {
        b = PyObject_New(Bound, &BoundType);
        if (!b) return nullptr;
    }
    b->vectorcall = bound_call;
    b->self = Py_NewRef(obj);
    b->slot = s;
    b->weakreflist = nullptr;
    b->serial = 0;
    if (s->exit) {
        b->serial = next_serial();
        block_expect(s->announced_of(obj), b->serial);
    }
    return reinterpret_cast<PyObject *>(b);
}

inline PyObject *slot_getattro(PyObject *o, PyObject *name) {
    return PyObject_GetAttr(reinterpret_cast<Slot *>(o)->method, name);
}

inline PyObject *slot_repr(PyObject *o) {
    return PyObject_Repr(reinterpret_cast<Slot *>(o)->method);
}

// Calling ContextGuard.__dict__["__enter__"] directly: as the method it replaces.
inline PyObject *slot_call(PyObject *o, PyObject *args, PyObject *kw) {
    return PyObject_Call(reinterpret_cast<Slot *>(o)->method, args, kw);
}

static PyTypeObject SlotType = {PyVarObject_HEAD_INIT(nullptr, 0)};

inline int slot_types_ready() {
    if (BoundType.tp_name) return 0;
    BoundType.tp_name = "cyctx._guard.bound_method";
    BoundType.tp_basicsize = sizeof(Bound);
    BoundType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    BoundType.tp_doc = "A ContextGuard's bound __enter__ or __exit__ (see the method).";
    BoundType.tp_dealloc = bound_dealloc;
    BoundType.tp_vectorcall_offset = offsetof(Bound, vectorcall);
    BoundType.tp_call = PyVectorcall_Call;
    BoundType.tp_getattro = bound_getattro;
    BoundType.tp_repr = bound_repr;
    BoundType.tp_richcompare = bound_richcompare;
    BoundType.tp_hash = bound_hash;
    BoundType.tp_weaklistoffset = offsetof(Bound, weakreflist);
    BoundType.tp_new = bound_new;
    SlotType.tp_name = "cyctx._guard.method_slot";
    SlotType.tp_basicsize = sizeof(Slot);
    SlotType.tp_flags = Py_TPFLAGS_DEFAULT;
    SlotType.tp_doc = "ContextGuard's __enter__ or __exit__ (see the method).";
    SlotType.tp_descr_get = slot_get;
    SlotType.tp_getattro = slot_getattro;
    SlotType.tp_repr = slot_repr;
    SlotType.tp_call = slot_call;
    if (PyType_Ready(&BoundType) < 0 || PyType_Ready(&SlotType) < 0) return -1;
    return 0;
}

// Put Slots in place of `cls`'s __enter__ and __exit__ (a static type: its dict is set at
// module initialisation, before any instance is made, as Cython's own set-up does).
inline int install_quick_with(PyObject *cls, void *enter, void *exit, void *announced_of) {
    if (slot_types_ready() < 0) return -1;
    PyTypeObject *t = reinterpret_cast<PyTypeObject *>(cls);
    PyObject *dict = t->tp_dict;
    const char *names[2] = {"__enter__", "__exit__"};
    for (int i = 0; i < 2; i++) {
        PyObject *method = PyDict_GetItemString(dict, names[i]);  // borrowed
        if (!method || !Py_TYPE(method)->tp_descr_get) {
            PyErr_Format(PyExc_RuntimeError, "cyctx: %s.%s is not a method", t->tp_name, names[i]);
            return -1;
        }
        Slot *s = PyObject_New(Slot, &SlotType);
        if (!s) return -1;
        s->method = Py_NewRef(method);
        s->owner = t;
        s->enter = i == 0 ? reinterpret_cast<enter_impl_t>(enter) : nullptr;
        s->exit = i == 1 ? reinterpret_cast<exit_impl_t>(exit) : nullptr;
        s->announced_of = reinterpret_cast<announced_of_t>(announced_of);
        int r = PyDict_SetItemString(dict, names[i], reinterpret_cast<PyObject *>(s));
        Py_DECREF(s);
        if (r < 0) return -1;
    }
    PyType_Modified(t);
    return 0;
}

}  // namespace cyctx
