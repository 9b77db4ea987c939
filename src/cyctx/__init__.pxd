# cimport surface of cyctx: `cimport cyctx` or `from cyctx cimport ContextGuard`.
# Build a consumer with include_dirs=cyctx.get_include() (it holds the cuda.h that
# cuda.bindings' cydriver.pxd needs) and language="c++".
from cyctx._guard cimport ContextGuard, Switch, switch_to, switch_back
from cyctx._errors cimport check
