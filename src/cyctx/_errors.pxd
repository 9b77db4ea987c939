# The error contract of cyctx (docs/design.md, "Layout"): driver calls are checked with
# `check`, whose success path is inline and never touches the GIL; only a failure takes the
# GIL, in `raise_driver_error`, to build a typed exception.
from cuda.bindings cimport cydriver

# Raise the DriverError subclass for `err` (never returns normally). GIL: takes it.
cdef int raise_driver_error(cydriver.CUresult err, const char* call) except -1 with gil

# Raise the DriverError for a failed driver_load (no libcuda.so.1, a driver older than
# CUDA 12.0, a missing function), with `problem` in the message. GIL: takes it.
cdef int raise_load_error(cydriver.CUresult err, const char* problem) except -1 with gil

# 0 on CUDA_SUCCESS, else raises. GIL: only on failure. Errors: DriverError.
cdef inline int check(cydriver.CUresult err, const char* call) except -1 nogil:
    if err == cydriver.CUresult.CUDA_SUCCESS:
        return 0
    return raise_driver_error(err, call)
