"""The doctor's queries of the driver and of the live guards, which fill the report's records.

Queries only (the calls are listed in cyctx/_doctor/__init__.py): nothing here retains,
pushes or sets a context. The calls go through :mod:`.cu`.
"""

from __future__ import annotations

import os

from cyctx._doctor.cu import call, cstr, driver, error_name
from cyctx._doctor.model import ContextInfo, DeviceInfo, GuardInfo
from cyctx._errors import GuardError
from cyctx._guard import fork_state, live_guards

# CU_CTX_MAP_HOST: every active primary context reports it in cuCtxGetFlags.
MAP_HOST = 0x08


def forked_from() -> int | None:
    """The parent's pid when this process is a forked child, from the guard's fork flags
    (cyctx/_cpp/fork.h: set in every child forked after cyctx was imported), else None."""
    _, fork_child = fork_state()
    return os.getppid() if fork_child else None


def device_count() -> int:
    """cuInit, then cuDeviceGetCount; 0 when the driver cannot say."""
    call(driver.cuInit, 0)
    e, n = call(driver.cuDeviceGetCount)
    return n if e == 0 else 0


def device_info(i: int) -> DeviceInfo:
    """Device ``i``: name, compute capability, bus id, memory, primary context state."""
    d = driver
    info = DeviceInfo(ordinal=i)
    A = d.CUdevice_attribute
    e, dev = call(d.cuDeviceGet, i)
    if e:
        info.error = f"cuDeviceGet: {error_name(e)}"
        return info
    e, name = call(d.cuDeviceGetName, 256, dev)
    info.name = cstr(name) if e == 0 else None
    e1, major = call(d.cuDeviceGetAttribute, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    e2, minor = call(d.cuDeviceGetAttribute, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    info.compute_capability = (major, minor) if e1 == e2 == 0 else None
    e, bus = call(d.cuDeviceGetPCIBusId, 32, dev)
    info.pci_bus_id = cstr(bus) if e == 0 else None
    e, mem = call(d.cuDeviceTotalMem, dev)
    info.total_memory = int(mem) if e == 0 else None
    e, state = call(d.cuDevicePrimaryCtxGetState, dev)
    if e == 0:
        info.primary_flags, info.primary_active = int(state[0]), bool(state[1])
    else:
        info.error = f"cuDevicePrimaryCtxGetState: {error_name(e)}"
    return info


def guard_infos() -> list[GuardInfo]:
    """The open ContextGuards of this process, each with the id the driver reports now."""
    d = driver
    out = []
    for g in live_guards():
        # Read, not looked at first: another thread may close the guard at any moment.
        try:
            h = g.handle
        except GuardError:  # closed
            continue
        # The handle value survives a reset, the id does not (docs/design.md "Reset";
        # docs/evidence.md, "Reset keeps the handle and changes the id"): CONTEXT_IS_DESTROYED means the context
        # behind the handle is destroyed and the primary is inactive.
        e, cid = call(d.cuCtxGetId, d.CUcontext(h))
        out.append(
            GuardInfo(
                device=g.device,
                handle=h,
                seen_id=g.context_id,
                driver_id=int(cid) if e == 0 else None,
                driver_id_error=error_name(e) if e else None,
                shared=g.is_shared,
                primary=g.is_primary,
            )
        )
    return sorted(out, key=lambda g: (g.device, g.handle))


def context_info(guards: list[GuardInfo], devices: list[DeviceInfo]) -> ContextInfo:
    """The calling thread's current context, queried through NULL, and whether it is primary."""
    d = driver
    e, cur = call(d.cuCtxGetCurrent)
    if e:
        return ContextInfo(handle=0, error=error_name(e))
    c = ContextInfo(handle=int(cur))
    if not c.handle:
        return c
    # Every query goes through NULL ("the current context"), not the handle: a context that
    # cuCtxDestroy freed on another thread stays current here, and passing its handle risks
    # a freed pointer. The H200 answers a dead current context -- an inactive primary or a
    # destroyed created one, alike -- with 709 from cuCtxGetApiVersion(NULL) and cuCtxGetId,
    # and cuCtxGetDevice still works; the handle passed explicitly gives 201 (docs/evidence.md,
    # "A dead context answers 201 through its handle and 709 through NULL").
    null = d.CUcontext(0)
    e, api = call(d.cuCtxGetApiVersion, null)
    c.usable = e == 0
    c.api_version = int(api) if e == 0 else None
    if e:
        c.why = f"cuCtxGetApiVersion(NULL) fails with {error_name(e)}"
    e, flags = call(d.cuCtxGetFlags)
    c.flags = int(flags) if e == 0 else None
    e, cid = call(d.cuCtxGetId, null)
    c.id, c.id_error = (int(cid), None) if e == 0 else (None, error_name(e))
    e, dev = call(d.cuCtxGetDevice)
    c.device = int(dev) if e == 0 else None
    primary_active = (
        devices[c.device].primary_active
        if c.device is not None and c.device < len(devices)
        else None
    )
    # The driver has no query for "is this a primary context" short of retaining the primary
    # (which the doctor never does), so it is told from what is known.
    held = [g for g in guards if g.handle == c.handle and g.device == c.device]
    if any(g.primary for g in held):
        c.primary, c.primary_why = True, "a ContextGuard holds this handle as a primary context"
    elif held:
        c.primary, c.primary_why = (
            False,
            (
                "a ContextGuard holds this handle as a context its caller owns (cuCtxCreate or green)"
            ),
        )
    elif primary_active is False and c.usable:
        c.primary, c.primary_why = (
            False,
            ("it is live while its device's primary context is inactive: made by cuCtxCreate"),
        )
    elif primary_active is True and c.usable and c.flags is not None and not c.flags & MAP_HOST:
        # Read-only: an active primary context always reports CU_CTX_MAP_HOST on top of its
        # flags (the driver's promise that it "always supports pinned allocations"); a
        # context made by cuCtxCreate reports only the flags it was made with.
        c.primary, c.primary_why = (
            False,
            f"its flags (cuCtxGetFlags: 0x{c.flags:x}) lack CU_CTX_MAP_HOST, which an active "
            f"primary context always reports: made by cuCtxCreate (or a green context)",
        )
    elif primary_active is True and not c.usable:
        c.primary, c.primary_why = (
            False,
            (
                "it is dead while its device's primary context is active: a context destroyed "
                "with cuCtxDestroy"
            ),
        )
    elif primary_active is False:
        c.primary_why = (
            "probably: it is dead and its device's primary context is inactive. The driver "
            "answers an inactive primary context and one destroyed with cuCtxDestroy alike"
        )
    else:
        c.primary_why = (
            "cannot tell without retaining the primary context, which the doctor never does"
        )
    return c
