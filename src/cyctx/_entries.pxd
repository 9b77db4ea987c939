# The per-thread entries of open guard blocks (_cpp/thread_entries.h). Declarations only.
# GIL: not needed.
from cyctx._guard cimport Switch

cdef extern from "cyctx/switch.h" nogil:
    const unsigned long long CYCTX_PREV_UNKNOWN

cdef extern from "_cpp/thread_entries.h" namespace "cyctx" nogil:
    int tls_push(unsigned long long token, const void* block, const Switch* sw) noexcept
    int tls_pop_own(unsigned long long token, Switch* out, size_t* dropped) noexcept
    size_t tls_depth() noexcept
    size_t tls_count(unsigned long long token) noexcept
    size_t tls_drop_dead_top(unsigned long long keep) noexcept
    int tls_splice(unsigned long long token, const void* block) noexcept
    unsigned long long tls_top_token() noexcept
