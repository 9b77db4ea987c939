"""Build the example: one Cython extension that cimports cyctx.

cyctx.get_include_dirs() gives cyctx's own header directory (cyctx.get_include(): cyctx/switch.h,
which its .pxd declares Switch from) and the directory of a cuda.h matching the cuda-bindings of this build
(cuda.bindings' cydriver.pxd includes it); Cython finds cyctx's .pxd files in the installed
package on sys.path. Compile as C++, like cyctx and cydriver.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

import cyctx

ext = Extension(
    "cyctx_downstream._work",
    ["src/cyctx_downstream/_work.pyx"],
    include_dirs=cyctx.get_include_dirs(),
    language="c++",
    extra_compile_args=["-std=c++17", "-O2"],
)
setup(ext_modules=cythonize([ext], compiler_directives={"language_level": 3}))
