"""The smallest package on cyctx: see pyproject.toml."""

from cyctx_minimal._enter import enter_and_leave

__all__ = ["enter_and_leave"]
