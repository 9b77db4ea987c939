// Per-thread record of open guard entries (DESIGN §3.4: per-entry state lives per thread,
// never on the shared guard object).
//
// This is on every enter and exit, so the common case must be one thread-local lookup and no
// C++ TLS init guard: a zero-initialised POD with room for kInline nested entries. Deeper
// nesting spills to a heap block owned by a second thread_local whose destructor frees it at
// thread exit (no Python call, DESIGN §3.9); that object is only touched on the spill path.
// (H200 run 1: a function-local `thread_local std::vector` cost ~20 ns per enter+exit.)
#pragma once
#include <cuda.h>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace cyctx {

struct Entry {
    const void *owner;  // the guard; compared, never dereferenced
    CUcontext prev;     // what was current before the enter (NULL: nothing)
    int switched;       // 1 if the enter changed the current context
};

enum { kInline = 32 };

struct Stack {
    Entry inline_[kInline];
    Entry *heap;         // entries kInline.. when nesting is deeper
    std::size_t cap;     // capacity of heap
    std::size_t depth;   // open entries
};

static thread_local Stack t_stack;  // zero-initialised: no constructor, no destructor

struct HeapOwner {
    ~HeapOwner() {
        std::free(t_stack.heap);
        t_stack.heap = nullptr;
        t_stack.cap = 0;
    }
};

inline Entry *slot(Stack &s, std::size_t i) noexcept {
    return i < kInline ? &s.inline_[i] : &s.heap[i - kInline];
}

static int grow(Stack &s) noexcept {
    static thread_local HeapOwner owner;  // registers the free at thread exit, once
    (void)owner;
    std::size_t cap = s.cap ? 2 * s.cap : kInline;
    Entry *p = static_cast<Entry *>(std::realloc(s.heap, cap * sizeof(Entry)));
    if (!p) return -1;
    s.heap = p;
    s.cap = cap;
    return 0;
}

// 0, or -1 when memory ran out (the caller raises MemoryError).
inline int tls_push(const void *owner, CUcontext prev, int switched) noexcept {
    Stack &s = t_stack;
    if (s.depth >= kInline + s.cap && grow(s) != 0) return -1;
    Entry *e = slot(s, s.depth);
    e->owner = owner;
    e->prev = prev;
    e->switched = switched;
    s.depth++;
    return 0;
}

// The innermost open entry, or NULL.
inline Entry *tls_top() noexcept {
    Stack &s = t_stack;
    return s.depth ? slot(s, s.depth - 1) : nullptr;
}

// Remove the innermost entry into *out if it belongs to `owner` (0); else change nothing (-1).
inline int tls_pop_matching(const void *owner, Entry *out) noexcept {
    Stack &s = t_stack;
    if (!s.depth) return -1;
    Entry *e = slot(s, s.depth - 1);
    if (e->owner != owner) return -1;
    *out = *e;
    s.depth--;
    return 0;
}

inline std::size_t tls_depth() noexcept { return t_stack.depth; }

// How many open entries of `owner` this thread has.
inline std::size_t tls_count(const void *owner) noexcept {
    Stack &s = t_stack;
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.depth; i++) n += (slot(s, i)->owner == owner);
    return n;
}

}  // namespace cyctx
