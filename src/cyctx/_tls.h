// Per-thread record of open guard entries (DESIGN §3.4: per-entry state lives per thread,
// never on the shared guard object). One small vector per thread; it is freed by the C++
// runtime at thread exit, with no Python call (DESIGN §3.9).
#pragma once
#include <cuda.h>
#include <cstddef>
#include <new>
#include <vector>

namespace cyctx {

struct Entry {
    const void *owner;  // the guard; compared, never dereferenced
    CUcontext prev;     // what was current before the enter (NULL: nothing)
    int switched;       // 1 if the enter changed the current context
};

inline std::vector<Entry> &entries() {
    static thread_local std::vector<Entry> v;
    return v;
}

// 0, or -1 when memory ran out (the caller raises MemoryError).
inline int tls_push(const void *owner, CUcontext prev, int switched) noexcept {
    try {
        entries().push_back(Entry{owner, prev, switched});
        return 0;
    } catch (const std::bad_alloc &) {
        return -1;
    }
}

// The innermost open entry, or NULL.
inline Entry *tls_top() noexcept {
    std::vector<Entry> &v = entries();
    return v.empty() ? nullptr : &v.back();
}

// Remove the innermost entry into *out if it belongs to `owner` (0); else change nothing (-1).
// One thread-local lookup for the whole exit: this is on every guard exit.
inline int tls_pop_matching(const void *owner, Entry *out) noexcept {
    std::vector<Entry> &v = entries();
    if (v.empty() || v.back().owner != owner) return -1;
    *out = v.back();
    v.pop_back();
    return 0;
}

inline std::size_t tls_depth() noexcept { return entries().size(); }

// How many open entries of `owner` this thread has.
inline std::size_t tls_count(const void *owner) noexcept {
    std::size_t n = 0;
    for (const Entry &e : entries()) n += (e.owner == owner);
    return n;
}

}  // namespace cyctx
