# Sphinx configuration of cyctx's documentation: `python -m sphinx -W -b html docs build/docs`
# (warnings are errors; CI builds it with the installed cyctx, whose compiled modules carry
# their signatures in their docstrings: embedsignature in setup.py).
import cyctx

project = "cyctx"
author = "The cyctx developers"
copyright = "2026, The cyctx developers"
release = version = cyctx.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
html_theme = "alabaster"
# Paths to files of the repository (src/..., tests/..., results/...) are written as code in
# the pages, not as links, so the documentation builds from the source tree alone.
