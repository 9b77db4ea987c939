// Which `with guard:` block a Python enter or exit belongs to: the tag of the `with`
// statement's exit binding, else the strand (strand.h), else refused with nothing changed
// (docs/guarantees.md, "Which block an exit belongs to"; docs/design.md, "Block identity").
// GIL: held by every caller.
// No function here is noexcept: a thread's first block makes its contextvars Context (strand.h),
// an allocation that can run finalizers, and so Python code (methods.h says why that matters).
#pragma once
#include <Python.h>
#include <cstdint>
#include "_cpp/thread_entries.h"
#include "strand.h"

namespace cyctx {

// The exit binding `with` made of a guard just before it enters it (methods.h announces it, the
// enter takes it). Kept in the guard (its _announced words), not per thread: no thread-local
// access on the way. Tagged only when the enter runs in the thread and strand of the binding.
struct Pending {
    const void *ts;             // the thread state that made the binding (NULL: none)
    unsigned long long serial;  // the binding's
    const void *ctx;            // the strand it was made in
    const void *item;
};
static_assert(sizeof(Pending) == 4 * sizeof(unsigned long long), "ContextGuard._announced");

// On a free-threaded build threads bind and enter one guard at once: each word is read and
// written whole (relaxed atomics), and a mix of two threads' words is harmless: an enter takes
// a tag only from its own thread's announcement, and a tag is matched only by the exit binding
// that made it, on the thread of its entry.
#ifdef Py_GIL_DISABLED
template <class T> inline T pending_get(T *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
template <class T> inline void pending_set(T *p, T v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
#else
template <class T> inline T pending_get(T *p) { return *p; }
template <class T> inline void pending_set(T *p, T v) { *p = v; }
#endif

// Called by methods.h when `with` binds an exact guard's __exit__.
inline void block_expect(void *announced, unsigned long long serial) {
    PyThreadState *ts = block_tstate();
    Pending *p = static_cast<Pending *>(announced);
#ifdef Py_GIL_DISABLED
    pending_set(&p->serial, serial);
    pending_set(&p->ctx, block_context(ts));
    pending_set(&p->item, block_item_now(ts));
    pending_set(&p->ts, static_cast<const void *>(ts));
#else
    *p = Pending{ts, serial, block_context(ts), block_item_now(ts)};
#endif
}

// The binding `serial` is being called: it no longer announces an enter.
inline void block_called(void *announced, unsigned long long serial) {
    Pending *p = static_cast<Pending *>(announced);
    if (pending_get(&p->serial) == serial) pending_set(&p->ts, static_cast<const void *>(nullptr));
}

inline void block_strand(PyThreadState *ts, BlockId *id) {
    id->ctx = block_context(ts);
    block_items(ts, &id->inner, &id->root);
}

// The identity of the block a Python enter of the guard whose announcement is `announced` opens.
inline void block_here(void *announced, BlockId *id) {
    PyThreadState *ts = block_tstate();
    block_strand(ts, id);
    Pending *p = static_cast<Pending *>(announced);
    id->tag = 0;
    if (pending_get(&p->ts) == ts) {  // this thread's announcement: taken, tagging or not
        if (pending_get(&p->ctx) == id->ctx && pending_get(&p->item) == block_item_now(ts))
            id->tag = pending_get(&p->serial);
        pending_set(&p->ts, static_cast<const void *>(nullptr));
    }
}

enum { kTop = 0, kOwn = 1, kSpliced = 2, kHanded = 3, kNone = -1, kAmbiguous = -2 };

// Which open entry of `token` on this thread is the exit's own (its index), by the rule above:
// kOwn, or kNone (no entry of the guard here), or kAmbiguous (several could be, none is told).
// `serial`: the exit binding it was called through (0: the plain method).
inline int block_search(unsigned long long token, unsigned long long serial, std::size_t *at,
                        std::size_t *candidates) {
    Stack &s = *my_stack();
    std::size_t n = 0, last = 0;
    for (std::size_t i = s.depth; i-- > 0;) {
        Entry *e = slot(s, i);
        if (e->token != token) continue;
        if (serial && e->id.tag == serial) {
            *at = i;
            return kOwn;
        }
        if (!n) last = i;
        n++;
    }
    *candidates = n;
    if (n == 0) return kNone;
    if (n == 1) {  // the guard's one entry here: every exit has an enter, so it is this one's
        *at = last;
        return kOwn;
    }
    PyThreadState *ts = block_tstate();
    BlockId x;
    block_strand(ts, &x);
    // The same strand, at the same generator: the innermost such entry (a strand runs its own
    // blocks in order).
    const bool told = strand_told(x.ctx, x.root);
    if (told) {
        for (std::size_t i = s.depth; i-- > 0;) {
            Entry *e = slot(s, i);
            if (e->token == token && e->id.ctx == x.ctx && e->id.inner == x.inner && e->id.root == x.root) {
                *at = i;
                return kOwn;
            }
        }
    }
    // The same strand (context and outermost coroutine), through a wrapper at another depth:
    // entries made by code still running around the exit (an ExitStack's enter_context in the
    // task, left from its __aexit__) run their blocks in order, so the innermost is the exit's;
    // an entry made inside a generator or coroutine that is not running now (an `async def
    // __aenter__` that returned) is the exit's only when it is the one candidate, since a
    // suspended generator of the same strand holding a block looks the same. Both kinds at once:
    // refused.
    std::size_t running = 0, stopped = 0, top_running = 0, the_stopped = 0;
    if (told) {
        for (std::size_t i = s.depth; i-- > 0;) {
            Entry *e = slot(s, i);
            if (e->token != token || e->id.ctx != x.ctx || e->id.root != x.root) continue;
            if (!e->id.inner || block_running(ts, e->id.inner)) {
                if (!running++) top_running = i;
            } else {
                stopped++;
                the_stopped = i;
            }
        }
    }
    if (running && !stopped) {
        *at = top_running;
        return kOwn;
    }
    if (stopped == 1 && !running) {
        *at = the_stopped;
        return kOwn;
    }
    return kAmbiguous;
}

// The slow path of block_find (out of line, so that the fast path stays small enough to inline
// into the exit): the innermost entry is not plainly this exit's own.
__attribute__((noinline)) inline int block_find_slow(unsigned long long token, unsigned long long serial,
                                                     std::size_t *at, std::size_t *dropped,
                                                     std::size_t *candidates) {
    Stack &s = *my_stack();
    int r = block_search(token, serial, at, candidates);
    if (r != kOwn || *at + 1 == s.depth) return r;
    *dropped = tls_drop_dead_top(token);
    if (*at + 1 == s.depth) return kOwn;
    // Above it only entries of this guard made through wrappers in the same strand (a helper
    // that entered for its caller and returned): the same context is current whichever is left
    // first, so handing this entry's restore to them is no disorder.
    const Entry *own = slot(s, *at);
    for (std::size_t j = *at + 1; j < s.depth; j++) {
        const Entry *e = slot(s, j);
        if (e->token != token || e->id.tag || e->id.ctx != own->id.ctx || e->id.root != own->id.root)
            return kSpliced;
    }
    return kHanded;
}

// A Python exit's own entry, for the driver layer to take. kTop: the innermost, tagged with the
// exit's binding (the common case, found at a glance). kOwn: the innermost, found by the rule
// above (after the drop of dead guards' entries above it, counted in *dropped). Both are popped.
// kSpliced: it lies under an open block, at index *at, to be spliced out from there; kHanded:
// the same, under entries of the same guard and strand only (no disorder). kNone, kAmbiguous:
// nothing to take, nothing changed but the drop.
inline int block_find(unsigned long long token, unsigned long long serial, std::size_t *at,
                      std::size_t *dropped, std::size_t *candidates) {
    // The stack as it is (not made: no entries, the slow path says so), so that the pop that
    // follows reads it again for free.
    Stack *s = t_stack;
    if (s && s->depth) {
        Entry *e = slot(*s, s->depth - 1);
        if (serial && e->token == token && e->id.tag == serial) return kTop;
    }
    int r = block_find_slow(token, serial, at, dropped, candidates);
    if (r == kTop) __builtin_unreachable();  // so the exit's fast path never merges with it
    return r;
}

// What is known of the i-th open entry of `token` on this thread, innermost first, for an error
// message: kSameStrand (entered in the context now current), kInside (inside a generator or
// coroutine that is not running now), kTagged (entered by `with guard:` itself), kNogil (by the
// nogil enter()); -1 past the last.
enum { kSameStrand = 1, kInside = 2, kTagged = 4, kNogil = 8 };
inline int block_describe(unsigned long long token, std::size_t i) {
    Stack &s = *my_stack();
    PyThreadState *ts = block_tstate();
    for (std::size_t j = s.depth; j-- > 0;) {
        Entry *e = slot(s, j);
        if (e->token != token || i--) continue;
        if (!e->id.ctx) return kNogil;
        BlockId x;
        block_strand(ts, &x);
        bool same = strand_told(x.ctx, x.root) && e->id.ctx == x.ctx;
        int what = same ? kSameStrand : 0;
        if (e->id.inner && !block_running(ts, e->id.inner)) what |= kInside;
        if (e->id.tag) what |= kTagged;
        return what;
    }
    return -1;
}

}  // namespace cyctx
