"""What the doctor recognises: :func:`diagnose` gathers the state once (:mod:`.gather`), and
the table of rules (:mod:`.rules`) makes a :class:`~.model.Finding` of each problem it sees, in
plain words (:mod:`.words`) and with the fix.
"""

from __future__ import annotations

import os

from cyctx._doctor.gather import gather
from cyctx._doctor.report import Diagnosis
from cyctx._doctor.rules import findings_of


def _cudart_path(cudart: object) -> str | bool | None:
    # bytes and os.PathLike are paths, as everywhere in the standard library; anything else
    # would otherwise fall through to the default lookup and report another runtime, silently.
    if cudart is None or isinstance(cudart, bool):
        return cudart
    if isinstance(cudart, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(cudart))
        if not path:
            raise ValueError("diagnose(cudart=...): the path is empty; pass None for the default")
        return path
    raise TypeError(
        f"diagnose(cudart=...) takes a path (str, bytes or os.PathLike), None (find one) or "
        f"False (none), not {type(cudart).__name__}"
    )


def diagnose(
    cudart: str | bytes | os.PathLike[str] | os.PathLike[bytes] | bool | None = None,
    *,
    before_fork: bool = False,
) -> Diagnosis:
    """Report the CUDA driver, runtime, devices and the calling thread's context, and every CUDA
    library loaded in the process (the census), with findings.

    Changes no state: it only queries the driver (and the runtime's ``cudaGetDevice``); it never
    retains, pushes or sets a context. The census asks each loaded library its version through
    a handle already loaded, and loads nothing. Safe in a forked child and on a machine without
    a GPU.

    Parameters
    ----------
    cudart : str, bytes, os.PathLike, bool or None
        Which ``libcudart`` to ask for its version and current device: a path; None (default)
        for one already loaded in this process, else cuda-pathfinder's; False for none.
        Another type is a TypeError, an empty path a ValueError.
    before_fork : bool
        Asked from a process about to fork: whether a forked child could use CUDA. When CUDA
        is initialised already (by anyone: :func:`cyctx.cuda_initialized`) the report has the
        warning ``cuda_initialised_before_fork``, naming the CUDA libraries loaded and the fix.
        When it is not, the doctor does not initialise it either (no ``cuInit``, so no devices
        or contexts are described) and says so in the finding ``fork_safe``.

    Returns
    -------
    Diagnosis
        ``print()`` it for people, ``.to_json()`` for machines; ``.ok`` says whether anything
        is wrong, ``.findings`` what and how to fix it.

    Examples
    --------
    >>> import cyctx
    >>> report = cyctx.diagnose()
    >>> print(report)              # doctest: +SKIP
    >>> report.ok                  # doctest: +SKIP
    True
    """
    if not isinstance(before_fork, bool):
        raise TypeError(f"diagnose(before_fork=...): a bool, not {type(before_fork).__name__}")
    seen = gather(_cudart_path(cudart), before_fork)
    report = seen.report
    report.findings = findings_of(seen)
    order = {"unavailable": 0, "error": 1, "warning": 2, "info": 3}
    report.findings.sort(key=lambda f: order.get(f.severity, 4))
    return report
