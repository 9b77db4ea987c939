"""Example downstream package: nogil work inside cyctx guards (see _work.pyx)."""

from cyctx_downstream._work import current_device, hammer

__all__ = ["current_device", "hammer"]
