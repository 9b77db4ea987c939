// Per-thread record of open guard entries, keyed by the guard's never-reused token: a POD with
// kInline entries made on the thread's first use, spilling to a second block beyond
// (docs/design.md, "Per-thread entries").
#pragma once
#include <cuda.h>
#include <atomic>
#include <cstddef>
#include "registry.h"
#include "cyctx/switch.h"
#include <cstdlib>
#include <cstring>
#include <climits>
#include <pthread.h>

namespace cyctx {

// Which block an entry is: filled by the Python-protocol layer (_protocol/blocks.h) for a Python
// enter, all zero for the nogil enter(). Opaque here: this layer stores and compares, never reads
// what the pointers point to.
struct BlockId {
    unsigned long long tag;  // the serial of the exit binding `with` made for this block (0: none)
    const void *ctx;         // the strand: its contextvars Context (NULL: the nogil enter())
    const void *inner;       // its innermost running generator or coroutine (NULL: none)
    const void *root;        // its outermost running one (NULL: none)
};

// One open entry: whose it is, which block, and the switch its exit undoes (the record
// switch_back uses).
struct Entry {
    unsigned long long token;  // the guard's token (new_token)
    BlockId id;
    cyctx_Switch sw;
};

enum { kInline = 6 };

struct Stack {
    Entry inline_[kInline];
    Entry *heap;         // entries kInline.. when nesting is deeper
    std::size_t cap;     // capacity of heap
    std::size_t depth;   // open entries
    unsigned kept;       // thread-exit rounds it was kept for open entries (free_stack)
};

// This thread's stack is on the heap, made on its first use; the thread-local is its address
// alone, 8 bytes of initial-exec TLS, read with one load relative to the thread pointer. A loaded
// module's TLS of the default (general-dynamic) model costs a __tls_get_addr call per access,
// and initial-exec puts the module's whole TLS block in the static TLS that glibc keeps for
// loaded modules (a few hundred bytes for the whole process): so nothing else of this module is
// thread-local (docs/design.md, "Per-thread entries").
static thread_local Stack *t_stack __attribute__((tls_model("initial-exec")));

// The stack of a thread whose own could not be allocated, or that is past its end: no entries.
// Read-only (every write to a stack is to an entry it holds, and tls_push refuses this one), so
// a write would fault.
static const Stack k_no_stack = {};

// Frees a thread's stack at its exit, as a pthread key's destructor: those run after every C++
// thread_local's destructor (a binding that leaves a guard from one still finds its entry), and
// while blocks are still open the stack is kept for the next round, so that another key's
// destructor can leave them (glibc makes PTHREAD_DESTRUCTOR_ITERATIONS rounds at most). Freed,
// the thread reads k_no_stack: nothing is allocated again for a thread that is ending.
struct StackKey {
    pthread_key_t key;
    bool ok;
};

static void free_stack(void *p) noexcept;

static StackKey &stack_key() noexcept {
    static StackKey k = [] {
        StackKey made{};
        made.ok = pthread_key_create(&made.key, free_stack) == 0;
        return made;
    }();
    return k;
}

static void free_stack(void *p) noexcept {
    Stack *s = static_cast<Stack *>(p);
    if (s->depth && s->kept < PTHREAD_DESTRUCTOR_ITERATIONS - 1 &&
        pthread_setspecific(stack_key().key, s) == 0) {
        s->kept++;
        return;
    }
    t_stack = const_cast<Stack *>(&k_no_stack);
    std::free(s->heap);
    std::free(s);
}

__attribute__((noinline)) static Stack *make_stack() noexcept {
    StackKey &k = stack_key();
    if (!k.ok) return const_cast<Stack *>(&k_no_stack);  // no key: a stack could never be freed
    Stack *s = static_cast<Stack *>(std::calloc(1, sizeof(Stack)));
    if (!s) return const_cast<Stack *>(&k_no_stack);  // tried again on the next access
    if (pthread_setspecific(k.key, s) != 0) {          // out of memory for the key's slot
        std::free(s);
        return const_cast<Stack *>(&k_no_stack);
    }
    t_stack = s;
    return s;
}

// This thread's stack, its address read once per operation.
inline Stack *my_stack() noexcept {
    Stack *s = t_stack;
    return __builtin_expect(s != nullptr, 1) ? s : make_stack();
}

inline Entry *slot(Stack &s, std::size_t i) noexcept {
    return i < kInline ? &s.inline_[i] : &s.heap[i - kInline];
}

static int grow(Stack &s) noexcept {
    std::size_t cap = s.cap ? 2 * s.cap : kInline;
    Entry *p = static_cast<Entry *>(std::realloc(s.heap, cap * sizeof(Entry)));
    if (!p) return -1;
    s.heap = p;
    s.cap = cap;
    return 0;
}

// --- the per-thread stack ------------------------------------------------------------------

// 0, or -1 when memory ran out (the caller raises MemoryError).
inline int tls_push(unsigned long long token, const BlockId *id, const cyctx_Switch *sw) noexcept {
    Stack &s = *my_stack();
    if (&s == &k_no_stack) return -1;  // no memory for this thread's stack
    if (s.depth >= kInline + s.cap && grow(s) != 0) return -1;
    Entry *e = slot(s, s.depth);
    e->token = token;
    if (id) {
        e->id = *id;
    } else {
        e->id.tag = 0;  // the nogil enter(): no tag, no strand (a NULL ctx; inner and root
        e->id.ctx = nullptr;  // are read only beside a ctx that matched)
    }
    e->sw = *sw;
    s.depth++;
    return 0;
}

// Remove the innermost entry, its switch into *out, if it is `token`'s (0); else change nothing (-1).
inline int tls_pop_top(unsigned long long token, cyctx_Switch *out) noexcept {
    Stack &s = *my_stack();
    if (!s.depth) return -1;
    Entry *e = slot(s, s.depth - 1);
    if (e->token != token) return -1;
    *out = e->sw;
    s.depth--;
    return 0;
}

inline std::size_t tls_depth() noexcept { return my_stack()->depth; }

// How many open entries of `token` this thread has.
inline std::size_t tls_count(unsigned long long token) noexcept {
    Stack &s = *my_stack();
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.depth; i++) n += (slot(s, i)->token == token);
    return n;
}

// Slow path of exit: drop the entries on top of this thread's stack whose guard is dead (it
// was freed while entered, so nobody can ever leave them) and that are not `keep`'s. Returns
// how many were dropped. The context they made current is not touched: the exit that follows
// restores what was current before its own enter, which is what leaving them would have led to.
inline std::size_t tls_drop_dead_top(unsigned long long keep) noexcept {
    Stack &s = *my_stack();
    std::size_t n = 0;
    while (s.depth) {
        unsigned long long t = slot(s, s.depth - 1)->token;
        if (t == keep || live_has(t)) break;
        s.depth--;
        n++;
    }
    return n;
}

// Slow path of tls_pop_own (out of line, so that the fast
// paths stay small enough for the compiler to inline into exit): the innermost entry is not
// plainly this exit's own.
__attribute__((noinline)) inline int tls_pop_own_slow(unsigned long long token, cyctx_Switch *out,
                                                       std::size_t *dropped) noexcept {
    if (tls_pop_top(token, out) == 0) return 0;
    if (!tls_count(token)) return -1;
    *dropped = tls_drop_dead_top(token);
    return *dropped && tls_pop_top(token, out) == 0 ? 0 : -1;
}

// The nogil exit()'s pop (a Python exit's entry is found by _protocol/blocks.h's block_find):
// take this guard's innermost entry off the top, its switch into *out (0), else change nothing
// but the drop of dead entries (-1). Entries of guards freed while entered can never be left: when they are
// what lies above this guard's entry, they are dropped (their number in *dropped, for the
// caller to report) and the entry is looked for again. The common case, the innermost entry is
// this guard's, is a few instructions here.
inline int tls_pop_own(unsigned long long token, cyctx_Switch *out, std::size_t *dropped) noexcept {
    Stack &s = *my_stack();
    if (s.depth) {
        Entry *e = slot(s, s.depth - 1);
        if (e->token == token) {
            *out = e->sw;
            s.depth--;
            return 0;
        }
    }
    return tls_pop_own_slow(token, out, dropped);
}

// A Python block left out of order (a block of another guard, or of another strand, entered
// after it is still open: interleaved generators, tasks or greenlets), whose exit Python never
// calls again: remove entry `i` from below the top and hand its restore duty to the entry just
// above it, so that leaving that one restores what was current before the removed enter. The
// current context is not touched now: the block still open above keeps its context.
inline void tls_splice_at(std::size_t i) noexcept {
    Stack &s = *my_stack();
    Entry *e = slot(s, i);
    Entry *above = slot(s, i + 1);
    int switched = above->sw.switched || e->sw.switched;
    above->sw = e->sw;
    above->sw.switched = switched;
    for (std::size_t j = i; j + 1 < s.depth; j++) *slot(s, j) = *slot(s, j + 1);
    s.depth--;
}

// A Python exit's pop of its entry, which the Python-protocol layer found to be the innermost
// (_protocol/blocks.h's block_find; one below it is spliced out by its index, tls_splice_at): its
// switch into *out. The stack was made: the entry was found on it.
inline void tls_pop_innermost(cyctx_Switch *out) noexcept {
    Stack &s = *t_stack;
    *out = slot(s, s.depth - 1)->sw;
    s.depth--;
}

// The token of the innermost entry (0: none).
inline unsigned long long tls_top_token() noexcept {
    Stack &s = *my_stack();
    return s.depth ? slot(s, s.depth - 1)->token : 0;
}


}  // namespace cyctx
