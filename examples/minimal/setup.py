"""One Cython extension that cimports cyctx: include_dirs=cyctx.get_include_dirs(), C++.

cyctx.get_include_dirs() is cyctx.get_include() (cyctx's own headers) and the directory of the
cuda.h that cuda.bindings' cydriver.pxd includes; beside other libraries' directories, write
include_dirs=[np.get_include(), *cyctx.get_include_dirs()].
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

import cyctx

ext = Extension(
    "cyctx_minimal._enter",
    ["src/cyctx_minimal/_enter.pyx"],
    include_dirs=cyctx.get_include_dirs(),
    language="c++",
)
setup(ext_modules=cythonize([ext], compiler_directives={"language_level": 3}))
