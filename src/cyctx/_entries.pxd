# The per-thread entries of open guard blocks (_cpp/thread_entries.h). Declarations only.
# GIL: not needed.
from cyctx._guard cimport Switch

cdef extern from "cyctx/switch.h" nogil:
    const unsigned long long CYCTX_PREV_UNKNOWN

cdef extern from "_cpp/thread_entries.h" namespace "cyctx" nogil:
    # Which block an entry is (opaque to this layer; filled by _protocol/blocks.h).
    ctypedef struct BlockId:
        pass
    int tls_push(unsigned long long token, const BlockId* block, const Switch* sw) noexcept
    int tls_pop_own(unsigned long long token, Switch* out, size_t* dropped) noexcept
    void tls_pop_innermost(Switch* out) noexcept
    void tls_splice_at(size_t at) noexcept
    size_t tls_depth() noexcept
    size_t tls_count(unsigned long long token) noexcept
    unsigned long long tls_top_token() noexcept
