"""Where libcupti is, found the way the doctor's census finds CUDA libraries, in the order
docs/tracing.md gives: one already mapped first (a second copy would be a second CUPTI), and
only one of the driver's CUDA major or older, except that the one ``$CYCTX_CUPTI`` names is
refused, never passed over. Nothing is loaded here.
"""

from __future__ import annotations

import os
import re
import sys

from cyctx._census import mapped_paths

_CUPTI = re.compile(r"libcupti\.so(\.(\d+))?")
_DRIVER = re.compile(r"libcuda\.so(\.|$)")


def cupti_major(path: str) -> int | None:
    """The CUDA major a libcupti belongs to, from its file name (``libcupti.so.13...``)."""
    m = _CUPTI.match(os.path.basename(path))
    return int(m.group(2)) if m and m.group(2) else None


def _in(d: str) -> list[str]:
    """The libcupti.so.N in directory ``d``, newest major first (none where it is no directory)."""
    if not os.path.isdir(d):
        return []
    found = [f for f in os.listdir(d) if re.fullmatch(r"libcupti\.so\.\d+", f)]
    return [os.path.join(d, f) for f in sorted(found, reverse=True)]


def candidates() -> list[tuple[str, str]]:
    """(path, how it was found), in the order they are tried."""
    out: list[tuple[str, str]] = []
    mapped = mapped_paths()
    for path in mapped:
        if _CUPTI.match(os.path.basename(path)):
            out.append((path, "already loaded in this process"))
    env = os.environ.get("CYCTX_CUPTI")
    if env:
        out.append((env, "$CYCTX_CUPTI"))
    for path in mapped:
        if _DRIVER.match(os.path.basename(path)):
            d = os.path.dirname(path)
            out.extend((p, f"beside the loaded driver ({d})") for p in _in(d))
    for entry in sys.path:
        # 13.x wheels: nvidia/cu13/lib; 12.x (and some 13.0 builds): nvidia/cuda_cupti/lib.
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_cupti/lib", "nvidia/cu12/lib"):
            d = os.path.abspath(os.path.join(entry or ".", sub))
            out.extend((p, "the nvidia-cuda-cupti wheel") for p in _in(d))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            d = os.path.join(home, "extras", "CUPTI", "lib64")
            out.extend((p, f"the CUDA toolkit ({home})") for p in _in(d))
    seen: set[str] = set()
    unique = []
    for path, how in out:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((path, how))
    return unique


def find_cupti(driver_major: int | None) -> tuple[str | None, str]:
    """(path, how) of the libcupti to load, or (None, why none fits) in one line."""
    found = candidates()
    if not found:
        return None, (
            "no libcupti found (install it with `pip install cyctx[trace]`, or point $CYCTX_CUPTI at it)"
        )
    for path, how in found:
        major = cupti_major(path)
        if how == "$CYCTX_CUPTI":
            # Named on purpose: one that cannot be used is refused, never passed over for
            # another the caller did not name.
            if not os.path.isfile(path):
                return None, f"$CYCTX_CUPTI names {path}, which is not a file"
            if driver_major is not None and major is not None and major > driver_major:
                return None, (
                    f"$CYCTX_CUPTI names {path}, a CUPTI of CUDA {major}, newer than the driver "
                    f"(CUDA {driver_major}), which it would refuse"
                )
            return path, how
        if how.startswith("already loaded") or driver_major is None or major is None:
            return path, how
        if major <= driver_major:
            return path, how
    return None, (
        f"every libcupti found is newer than the driver (CUDA {driver_major}): "
        + ", ".join(p for p, _ in found)
    )
