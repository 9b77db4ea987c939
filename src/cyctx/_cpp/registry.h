// The guards alive in this process, by token: which entries belong to a guard that was freed
// while entered (the slow path of exit drops those), and the tokens themselves.
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
// on the slow path of exit (an entry on top that is not the exiting guard's), never on the
// hot path. The mutex is held for a set operation only: never across Python code or a driver
// call; the fork handlers of fork.h hold it across fork() so a child never inherits it
// locked or the set half-modified.
//
// Plain C (a pthread mutex, an open-addressing table from malloc): no C++ library symbols, so
// the modules need nothing newer from libstdc++ than manylinux_2_28 systems have (built with
// GCC 12, a std::unordered_set needs GLIBCXX_3.4.29). Linear probing with backward-shift
// deletion, 0 marks an empty slot (tokens are never 0), at most half full.
static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long *g_live = NULL;  // never freed: see live_remove
static size_t g_live_cap = 0;              // slots, a power of two (0 before the first add)
static size_t g_live_n = 0;                // tokens held

static inline size_t live_slot(unsigned long long token, size_t cap) {
    return (size_t)((token * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);  // Fibonacci hashing
}

static inline void live_put(unsigned long long *table, size_t cap, unsigned long long token) {
    size_t i = live_slot(token, cap);
    while (table[i] != 0 && table[i] != token) i = (i + 1) & (cap - 1);
    table[i] = token;
}

// 0, or -1 when memory ran out, -2 for token 0 (the empty-slot mark: never a token); either
// way nothing changed.
inline int live_add(unsigned long long token) noexcept {
    if (token == 0) return -2;
    int rc = 0;
    pthread_mutex_lock(&g_live_mu);
    if (2 * (g_live_n + 1) > g_live_cap) {
        size_t cap = g_live_cap ? 2 * g_live_cap : 64;
        unsigned long long *table = (unsigned long long *)calloc(cap, sizeof *table);
        if (!table) {
            rc = -1;
        } else {
            for (size_t i = 0; i < g_live_cap; i++)
                if (g_live[i]) live_put(table, cap, g_live[i]);
            free(g_live);
            g_live = table;
            g_live_cap = cap;
        }
    }
    if (rc == 0) {
        size_t i = live_slot(token, g_live_cap);
        while (g_live[i] != 0 && g_live[i] != token) i = (i + 1) & (g_live_cap - 1);
        if (g_live[i] == 0) {
            g_live[i] = token;
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
        while (g_live[i] != 0 && g_live[i] != token) i = (i + 1) & mask;
        if (g_live[i] == token) {
            // Backward shift: move each later entry of the probe run into the hole when its
            // home slot does not lie (cyclically) between the hole and where it sits.
            size_t hole = i, j = i;
            for (;;) {
                j = (j + 1) & mask;
                if (g_live[j] == 0) break;
                size_t home = live_slot(g_live[j], g_live_cap);
                if (((j - home) & mask) >= ((j - hole) & mask)) {
                    g_live[hole] = g_live[j];
                    hole = j;
                }
            }
            g_live[hole] = 0;
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
        while (g_live[i] != 0 && g_live[i] != token) i = (i + 1) & (g_live_cap - 1);
        found = g_live[i] == token;
    }
    pthread_mutex_unlock(&g_live_mu);
    return found;
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
