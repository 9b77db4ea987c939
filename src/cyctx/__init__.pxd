# cimport surface of cyctx: `cimport cyctx` or `from cyctx cimport ContextGuard`.
# Build a consumer with include_dirs=cyctx.get_include_dirs() (cyctx/switch.h, and the cuda.h that
# cuda.bindings' cydriver.pxd needs) and language="c++".
from cyctx._guard cimport ContextGuard, Switch, switch_to, switch_back, epoch_of as context_epoch
# The driver-result checker, under a name that says what it checks: 0 on CUDA_SUCCESS, else
# raises the typed cyctx.DriverError (taking the GIL only then). Usable inside `with nogil:`.
from cyctx._guard cimport check as check_result
