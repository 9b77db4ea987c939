"""Everything ContextGuard accepts: ordinals, framework devices and streams, raw
contexts, green contexts; the frameworks' own view around guards (real driver, two GPUs)."""

import pytest
from helpers.children import run_child
from helpers.drivers import create_context, device_count, driver, ok
from helpers.fakes import fake
from helpers.threads import in_thread

import cyctx
from cyctx import ContextDestroyedError, ContextGuard

# --- raw handles -----------------------------------------------------------------------------


def test_primary_context_object_is_retained(sim):
    base = sim.retain_count(1)
    ref = ContextGuard(1)
    g = ContextGuard(ref.context)
    assert g.is_primary and g.device == 1 and g.handle == ref.handle
    assert sim.retain_count(1) == base + 2
    ref.close()
    with g:
        assert cyctx.current_handle() == g.handle
    g.close()
    assert sim.retain_count(1) == base


def test_created_context_is_the_callers():
    d = driver()
    dev = device_count() - 1  # device 1 where there are two: not the default
    ctx = create_context(dev, current=False)
    try:
        g = ContextGuard(ctx)
        assert not g.is_primary and g.device == dev and g.handle == int(ctx)
        h = ContextGuard.from_handle(int(ctx))
        assert h.handle == g.handle and not h.is_primary

        def body():
            with g:
                assert cyctx.current_handle() == int(ctx)
                with h:
                    assert cyctx.current_handle() == int(ctx)
            return cyctx.current_handle()

        assert in_thread(body) == 0
        g.close()
        h.close()
        # Closing a guard of the caller's context leaves the context alone.
        assert ok(d.cuCtxGetApiVersion(ctx)) > 0
    finally:
        ok(d.cuCtxDestroy(ctx))


def test_destroyed_context_is_refused_on_enter():
    d = driver()
    ctx = create_context(0, current=False)
    g = ContextGuard(ctx)
    ok(d.cuCtxDestroy(ctx))
    with pytest.raises(ContextDestroyedError) as ei:
        with g:
            pass
    assert ei.value.code == 709 and "destroyed by its owner" in str(ei.value)
    g.close()


def test_a_dead_or_null_handle_is_refused():
    d = driver()
    ctx = create_context(0, current=False)
    ok(d.cuCtxDestroy(ctx))
    with pytest.raises(cyctx.DriverError):
        ContextGuard(ctx)  # checked at construction too
    with pytest.raises(ValueError, match="NULL"):
        ContextGuard(d.CUcontext(0))


# --- framework objects, recognised without importing the framework ----------------------------


@pytest.mark.multigpu  # device 1, so that the default device 0 cannot pass by accident
@pytest.mark.parametrize(
    "make, device",
    [
        (lambda: fake("cupy.cuda.device", "Device", id=1), 1),
        (lambda: fake("cuda.core._device", "Device", device_id=1), 1),
        (lambda: fake("torch", "device", type="cuda", index=1), 1),
        (
            lambda: fake(
                "torch.cuda.streams",
                "Stream",
                cuda_stream=0,
                device=fake("torch", "device", index=1),
            ),
            1,
        ),
        (lambda: fake("cupy.cuda.stream", "Stream", ptr=0, device_id=1), 1),
    ],
)
def test_framework_objects_by_type(make, device):
    g = ContextGuard(make())
    assert g.device == device and g.is_primary
    g.close()


def test_no_framework_is_imported():
    out = run_child("""
        import sys, cyctx
        g = cyctx.ContextGuard(0)
        h = cyctx.ContextGuard(g.context)
        with g:
            with h:
                pass
        print("IMPORTED", sorted(m for m in ("torch", "cupy", "cuda.core", "numba") if m in sys.modules))
    """)
    assert "IMPORTED []" in out.stdout


# --- the real frameworks on two GPUs ------------------------------------------------------------

FRAMEWORKS = """
    import sys, cyctx
    d = drivers.driver()
    results = {}
    def primary(k):
        return cyctx.ContextGuard(k).handle
"""


@pytest.mark.gpu
@pytest.mark.multigpu
def test_framework_devices_and_streams_on_two_gpus():
    out = run_child(
        FRAMEWORKS
        + """
    import torch, cupy
    from cuda.core import Device
    for k in (0, 1):
        want = primary(k)
        for label, obj in [
            ("torch.device", torch.device("cuda", k)),
            ("cupy.Device", cupy.cuda.Device(k)),
            ("cuda.core.Device", Device(k)),
            ("torch.Stream", torch.cuda.Stream(device=k)),
            ("cupy.Stream", cupy.cuda.Stream(non_blocking=True) if k == 0 else None),
            ("cuda.core.Stream", (Device(k).set_current(), Device(k).create_stream())[1]),
            ("CUstream", (d.cuCtxSetCurrent(cyctx.ContextGuard(k).context), d.cuStreamCreate(0)[1])[1]),
        ]:
            if obj is None:
                continue
            g = cyctx.ContextGuard(obj)
            print("OBJ", label, k, g.device == k and g.handle == want)
        d.cuCtxSetCurrent(None)
    """,
        timeout=300,
    )
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("OBJ")]
    assert len(rows) >= 12, out.stdout
    assert all(r[-1] == "True" for r in rows), rows


@pytest.mark.gpu
@pytest.mark.multigpu
def test_frameworks_view_is_unchanged_and_allocations_land_inside():
    out = run_child(
        FRAMEWORKS
        + """
    import torch, cupy
    from cuda.core import Device
    def views():
        return (torch.cuda.current_device(), cupy.cuda.runtime.getDevice(), Device().device_id)
    torch.cuda.set_device(0); cupy.cuda.Device(0).use(); Device(0).set_current()
    before = views()
    gs = [cyctx.ContextGuard(k) for k in (0, 1)]
    for k in (1, 0):
        with gs[k]:
            t = torch.empty(4, device="cuda")
            c = cupy.empty(4)
            print("ALLOC", k, t.device.index, c.device.id, Device().device_id)
    print("VIEW", before == views(), before, views())
    with gs[0]:
        torch.cuda.set_device(1)             # a framework switching device inside the block
        cupy.cuda.Device(1).use()
    print("RESTORED", drivers.current() == gs[0].handle or drivers.current() == 0, drivers.current() == primary(0))
    """,
        timeout=300,
    )
    allocs = [ln.split()[1:] for ln in out.stdout.splitlines() if ln.startswith("ALLOC")]
    assert allocs and all(len(set(a)) == 1 for a in allocs), allocs
    assert "VIEW True" in out.stdout, out.stdout
    assert "RESTORED True True" in out.stdout, out.stdout


@pytest.mark.gpu
def test_green_context():
    out = run_child("""
        import cyctx
        d = drivers.driver()
        dev = drivers.ok(d.cuDeviceGet(0))
        err, res = d.cuDeviceGetDevResource(dev, d.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
        if err != d.CUresult.CUDA_SUCCESS:
            print("UNSUPPORTED", err); raise SystemExit(0)
        err, groups, n, rest = d.cuDevSmResourceSplitByCount(1, res, 0, 8)
        err, desc = d.cuDevResourceGenerateDesc([groups[0]], 1)
        err, green = d.cuGreenCtxCreate(desc, dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM)
        assert err == d.CUresult.CUDA_SUCCESS, err
        g = cyctx.ContextGuard(green)
        with g:
            print("GREEN", not g.is_primary, drivers.current() == g.handle, int(drivers.ok(d.cuCtxGetDevice())))
        g.close()
        d.cuGreenCtxDestroy(green)
    """)
    if "UNSUPPORTED" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert "GREEN True True 0" in out.stdout, out.stdout
