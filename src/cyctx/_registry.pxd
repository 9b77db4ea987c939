# The live-guard registry (_cpp/registry.h): each guard's process-unique token, and which
# tokens belong to guards alive now. Declarations only. GIL: not needed.
cdef extern from "_cpp/registry.h" namespace "cyctx" nogil:
    unsigned long long new_token() noexcept
    int live_add(unsigned long long token) noexcept
    void live_remove(unsigned long long token) noexcept
