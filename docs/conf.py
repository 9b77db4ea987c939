# Sphinx configuration of cyctx's documentation, built against the INSTALLED cyctx (its
# compiled modules and its typing stub):
#
#   python -m sphinx -W -n -b html docs build/docs        the site; warnings are errors, and
#                                                         every cross-reference must resolve
#   python docs/check_links.py build/docs                 every internal link and anchor exists
#   python -m sphinx -W -b doctest docs build/doctest     the Python examples, on the simulated driver
#
# .ci/run runs all three; docs/requirements.txt is what they need.
import os
import sys

import cyctx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ext"))

project = "cyctx"
author = "The cyctx developers"
copyright = "2026, The cyctx developers"
release = version = cyctx.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.doctest",
    "stub_signatures",  # docs/_ext: signatures and types from cyctx/__init__.pyi
    "code_tables",  # docs/_ext: tables and versions rendered from the code and pyproject.toml
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_intersphinx"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
from code_tables import substitutions  # noqa: E402 (docs/_ext, on the path above)

myst_substitutions = substitutions()
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
# Names that appear in the stub's signatures and are not documented objects of their own:
# resolved as plain text rather than left as broken references.
nitpick_ignore = [
    ("py:class", "DeviceLike"),
    ("py:class", "SupportsIndex"),
    ("py:class", "TracebackType"),
    ("py:class", "Literal[False]"),
    ("py:class", "ctypes.CDLL"),
    ("py:class", "Trace"),  # what cyctx.trace() returns: described on the tracing page
    ("py:class", "optional"),
    # Words of the numpydoc "Parameters" types in ContextGuard's docstring.
    ("py:class", "device object"),
    ("py:class", "context"),
    ("py:class", "stream"),
]
nitpick_ignore_regex = [("py:class", r"(Any|None|list|dict|tuple|type)\[?.*")]

# Intersphinx, offline: the inventory is a committed file (docs/_intersphinx/python.inv, written
# by make_python_inv.py there), so the build reads no network; links point to docs.python.org.
intersphinx_mapping = {
    "python": (
        "https://docs.python.org/3",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "_intersphinx", "python.inv"),
    ),
}

# Doctest runs the examples of these pages and of the docstrings on cyctx's simulated driver,
# selected before anything calls the driver.
doctest_global_setup = """
from cyctx.testing import use_simulated_driver
sim = use_simulated_driver(device_count=2)
"""
doctest_test_doctest_blocks = "default"

html_theme = "furo"
html_title = f"cyctx {release}"
html_theme_options = {
    "source_repository": "https://github.com/cyctx/cyctx",
    "source_branch": "main",
    "source_directory": "docs/",
}
# Pages of this site are linked ([the evidence](evidence.md)); paths to other files of the
# repository (src/..., tests/..., bench/results/...) are written as code, not as links, so the
# documentation builds from the source tree alone.
