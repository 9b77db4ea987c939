"""Build tsan_harness.pyx (in the current directory) with ThreadSanitizer, against the cyctx
source tree given as argv[1] (its .pxd files and include/), the way a user's extension is
built against cyctx: C++, cyctx/switch.h and the cuda.h of the installed cuda-bindings.

cyctx itself is not imported: its extension is the ThreadSanitizer build, which loads only
with libtsan preloaded."""

import importlib.util
import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

src = os.path.abspath(sys.argv[1])
spec = importlib.util.spec_from_file_location(
    "_tsan_cuda_headers", os.path.join(src, "cyctx", "_cuda_headers.py")
)
headers = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = headers  # dataclasses look their module up there
spec.loader.exec_module(headers)

ext = Extension(
    "tsan_harness",
    ["tsan_harness.pyx"],
    include_dirs=[os.path.join(src, "cyctx", "include"), headers.find_cuda_header().include_dir],
    language="c++",
    extra_compile_args=["-fsanitize=thread", "-g", "-O2"],
    extra_link_args=["-fsanitize=thread"],
)
setup(
    name="tsan_harness",
    ext_modules=cythonize([ext], include_path=[src], quiet=True, force=True),
    script_args=["-q", "build_ext", "--inplace"],
)
