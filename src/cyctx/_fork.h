// Fork detection without a per-call syscall (DESIGN §3.8): a pthread_atfork child handler
// flips plain flags that the guard reads before any driver call. In a child forked after
// CUDA was initialised, every driver call returns CUDA_ERROR_NOT_INITIALIZED (lab probe2:
// "child: getcurrent r3 ... cuInit r3; retain r3"), so the guard must refuse up front.
#pragma once
#include <pthread.h>

namespace cyctx {

static int g_cuda_initialised = 0;   // cyctx's cuInit succeeded in this process or an ancestor
static int g_forked_after_cuda = 0;  // this process was forked after that
static int g_fork_child = 0;         // this process was forked at all

static void on_fork_child(void) {
    g_fork_child = 1;
    if (g_cuda_initialised) g_forked_after_cuda = 1;
}

inline int install_fork_handler() { return pthread_atfork(nullptr, nullptr, on_fork_child); }

}  // namespace cyctx
