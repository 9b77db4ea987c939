// Fork detection without a per-call syscall: a pthread_atfork child handler sets flags the
// guard reads before any driver call (docs/design.md, "Fork"). Relaxed atomics: set once, read
// as plain loads. The handlers hold registry.h's mutex across fork(), so no child inherits it
// locked.
#pragma once
#include <atomic>
#include <pthread.h>

#include "registry.h"

namespace cyctx {

inline std::atomic<int> g_cuda_initialised{0};   // cyctx's cuInit succeeded here or in an ancestor
inline std::atomic<int> g_forked_after_cuda{0};  // this process was forked after that
inline std::atomic<int> g_fork_child{0};         // this process was forked at all

inline int forked_after_cuda() noexcept { return g_forked_after_cuda.load(std::memory_order_relaxed); }
inline int fork_child() noexcept { return g_fork_child.load(std::memory_order_relaxed); }
inline void mark_cuda_initialised() noexcept { g_cuda_initialised.store(1, std::memory_order_relaxed); }

static void on_fork_prepare(void) { live_lock(); }
static void on_fork_parent(void) { live_unlock(); }
static void on_fork_child(void) {
    live_unlock();
    g_fork_child.store(1, std::memory_order_relaxed);
    if (g_cuda_initialised.load(std::memory_order_relaxed)) g_forked_after_cuda.store(1, std::memory_order_relaxed);
}

inline int install_fork_handler() { return pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child); }

}  // namespace cyctx
