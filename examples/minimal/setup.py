"""One Cython extension that cimports cyctx: include_dirs=cyctx.get_include(), C++."""

from Cython.Build import cythonize
from setuptools import Extension, setup

import cyctx

ext = Extension(
    "cyctx_minimal._enter",
    ["src/cyctx_minimal/_enter.pyx"],
    include_dirs=cyctx.get_include(),
    language="c++",
)
setup(ext_modules=cythonize([ext], compiler_directives={"language_level": 3}))
