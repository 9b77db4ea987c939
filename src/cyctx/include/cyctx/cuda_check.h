/* Included before cuda.h by every module that cimports cyctx (_guard.pxd declares it first)
 * and by cyctx/switch.h: with include_dirs=[cyctx.get_include()] alone (numpy's spelling) the
 * compiler would stop at a bare "cuda.h: No such file or directory"; this says what to do.
 * The check looks where `#include "cuda.h"` looks, except the directory of the including file;
 * define CYCTX_NO_CUDA_H_CHECK to skip it (a cuda.h kept beside the generated source). */
#ifndef CYCTX_CUDA_CHECK_H
#define CYCTX_CUDA_CHECK_H

#if defined(__has_include) && !defined(CYCTX_NO_CUDA_H_CHECK)
#if !__has_include("cuda.h")
#error "cyctx: cuda.h is not on the include path. Compile with include_dirs=cyctx.get_include_dirs(), which adds the directory of the cuda.h matching cuda-bindings to cyctx.get_include()."
#endif
#endif

#endif
