/* Found for `#include "cuda.h"` (cuda.bindings' cydriver.pxd, cyctx/switch.h) wherever cyctx's
 * include directory, cyctx.get_include(), comes before the real header's: it includes the next
 * cuda.h on the path (#include_next), or, where there is none (numpy's spelling,
 * include_dirs=[cyctx.get_include()] alone), stops with what to do instead of the compiler's
 * bare "cuda.h: No such file or directory", whichever module cimports cyctx first.
 * A cuda.h beside the including source is found before this one, and once included makes
 * this one do nothing. -DCYCTX_NO_CUDA_H_CHECK skips the check. */
/* (After the #error, the compilers go on: the include below then fails without stopping them,
 * and what follows cyctx's words is what a missing cuda.h leaves undeclared.) */
#ifndef __cuda_cuda_h__ /* the real header's guard: included already (from beside the source) */
#if defined(__has_include_next) && !defined(CYCTX_NO_CUDA_H_CHECK)
#if !__has_include_next(<cuda.h>)
#error "cyctx: cuda.h is not on the include path. Compile with include_dirs=cyctx.get_include_dirs(), which adds the directory of the cuda.h matching cuda-bindings to cyctx.get_include()."
#endif
#endif
#include_next <cuda.h>
#endif
