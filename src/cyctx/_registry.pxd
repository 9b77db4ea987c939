# The live-guard registry (_cpp/registry.h): each guard's process-unique token, and which
# tokens belong to guards alive now, and their addresses. Declarations only. GIL: not needed.
cdef extern from "_cpp/registry.h" namespace "cyctx" nogil:
    unsigned long long new_token() noexcept
    int live_add(unsigned long long token, void* guard) noexcept
    int live_take(int (*take)(void*) noexcept, void*** out, size_t* n) noexcept
    void live_remove(unsigned long long token) noexcept
