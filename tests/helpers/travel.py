"""Tasks that receive a guard in another process (a spawned multiprocessing worker, a Dask
worker): importable by module, as pickle needs."""

import os


def select_driver(kind):
    """Pool initializer: the worker runs on the parent's driver (before any driver call)."""
    from helpers import drivers

    drivers.select(kind)


def inside(guard):
    """Enter the received guard; report what it is and what was current inside and after."""
    import cyctx

    with guard:
        inside = cyctx.current_device()
    return {
        "pid": os.getpid(),
        "shared": guard.is_shared,
        "same": guard is cyctx.device(guard.device),
        "device": guard.device,
        "inside": inside,
        "after": cyctx.current_device(),
    }
