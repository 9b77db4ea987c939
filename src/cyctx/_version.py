# The one place the version is written (pyproject.toml reads it; cyctx.__version__ is it).
__version__ = "0.1.0"
