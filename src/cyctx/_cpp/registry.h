// The guards alive in this process, by token: which entries belong to a guard that was freed
// while entered (the slow path of exit drops those), the tokens themselves, and each guard's
// address for diagnostics (cyctx.live_guards).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <pthread.h>

namespace cyctx {

// 1, 2, 3, ...: never 0, never reused in this process (2**64 guards will not be made).
inline std::atomic<unsigned long long> g_next_token{1};

inline unsigned long long new_token() noexcept {
    return g_next_token.fetch_add(1, std::memory_order_relaxed);
}

// The tokens of the guards alive now. Touched at construction and deallocation, read only
// on the slow path of exit (an entry on top that is not the exiting guard's) and by
// diagnostics, never on the hot path. The mutex is held for a set operation only: never across
// Python code or a driver call; the fork handlers of fork.h hold it across fork() so a child
// never inherits it locked or the set half-modified (which a Python dict, locked by its own
// mutex on a free-threaded build, could be).
//
// Plain C (a pthread mutex, an open-addressing table from malloc): no C++ library symbols, so
// the modules need nothing newer from libstdc++ than manylinux_2_28 systems have (built with
// GCC 12, a std::unordered_set needs GLIBCXX_3.4.29). Linear probing with backward-shift
// deletion, 0 marks an empty slot (tokens are never 0), at most half full.
struct LiveSlot {
    unsigned long long token;
    void *guard;  // the guard's object (not a reference: its deallocation removes it first)
};
static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static LiveSlot *g_live = NULL;  // never freed: see live_remove
static size_t g_live_cap = 0;    // slots, a power of two (0 before the first add)
static size_t g_live_n = 0;      // tokens held

static inline size_t live_slot(unsigned long long token, size_t cap) {
    return (size_t)((token * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);  // Fibonacci hashing
}

static inline void live_put(LiveSlot *table, size_t cap, LiveSlot entry) {
    size_t i = live_slot(entry.token, cap);
    while (table[i].token != 0 && table[i].token != entry.token) i = (i + 1) & (cap - 1);
    table[i] = entry;
}

// 0, or -1 when memory ran out, -2 for token 0 (the empty-slot mark: never a token); either
// way nothing changed. `guard`: what live_take hands out for it.
inline int live_add(unsigned long long token, void *guard = nullptr) noexcept {
    if (token == 0) return -2;
    int rc = 0;
    pthread_mutex_lock(&g_live_mu);
    if (2 * (g_live_n + 1) > g_live_cap) {
        size_t cap = g_live_cap ? 2 * g_live_cap : 64;
        LiveSlot *table = (LiveSlot *)calloc(cap, sizeof *table);
        if (!table) {
            rc = -1;
        } else {
            for (size_t i = 0; i < g_live_cap; i++)
                if (g_live[i].token) live_put(table, cap, g_live[i]);
            free(g_live);
            g_live = table;
            g_live_cap = cap;
        }
    }
    if (rc == 0) {
        size_t i = live_slot(token, g_live_cap);
        while (g_live[i].token != 0 && g_live[i].token != token) i = (i + 1) & (g_live_cap - 1);
        if (g_live[i].token == 0) {
            g_live[i] = LiveSlot{token, guard};
            g_live_n++;
        }
    }
    pthread_mutex_unlock(&g_live_mu);
    return rc;
}

// Safe at interpreter shutdown and from __dealloc__: no Python, no allocation. The table is
// never freed, so a guard deallocated after static destructors ran still finds it.
inline void live_remove(unsigned long long token) noexcept {
    if (token == 0) return;  // would match an empty slot: never in the table
    pthread_mutex_lock(&g_live_mu);
    if (g_live) {
        size_t mask = g_live_cap - 1, i = live_slot(token, g_live_cap);
        while (g_live[i].token != 0 && g_live[i].token != token) i = (i + 1) & mask;
        if (g_live[i].token == token) {
            // Backward shift: move each later entry of the probe run into the hole when its
            // home slot does not lie (cyclically) between the hole and where it sits.
            size_t hole = i, j = i;
            for (;;) {
                j = (j + 1) & mask;
                if (g_live[j].token == 0) break;
                size_t home = live_slot(g_live[j].token, g_live_cap);
                if (((j - home) & mask) >= ((j - hole) & mask)) {
                    g_live[hole] = g_live[j];
                    hole = j;
                }
            }
            g_live[hole] = LiveSlot{0, nullptr};
            g_live_n--;
        }
    }
    pthread_mutex_unlock(&g_live_mu);
}

inline bool live_has(unsigned long long token) noexcept {
    if (token == 0) return false;  // would match an empty slot: never in the table
    bool found = false;
    pthread_mutex_lock(&g_live_mu);
    if (g_live) {
        size_t i = live_slot(token, g_live_cap);
        while (g_live[i].token != 0 && g_live[i].token != token) i = (i + 1) & (g_live_cap - 1);
        found = g_live[i].token == token;
    }
    pthread_mutex_unlock(&g_live_mu);
    return found;
}

// The guards alive now, for diagnostics: each address, in a malloc'd array (*out, *n; the
// caller frees it), that take() accepted under the mutex. take() is given the guard while
// nothing can remove it, and keeps it alive (a reference), or refuses one already being freed
// (0). -1 when memory ran out (nothing taken).
inline int live_take(int (*take)(void *), void ***out, size_t *n) noexcept {
    int rc = 0;
    *out = nullptr;
    *n = 0;
    pthread_mutex_lock(&g_live_mu);
    void **got = g_live_n ? (void **)malloc(g_live_n * sizeof *got) : nullptr;
    if (g_live_n && !got) {
        rc = -1;
    } else {
        for (size_t i = 0; i < g_live_cap; i++)
            if (g_live[i].token && g_live[i].guard && take(g_live[i].guard)) got[(*n)++] = g_live[i].guard;
        *out = got;
    }
    pthread_mutex_unlock(&g_live_mu);
    return rc;
}

// Slots in the table now (0 before the first add) and tokens held: for tests of its bounds.
inline size_t live_capacity() noexcept {
    pthread_mutex_lock(&g_live_mu);
    size_t cap = g_live_cap;
    pthread_mutex_unlock(&g_live_mu);
    return cap;
}

inline size_t live_count() noexcept {
    pthread_mutex_lock(&g_live_mu);
    size_t n = g_live_n;
    pthread_mutex_unlock(&g_live_mu);
    return n;
}

inline void live_lock() noexcept { pthread_mutex_lock(&g_live_mu); }
inline void live_unlock() noexcept { pthread_mutex_unlock(&g_live_mu); }

}  // namespace cyctx
