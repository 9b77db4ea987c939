# distutils: language = c++
from cyctx cimport ContextGuard


def enter_and_leave(ContextGuard guard, Py_ssize_t n):
    """Enter and leave ``guard`` n times without the GIL; return how many times it was left."""
    cdef Py_ssize_t _i, left = 0
    with nogil:
        for _i in range(n):
            guard.enter()
            try:
                pass  # a library's driver calls go here
            finally:
                guard.exit()
            left += 1
    return left
