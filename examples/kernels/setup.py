"""Build the kernels example: one Cython extension that cimports cyctx and cydriver."""

from Cython.Build import cythonize
from setuptools import Extension, setup

import cyctx

ext = Extension(
    "cyctx_kernels._launch",
    ["src/cyctx_kernels/_launch.pyx"],
    include_dirs=cyctx.get_include_dirs(),
    language="c++",
    extra_compile_args=["-std=c++17", "-O2"],
)
setup(ext_modules=cythonize([ext], compiler_directives={"language_level": 3}))
