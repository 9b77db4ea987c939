# The process's fork state (_cpp/fork.h): set by cyctx's pthread_atfork child handler.
# GIL: not needed.
cdef extern from "_cpp/fork.h" namespace "cyctx" nogil:
    int forked_after_cuda() noexcept
    int fork_child() noexcept
    void mark_cuda_initialised() noexcept
    int install_fork_handler()
