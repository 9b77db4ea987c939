"""Differential scenarios: driver-call scripts run against the real and the simulated driver.

Every scenario is a function ``f(r)`` that drives ``cuda.bindings.driver`` through the
recorder ``r`` and is run by ``run.py`` in its OWN fresh interpreter: primary-context state,
``cuInit`` and the per-thread stacks are process-global, so one scenario must never see what
another one left behind.

What gets recorded is only what a program can observe, normalised so that two processes on
two machines can be compared event by event:

* ``CUresult`` codes by name (``"CUDA_ERROR_INVALID_CONTEXT"``);
* context handles as labels in order of first appearance (``"ctx#1"``; NULL is ``None``), so
  "the same handle came back" is compared while the pointer value is not;
* context ids (``cuCtxGetId``) likewise as ``"id#1"`` labels, so "the id changed" is compared
  while the driver's global counter is not (the real driver's ids depend on what else ran);
* flags, active, device ordinals, api versions and attribute values as plain values;
* machine-specific data (device name, memory size, SM count, driver version) under the key
  ``"info"``, which the comparer ignores.

The facts measured by C probes on an H200 (driver 580.159; docs/evidence.md, "Driver behaviour")
are quoted next to the scenario that checks them ("lab: ..."); everything else is what the real record
says once it has been made on the GPU machine (``real_h200.json``).

Only the driver API is used: no cudart, because the simulated driver implements only
``libcuda.so.1``.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
import traceback
import warnings

SCENARIOS: dict = {}  # name -> scenario function, in definition order (run.py's order)


def scenario(fn):
    """Register ``fn`` under its name without the ``s_`` prefix, in definition order."""
    name = fn.__name__[2:] if fn.__name__.startswith("s_") else fn.__name__
    SCENARIOS[name] = fn
    return fn


class Skip(Exception):
    """Raised inside a scenario that cannot run on this machine (e.g. fewer than 2 devices)."""


# --- Recorder ---------------------------------------------------------------------------------


class _Labels:
    """Maps raw values to labels in order of first appearance; shared by a scenario's threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ctx: dict[int, str] = {}
        self.ids: dict[int, str] = {}
        self.prefix = ""  # "child-" in a fork child: see Recorder.fork

    def ctx_label(self, value: int):
        if value == 0:
            return None  # how a NULL context handle is recorded
        with self.lock:
            if value not in self.ctx:
                self.ctx[value] = f"{self.prefix}ctx#{len(self.ctx) + 1}"
            return self.ctx[value]

    def id_label(self, value: int):
        with self.lock:
            if value not in self.ids:
                self.ids[value] = f"{self.prefix}id#{len(self.ids) + 1}"
            return self.ids[value]


class Res:
    """Result of one recorded call: ``rc`` is the CUresult name (None if the binding raised)."""

    __slots__ = ("rc", "values")

    def __init__(self, rc, values):
        self.rc = rc
        self.values = values

    @property
    def ok(self) -> bool:
        return self.rc == "CUDA_SUCCESS"

    @property
    def val(self):
        """The first output (or None)."""
        return self.values[0] if self.values else None


def _result_name(err) -> str:
    name = getattr(err, "name", None)
    return name if isinstance(name, str) else f"CUresult({int(err)})"


class Recorder:
    """Records normalised driver-call outcomes.

    ``call(fname, *args, out=...)`` looks ``fname`` up in ``cuda.bindings.driver``, calls it,
    and appends ``{"call", "args", "rc", "out"}``. ``out`` says how to normalise the outputs
    when the default (by type) is not enough: ``"id"`` for context ids, ``"info"`` for values
    the comparer must ignore, or a list with one such spec per output (``None`` = default).
    """

    def __init__(self, driver, labels: _Labels | None = None, thread: str | None = None):
        self.d = driver
        self.labels = labels or _Labels()
        self.thread = thread
        self.events: list[dict] = []

    # -- normalisation ----------------------------------------------------------------------

    def norm(self, v, spec=None):
        d = self.d
        if spec == "id":
            return None if v is None else self.labels.id_label(int(v))
        if spec == "ctx":
            return self.labels.ctx_label(int(v))
        if v is None:
            return None
        if isinstance(v, d.CUcontext):
            return self.labels.ctx_label(int(v))
        if isinstance(v, d.CUdevice):
            return int(v)
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and hasattr(v, "name") and type(v) is not int:
            return v.name  # an enum member
        if isinstance(v, int):
            return int(v)  # also strips a nameless enum instance (see _bogus_enum) to its value
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).split(b"\0", 1)[0].decode("utf-8", "replace")
        if isinstance(v, str):
            return v
        if isinstance(v, (list, tuple)):
            return [self.norm(x) for x in v]
        return type(v).__name__

    def _event(self, ev: dict) -> dict:
        if self.thread is not None:
            ev = {"thread": self.thread, **ev}
        self.events.append(ev)
        return ev

    # -- recording --------------------------------------------------------------------------

    def call(
        self, fname: str, *args, out=None, tag: str | None = None, via: str | None = None
    ) -> Res:
        # `via`: the binding to call when it differs by major (recorded under `fname`).
        ev = {"call": fname, "args": [self.norm(a) for a in args]}
        if tag:
            ev["tag"] = tag
        fn = getattr(self.d, via or fname, None)
        if fn is None:
            # An older cuda-bindings without this entry point: an environment difference the
            # comparer must show, not a crash of the whole scenario.
            ev["exc"] = "missing-binding"
            self._event(ev)
            return Res(None, ())
        try:
            ret = fn(*args)
        except Exception as e:  # the binding raised (bad argument type, symbol not found ...)
            ev["exc"] = type(e).__name__
            ev["info"] = str(e)[:300]
            self._event(ev)
            return Res(None, ())
        if not isinstance(ret, tuple):
            ret = (ret,)
        err, values = ret[0], ret[1:]
        ev["rc"] = _result_name(err)
        res = Res(ev["rc"], values)
        if values and res.ok:
            # Outputs of a failed call are whatever the binding's default is: not observable.
            specs = out if isinstance(out, list) else [out] * len(values)
            normed, info = [], []
            for v, s in zip(values, specs, strict=True):
                if s == "info":
                    info.append(self.norm(v))
                    normed.append("<info>")
                else:
                    normed.append(self.norm(v, s))
            ev["out"] = normed[0] if len(normed) == 1 else normed
            if info:
                ev["info"] = info[0] if len(info) == 1 else info
        self._event(ev)
        return res

    def note(self, what: str, value, tag: str | None = None):
        """A derived observation (e.g. "same handle"), compared like a call result."""
        ev = {"note": what, "value": value}
        if tag:
            ev["tag"] = tag
        self._event(ev)

    # -- threads ----------------------------------------------------------------------------

    def sub(self, thread: str) -> Recorder:
        """A recorder for another thread: shares the label table, keeps its own events.

        Its events are merged back by ``join`` so the event order is deterministic
        (each thread's own sequence, one block after another) whatever the interleaving was.
        Scenarios make sure every handle a thread will see was labelled on the main thread
        first, so label numbering does not depend on scheduling either.
        """
        return Recorder(self.d, self.labels, thread)

    def start_thread(self, name: str, body) -> Recorder:
        """Start ``body(sub_recorder)`` on a new thread; ``join`` merges its events."""
        sub = self.sub(name)
        sub.tb = None

        def target():
            try:
                body(sub)
            except Exception:
                sub.tb = traceback.format_exc()

        sub.runner = threading.Thread(target=target, name=name)
        sub.runner.start()
        return sub

    def join(self, *subs: Recorder):
        """Join the threads of ``subs`` and merge their events, in the order given."""
        for sub in subs:
            sub.runner.join(60)
            if sub.runner.is_alive():
                sub._event({"note": "thread did not finish in 60 s", "value": True})
            self.events.extend(sub.events)
        for sub in subs:
            if sub.tb:
                raise RuntimeError(f"thread {sub.thread} raised:\n{sub.tb}")

    def run_thread(self, name: str, body):
        """Run ``body(sub_recorder)`` on a new thread, join it, merge its events."""
        self.join(self.start_thread(name, body))

    # -- fork -------------------------------------------------------------------------------

    def fork(self, body, timeout: float = 30.0):
        """Run ``body(child_recorder)`` in an ``os.fork`` child; merge its events here.

        The child writes its events through a pipe and leaves with ``os._exit`` (no atexit
        handlers, no driver teardown in the child). Handles the parent had already labelled
        keep their labels in the child (fork copied the table); handles first seen in the
        child get ``child-`` labels and are NOT adopted by the parent: whether the parent's
        later handle has the same address as one in the child is an allocator accident of
        two processes, not an observable to compare.
        """
        rfd, wfd = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a multi-threaded process (the driver's helper
            # threads) may deadlock; forking after CUDA use is exactly what is under test.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # child
            os.close(rfd)
            self.labels.prefix = "child-"
            sub = Recorder(self.d, self.labels, "child")
            payload = {"events": None, "error": None}
            try:
                body(sub)
            except Exception:
                payload["error"] = traceback.format_exc()
            payload["events"] = sub.events
            data = json.dumps(payload).encode()
            try:
                view = memoryview(data)
                while view:
                    n = os.write(wfd, view)
                    view = view[n:]
            finally:
                os._exit(0)
        os.close(wfd)
        chunks, deadline = [], time.monotonic() + timeout
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(rfd)
        if timed_out:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        if timed_out:
            self.note("fork child", "timed out (killed)")
            return
        if os.WIFSIGNALED(status):
            self.note("fork child", f"killed by signal {os.WTERMSIG(status)}")
            return
        payload = json.loads(b"".join(chunks).decode())
        self.events.extend(payload["events"])
        if payload["error"]:
            raise RuntimeError("fork child raised:\n" + payload["error"])
        self.note("fork child exit status", os.WEXITSTATUS(status))


# --- Small helpers used by many scenarios -----------------------------------------------------


def init(r):
    return r.call("cuInit", 0)


def count(r) -> int:
    res = r.call("cuDeviceGetCount")
    return int(res.val) if res.ok else 0


def same(a: Res, b: Res) -> bool:
    """Both calls succeeded and returned the same handle."""
    return a.ok and b.ok and int(a.val) == int(b.val)


def need_devices(r, n: int) -> int:
    c = count(r)
    if c < n:
        raise Skip(f"needs {n} devices, this machine has {c}")
    return c


def cur(r, tag=None):
    return r.call("cuCtxGetCurrent", tag=tag)


def state(r, dev=0, tag=None):
    """cuDevicePrimaryCtxGetState: outputs (flags, active)."""
    return r.call("cuDevicePrimaryCtxGetState", dev, tag=tag)


def retain(r, dev=0, tag=None):
    return r.call("cuDevicePrimaryCtxRetain", dev, tag=tag)


def release(r, dev=0, tag=None):
    return r.call("cuDevicePrimaryCtxRelease", dev, tag=tag)


def ctx_id(r, ctx, tag=None):
    return r.call("cuCtxGetId", ctx, out="id", tag=tag)


def push(r, ctx, tag=None):
    return r.call("cuCtxPushCurrent", ctx, tag=tag)


def pop(r, tag=None):
    return r.call("cuCtxPopCurrent", tag=tag)


def create(r, dev=0, flags=0, params=None, tag=None):
    """cuCtxCreate, v4 ABI (params, flags, dev); it pushes. cuda-bindings 13 exposes it as
    cuCtxCreate, 12.x as cuCtxCreate_v4 (its cuCtxCreate is the old (flags, dev) one)."""
    via = "cuCtxCreate" if r.d.CUDA_VERSION >= 13000 else "cuCtxCreate_v4"
    return r.call("cuCtxCreate", params, flags, dev, tag=tag, via=via)


def has(r, fname):
    """CUDA 13 added some entry points (cuCtxGetDevice_v2, cuCtxSynchronize_v2); a run with
    12.x bindings skips those steps, and is compared with a 12.x real record."""
    return hasattr(r.d, fname)


def null_ctx(r):
    return r.d.CUcontext(0)


def drain_stack(r, limit=64):
    """Pop whatever this thread still has current (cleanup; recorded so it is compared)."""
    for _ in range(limit):
        c = r.call("cuCtxGetCurrent", tag="cleanup")
        if not c.ok or c.val is None or int(c.val) == 0:
            return
        if not r.call("cuCtxPopCurrent", tag="cleanup").ok:
            return


def probe_current(r, tag):
    """Everything the 'classic report' looks at, for the context current on this thread."""
    cur(r, tag=tag)
    r.call("cuCtxGetDevice", tag=tag)
    r.call("cuCtxGetFlags", tag=tag)
    r.call("cuCtxGetApiVersion", null_ctx(r), tag=tag)
    r.call("cuCtxGetId", null_ctx(r), out="id", tag=tag)
    r.call("cuCtxSynchronize", tag=tag)


def _bogus_enum(cls, value: int):
    """An instance of enum ``cls`` with a value outside it, as a C caller could pass: the
    binding's ``cls(value)`` raises ValueError, so the driver would never see it.

    Only ``_value_`` is set (what a stdlib-IntEnum binding reads; FastEnum reads ``int(self)``);
    no name, so the recorder prints it as the bare number with either kind of binding.
    """
    obj = int.__new__(cls, value)
    try:
        obj._value_ = value
    except Exception:
        pass
    return obj


# --- Initialisation, version, devices, error strings ------------------------------------------


@scenario
def s_init_basic(r):
    # Before cuInit the driver reports NOT_INITIALIZED for everything that needs it, while
    # cuDriverGetVersion works (it is documented to need no init).
    res = r.call("cuDriverGetVersion", out="info", tag="before init")
    r.call("cuDeviceGetCount", tag="before init")
    r.call("cuDeviceGet", 0, tag="before init")
    cur(r, tag="before init")
    state(r, 0, tag="before init")
    r.call("cuInit", 0)
    r.call("cuInit", 0, tag="second cuInit is a no-op")
    n = count(r)
    r.note("device count >= 1", n >= 1)
    cur(r, tag="after init: nothing current")
    state(r, 0, tag="after init: primary inactive")
    if res.ok:
        r.note("driver version >= 12000", int(res.val) >= 12000)


@scenario
def s_init_bad_flags(r):
    # cuInit's flags must be 0; a failed cuInit must not leave the driver initialised.
    r.call("cuInit", 1, tag="bad flags")
    r.call("cuDeviceGetCount", tag="after failed cuInit")
    r.call("cuInit", 0xFFFFFFFF, tag="bad flags")
    r.call("cuInit", 0, tag="good cuInit after bad ones")
    count(r)
    r.call("cuInit", 1, tag="bad flags after a successful cuInit")
    count(r)


@scenario
def s_driver_version(r):
    res = r.call("cuDriverGetVersion", out="info")
    init(r)
    res2 = r.call("cuDriverGetVersion", out="info", tag="after init")
    if res.ok and res2.ok:
        r.note("version unchanged by cuInit", int(res.val) == int(res2.val))
        r.note("version is a 13.x driver", 13000 <= int(res.val) < 14000)


@scenario
def s_device_get_ordinals(r):
    init(r)
    n = count(r)
    for k in range(n):
        r.call("cuDeviceGet", k)
    # Bad ordinals: negative, one past the end, absurd.
    r.call("cuDeviceGet", -1, tag="bad ordinal")
    r.call("cuDeviceGet", n, tag="ordinal == count")
    r.call("cuDeviceGet", 10**6, tag="bad ordinal")


@scenario
def s_device_name_and_capability(r):
    init(r)
    n = count(r)
    a = r.d.CUdevice_attribute
    for k in range(n):
        r.call("cuDeviceGetName", 256, k, out="info")  # names are not compared
        r.call("cuDeviceTotalMem", k, out="info")  # neither are memory sizes
        r.call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, k)
        r.call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, k)
    r.call("cuDeviceGetName", 256, -1, tag="bad ordinal")
    r.call("cuDeviceGetName", 256, n, tag="ordinal == count")
    r.call("cuDeviceGetName", 256, 10**6, tag="bad ordinal")
    r.call("cuDeviceTotalMem", -1, tag="bad ordinal")


@scenario
def s_device_attributes(r):
    init(r)
    a = r.d.CUdevice_attribute
    # Values that hold for any Hopper-class GPU a simulation claims to be: compared.
    for name in (
        "CU_DEVICE_ATTRIBUTE_WARP_SIZE",
        "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
        "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",
        "CU_DEVICE_ATTRIBUTE_COMPUTE_MODE",
        "CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY",
    ):
        r.call("cuDeviceGetAttribute", getattr(a, name), 0)
    # Values that depend on the board and clocks: recorded for humans only.
    for name in ("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", "CU_DEVICE_ATTRIBUTE_PCI_BUS_ID"):
        r.call("cuDeviceGetAttribute", getattr(a, name), 0, out="info")
    # Bad attribute: the enum's own MAX sentinel and a value the enum does not know.
    r.call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_MAX, 0, tag="bad attribute")
    r.call("cuDeviceGetAttribute", _bogus_enum(a, 100000), 0, tag="bad attribute")
    n = count(r)
    maj = a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    r.call("cuDeviceGetAttribute", maj, -1, tag="bad ordinal")
    r.call("cuDeviceGetAttribute", maj, n, tag="ordinal == count")
    r.call("cuDeviceGetAttribute", maj, 10**6, tag="bad ordinal")


@scenario
def s_device_attributes_before_init(r):
    a = r.d.CUdevice_attribute
    r.call("cuDeviceGetAttribute", a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)
    r.call("cuDeviceGetName", 256, 0)
    r.call("cuDeviceTotalMem", 0)


@scenario
def s_error_names_and_strings(r):
    R = r.d.CUresult
    codes = [
        R.CUDA_SUCCESS,
        R.CUDA_ERROR_INVALID_VALUE,
        R.CUDA_ERROR_NOT_INITIALIZED,
        R.CUDA_ERROR_DEINITIALIZED,
        R.CUDA_ERROR_INVALID_DEVICE,
        R.CUDA_ERROR_INVALID_CONTEXT,
        R.CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
        R.CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
        R.CUDA_ERROR_CONTEXT_IS_DESTROYED,
        R.CUDA_ERROR_NOT_SUPPORTED,
        R.CUDA_ERROR_UNKNOWN,
    ]
    # Half before cuInit (they need no init), half after.
    for c in codes[:5]:
        r.call("cuGetErrorName", c)
        r.call("cuGetErrorString", c)
    init(r)
    for c in codes[5:]:
        r.call("cuGetErrorName", c)
        r.call("cuGetErrorString", c)
    # An unknown code: the driver says INVALID_VALUE and returns no string.
    for v in (12345, 0x7FFFFFFF):
        bad = _bogus_enum(r.d.CUresult, v)
        r.call("cuGetErrorName", bad, tag=f"unknown code {v}")
        r.call("cuGetErrorString", bad, tag=f"unknown code {v}")


# --- Primary context: retain / release / state / flags ----------------------------------------


@scenario
def s_primary_refcount(r):
    init(r)
    state(r, tag="never retained: inactive")
    a = retain(r, tag="retain #1 activates")
    state(r)
    # lab: "after driver retain only (not current) cur=(nil)": retain does not make current.
    cur(r, tag="retain does not make current")
    b = retain(r, tag="retain #2: same handle")
    r.note("same handle", same(a, b))
    release(r, tag="release #1 of 2")
    state(r, tag="still active (one retain left)")
    release(r, tag="release #2 of 2")
    state(r, tag="inactive after the last release")
    # lab: "release#3 (unbalanced) r201".
    release(r, tag="unbalanced release")
    state(r, tag="still inactive")


@scenario
def s_primary_release_never_retained(r):
    init(r)
    release(r, tag="release without retain")
    state(r)
    for step in (retain, release, state):
        for dev in (-1, 10**6):
            step(r, dev, tag="bad ordinal")
    n = count(r)
    state(r, n, tag="ordinal == count")
    r.call("cuDevicePrimaryCtxReset", -1, tag="bad ordinal")
    r.call("cuDevicePrimaryCtxSetFlags", -1, 0, tag="bad ordinal")


@scenario
def s_primary_retain_after_full_release(r):
    # The primary handle is stable per device; a fresh activation gets a fresh id.
    # lab (probe2): after releasing to zero, the next retain gave the same pointer, id 3.
    init(r)
    a = retain(r)
    ctx_id(r, a.val, tag="first activation id")
    r.call("cuCtxGetApiVersion", a.val)
    release(r)
    state(r, tag="inactive")
    r.call("cuCtxGetApiVersion", a.val, tag="handle of an inactive primary")
    ctx_id(r, a.val, tag="id of an inactive primary")
    b = retain(r, tag="re-activate")
    r.note("same handle after full release", same(a, b))
    ctx_id(r, b.val, tag="new id")
    r.call("cuCtxGetApiVersion", b.val)
    release(r)


@scenario
def s_primary_set_flags(r):
    init(r)
    F = r.d.CUctx_flags
    state(r, tag="default flags")
    r.call("cuDevicePrimaryCtxSetFlags", 0, int(F.CU_CTX_SCHED_BLOCKING_SYNC))
    state(r, tag="flags set, still inactive")
    r.call("cuDevicePrimaryCtxSetFlags", 0, int(F.CU_CTX_SCHED_SPIN))
    state(r, tag="flags overwritten")
    # Invalid: two scheduling policies at once; bits outside the flag mask.
    r.call("cuDevicePrimaryCtxSetFlags", 0, 3, tag="SPIN|YIELD is invalid")
    r.call("cuDevicePrimaryCtxSetFlags", 0, 0xFFFF0000, tag="unknown bits")
    state(r, tag="unchanged by failed SetFlags")
    pc = retain(r, tag="activates with the set flags")
    state(r)
    push(r, pc.val)
    r.call("cuCtxGetFlags", tag="flags of the current primary")
    pop(r)
    release(r)
    r.call("cuDevicePrimaryCtxSetFlags", 0, 0, tag="back to default")
    state(r)


@scenario
def s_primary_set_flags_while_active(r):
    # Before CUDA 11 this returned PRIMARY_CONTEXT_ACTIVE; the record says what 13.0 does.
    init(r)
    F = r.d.CUctx_flags
    pc = retain(r)
    r.call("cuDevicePrimaryCtxSetFlags", 0, int(F.CU_CTX_SCHED_BLOCKING_SYNC), tag="while active")
    state(r)
    push(r, pc.val)
    r.call("cuCtxGetFlags")
    r.call("cuCtxSetFlags", int(F.CU_CTX_SCHED_YIELD), tag="cuCtxSetFlags on the current ctx")
    r.call("cuCtxGetFlags")
    state(r)
    pop(r)
    release(r)
    state(r, tag="flags survive deactivation")
    r.call("cuDevicePrimaryCtxSetFlags", 0, 0)


# --- Primary context reset (cuDevicePrimaryCtxReset, what cudaDeviceReset does underneath) ----


@scenario
def s_reset_while_retained(r):
    # lab (probe2, via cudaDeviceReset with a driver retain held): the retain survives the
    # reset (two releases needed after one re-retain), the handle is reused, the id changes.
    init(r)
    a = retain(r)
    ctx_id(r, a.val, tag="id before reset")
    r.call("cuDevicePrimaryCtxReset", 0)
    state(r, tag="inactive after reset")
    ctx_id(r, a.val, tag="stale handle: id")  # lab: 709
    r.call("cuCtxGetApiVersion", a.val, tag="stale handle: api version")  # lab: 201
    b = retain(r, tag="re-retain")
    r.note("same handle after reset", same(a, b))
    ctx_id(r, b.val, tag="new id after reset")
    state(r)
    release(r, tag="release #1")
    state(r, tag="lab: still active (pre-reset retain survived)")
    release(r, tag="release #2")
    state(r, tag="lab: inactive")
    release(r, tag="lab: unbalanced -> 201")


@scenario
def s_reset_stale_current(r):
    # The classic state (docs/design.md, "The problem"): a non-NULL current handle whose context is dead.
    init(r)
    pc = retain(r)
    push(r, pc.val)
    ctx_id(r, pc.val, tag="id before reset")
    r.call("cuDevicePrimaryCtxReset", 0)
    # lab: cur unchanged, apiver r201, ctxdev=0 r0, id -> 709.
    probe_current(r, tag="stale handle current")
    state(r, tag="inactive")
    r.call("cuCtxGetApiVersion", pc.val, tag="explicit stale handle")
    ctx_id(r, pc.val, tag="explicit stale handle")
    # lab: "push stale: r0".
    p = push(r, pc.val, tag="push the stale handle")
    if p.ok:
        pop(r, tag="pop it again")
    cur(r)
    pc2 = retain(r, tag="re-retain makes the handle valid again")
    r.note("same handle", same(pc, pc2))
    probe_current(r, tag="after re-retain")
    pop(r)
    release(r)
    release(r)
    state(r, tag="inactive at the end")


@scenario
def s_reset_not_retained(r):
    init(r)
    r.call("cuDevicePrimaryCtxReset", 0, tag="never activated")
    state(r)
    pc = retain(r)
    release(r)
    r.call("cuDevicePrimaryCtxReset", 0, tag="after release to zero")
    state(r)
    r.call("cuDevicePrimaryCtxReset", 10**6, tag="bad ordinal")
    pc2 = retain(r)
    r.note("same handle", same(pc, pc2))
    release(r)


@scenario
def s_reset_keeps_flags(r):
    # Reset documents "reset all state": does it also reset SetFlags? The record says.
    init(r)
    F = r.d.CUctx_flags
    r.call("cuDevicePrimaryCtxSetFlags", 0, int(F.CU_CTX_SCHED_BLOCKING_SYNC))
    retain(r)
    r.call("cuDevicePrimaryCtxReset", 0)
    state(r, tag="flags after reset")
    release(r)
    r.call("cuDevicePrimaryCtxSetFlags", 0, 0)


# --- The per-thread context stack -------------------------------------------------------------


@scenario
def s_stack_push_pop(r):
    init(r)
    cur(r, tag="empty")
    pc = retain(r)
    push(r, pc.val)
    cur(r)
    push(r, pc.val, tag="same context twice")
    pop(r)
    cur(r, tag="still current (pushed twice)")
    pop(r)
    cur(r, tag="empty again")
    pop(r, tag="pop on empty stack")
    cur(r)
    release(r)


@scenario
def s_stack_push_null(r):
    init(r)
    push(r, null_ctx(r), tag="push NULL on empty stack")
    cur(r)
    pc = retain(r)
    push(r, pc.val)
    push(r, null_ctx(r), tag="push NULL on non-empty stack")
    cur(r)
    drain_stack(r)
    release(r)


@scenario
def s_stack_set_current_replaces_top(r):
    init(r)
    pc = retain(r)
    c = create(r, tag="created ctx (pushed)")
    pop(r, tag="take it off again")
    push(r, pc.val)
    r.call("cuCtxSetCurrent", c.val, tag="replaces the top")
    cur(r)
    pop(r, tag="pops the replacement")
    cur(r, tag="primary was replaced, not kept below")
    r.call("cuCtxSetCurrent", c.val, tag="on an empty stack: pushes")
    cur(r)
    r.call("cuCtxSetCurrent", c.val, tag="already current")
    pop(r)
    cur(r)
    r.call("cuCtxDestroy", c.val)
    release(r)


@scenario
def s_stack_set_current_null(r):
    init(r)
    pc = retain(r)
    c = create(r)
    pop(r)
    push(r, pc.val)
    push(r, c.val)
    r.call("cuCtxSetCurrent", null_ctx(r), tag="pops the top")
    cur(r, tag="the one below is current")
    r.call("cuCtxSetCurrent", null_ctx(r), tag="pops the last")
    cur(r, tag="empty")
    r.call("cuCtxSetCurrent", null_ctx(r), tag="empty stack: no-op")
    cur(r)
    pop(r, tag="pop on empty")
    r.call("cuCtxDestroy", c.val)
    release(r)


@scenario
def s_stack_no_current(r):
    # Every call that needs "the current context" with none current.
    init(r)
    probe_current(r, tag="nothing current")
    if has(r, "cuCtxGetDevice_v2"):
        r.call("cuCtxGetDevice_v2", null_ctx(r), tag="NULL = current")
    if has(r, "cuCtxSynchronize_v2"):
        r.call("cuCtxSynchronize_v2", null_ctx(r), tag="NULL = current")
    r.call("cuCtxSetFlags", 0, tag="nothing current")
    pop(r, tag="pop on empty")


@scenario
def s_stack_with_current(r):
    init(r)
    pc = retain(r)
    push(r, pc.val)
    probe_current(r, tag="primary current")
    r.call("cuCtxGetApiVersion", pc.val)
    ctx_id(r, pc.val, tag="explicit handle: same id as NULL")
    if has(r, "cuCtxGetDevice_v2"):
        r.call("cuCtxGetDevice_v2", null_ctx(r))
        r.call("cuCtxGetDevice_v2", pc.val)
    if has(r, "cuCtxSynchronize_v2"):
        r.call("cuCtxSynchronize_v2", null_ctx(r))
        r.call("cuCtxSynchronize_v2", pc.val)
    pop(r)
    # A retained but not current primary: explicit-handle calls still work.
    r.call("cuCtxGetApiVersion", pc.val, tag="not current, explicit")
    ctx_id(r, pc.val, tag="not current, explicit")
    if has(r, "cuCtxGetDevice_v2"):
        r.call("cuCtxGetDevice_v2", pc.val, tag="not current, explicit")
    release(r)


@scenario
def s_stack_before_init(r):
    # Nothing initialised: the stack calls all report NOT_INITIALIZED (or don't: recorded).
    cur(r)
    push(r, null_ctx(r))
    pop(r)
    r.call("cuCtxSetCurrent", null_ctx(r))
    r.call("cuCtxGetDevice")
    r.call("cuCtxGetFlags")
    r.call("cuCtxSynchronize")
    r.call("cuCtxGetApiVersion", null_ctx(r))
    retain(r)
    release(r)
    r.call("cuDevicePrimaryCtxReset", 0)
    r.call("cuDevicePrimaryCtxSetFlags", 0, 0)
    create(r)


@scenario
def s_stack_deep(r):
    init(r)
    pc = retain(r)
    c = create(r)
    pop(r)
    depth = 100
    oks = 0
    for i in range(depth):
        oks += push(r, pc.val if i % 2 == 0 else c.val).ok
    r.note("pushes ok", oks)
    order_ok = 0
    for i in reversed(range(depth)):
        p = r.call("cuCtxPopCurrent")
        want = pc.val if i % 2 == 0 else c.val
        order_ok += bool(p.ok and int(p.val) == int(want))
    r.note("pops returned LIFO order", order_ok)
    # The per-call events above are many; the notes carry the verdict, the events the detail.
    cur(r)
    pop(r, tag="pop on empty")
    r.call("cuCtxDestroy", c.val)
    release(r)


# --- Created contexts (cuCtxCreate / cuCtxDestroy) --------------------------------------------
#
# No scenario creates a context after destroying one while the old handle is still used:
# the real driver may hand out the freed address again, and label equality would then say
# "same handle" for an allocator accident.


@scenario
def s_create_variants(r):
    init(r)
    F = r.d.CUctx_flags
    pc = retain(r)
    a = create(r, params=None, tag="params=None")
    cur(r, tag="create pushes")
    r.call("cuCtxGetApiVersion", a.val)
    r.call("cuCtxGetFlags")
    r.call("cuCtxGetDevice")
    ctx_id(r, a.val)
    pop(r)
    b = create(r, params=r.d.CUctxCreateParams(), tag="empty CUctxCreateParams")
    cur(r)
    ctx_id(r, b.val)
    pop(r)
    c = create(r, flags=int(F.CU_CTX_SCHED_BLOCKING_SYNC), tag="BLOCKING_SYNC")
    r.call("cuCtxGetFlags", tag="flags of the created ctx")
    pop(r)
    created = [x for x in (a, b, c) if x.ok]
    everything = created + [pc] if pc.ok else created
    r.note(
        "all distinct from each other and from the primary",
        len({int(x.val) for x in everything}) == len(everything),
    )
    create(r, dev=-1, tag="bad ordinal")
    create(r, dev=10**6, tag="bad ordinal")
    create(r, flags=3, tag="SPIN|YIELD is invalid")
    create(r, flags=0xFFFF0000, tag="unknown bits")
    cur(r, tag="failed creates push nothing")
    for x in created:
        r.call("cuCtxDestroy", x.val)
    state(r, tag="creating contexts does not touch the primary's state")
    release(r)


@scenario
def s_create_pushes_on_stack(r):
    init(r)
    pc = retain(r)
    push(r, pc.val)
    c = create(r)
    cur(r, tag="new context on top")
    pop(r, tag="pops the created one")
    cur(r, tag="primary below again")
    pop(r)
    r.call("cuCtxDestroy", c.val, tag="destroy, not current")
    cur(r)
    release(r)


@scenario
def s_destroy_while_current(r):
    init(r)
    pc = retain(r)
    push(r, pc.val)
    c = create(r)
    r.call("cuCtxDestroy", c.val, tag="current: destroy pops it")
    cur(r, tag="primary below is current again")
    pop(r)
    cur(r)
    release(r)


@scenario
def s_destroy_below_top(r):
    # The destroyed context is in the stack but not on top: it stays there, stale.
    init(r)
    pc = retain(r)
    c = create(r)  # stack: c
    push(r, pc.val)  # stack: c, pc
    r.call("cuCtxDestroy", c.val, tag="not on top")
    cur(r, tag="top unchanged")
    pop(r)
    probe_current(r, tag="stale created context uncovered")
    pop(r, tag="pop the stale one")
    cur(r)
    release(r)


@scenario
def s_destroy_twice(r):
    init(r)
    c = create(r)
    pop(r)
    r.call("cuCtxDestroy", c.val, tag="first")
    r.call("cuCtxDestroy", c.val, tag="second")
    r.call("cuCtxGetApiVersion", c.val, tag="destroyed handle")
    ctx_id(r, c.val, tag="destroyed handle")
    r.call("cuCtxDestroy", null_ctx(r), tag="NULL")
    cur(r)


@scenario
def s_destroy_primary_handle(r):
    init(r)
    pc = retain(r)
    r.call("cuCtxDestroy", pc.val, tag="destroy a primary handle (not current)")
    state(r)
    r.call("cuCtxGetApiVersion", pc.val)
    push(r, pc.val)
    r.call("cuCtxDestroy", pc.val, tag="destroy a primary handle (current)")
    cur(r)
    state(r)
    drain_stack(r)
    release(r)
    state(r)


# No scenario pushes or sets a context after cuCtxDestroy: on the H200 (driver 580.159) both
# crash the process with a segfault (docs/evidence.md, "Pushing or setting a destroyed context
# crashes the driver"): the handle points at freed memory, so there is no behaviour to compare.
# cyctx never does it either (it only holds retained primaries).


@scenario
def s_destroy_current_on_other_thread(r):
    # Documented: "If ctx is current to other threads, then ctx will remain current to those
    # threads, and attempting to access ctx from those threads will result in the error
    # CUDA_ERROR_CONTEXT_IS_DESTROYED."
    init(r)
    c = create(r)
    pop(r)
    pushed, destroyed = threading.Event(), threading.Event()

    def worker(t):
        push(t, c.val)
        pushed.set()
        destroyed.wait(30)
        probe_current(t, tag="destroyed on the other thread")
        pop(t, tag="pop the dead context")
        cur(t)
        pop(t, tag="empty now")

    sub = r.start_thread("T", worker)
    pushed.wait(30)
    r.call("cuCtxDestroy", c.val, tag="while current on T")
    cur(r, tag="main thread: nothing current")
    destroyed.set()
    r.join(sub)


# --- Threads ----------------------------------------------------------------------------------


@scenario
def s_thread_starts_empty(r):
    # lab (probe): "new thread, nothing called cur=(nil)".
    init(r)
    pc = retain(r)
    push(r, pc.val)

    def body(t):
        probe_current(t, tag="new thread")
        pop(t, tag="new thread: pop on empty")

    r.run_thread("T", body)
    cur(r, tag="main thread unchanged")
    pop(r)
    release(r)


@scenario
def s_thread_own_stacks(r):
    init(r)
    pc = retain(r)
    c = create(r)
    pop(r)
    push(r, pc.val)
    a_ready, b_done, a_go = threading.Event(), threading.Event(), threading.Event()

    def thread_a(t):
        push(t, c.val)
        push(t, pc.val)
        a_ready.set()
        a_go.wait(30)
        cur(t, tag="A: own top survives B's work")
        pop(t)
        cur(t, tag="A: own second entry")
        pop(t)
        cur(t)

    def thread_b(t):
        a_ready.wait(30)
        cur(t, tag="B: sees nothing of A's or main's stack")
        push(t, c.val)
        r2 = t.call("cuCtxSetCurrent", pc.val, tag="B: replaces only its own top")
        cur(t)
        if r2.ok:
            pop(t)
        cur(t)
        b_done.set()

    sa, sb = r.start_thread("A", thread_a), r.start_thread("B", thread_b)
    b_done.wait(30)
    cur(r, tag="main: own stack untouched")
    a_go.set()
    r.join(sa, sb)
    pop(r)
    r.call("cuCtxDestroy", c.val)
    release(r)


@scenario
def s_thread_primary_cross_thread(r):
    # A retain is process-wide: retained on main, usable and releasable on another thread.
    init(r)
    pc = retain(r)

    def body(t):
        push(t, pc.val)
        probe_current(t, tag="T: primary retained by main")
        pop(t)
        release(t, tag="T releases main's retain")
        state(t, tag="T: inactive now")

    r.run_thread("T", body)
    state(r, tag="main sees it inactive")
    release(r, tag="unbalanced now")


@scenario
def s_thread_exit_with_context_current(r):
    # A thread that exits with a context pushed: the retain is not dropped with it.
    init(r)
    pc = retain(r)

    def body(t):
        push(t, pc.val)
        push(t, pc.val)
        cur(t)

    r.run_thread("T", body)
    state(r, tag="still active after T exited")
    cur(r)
    release(r)
    state(r)


@scenario
def s_threads_concurrent_push_pop(r):
    # 8 threads hammer push/pop of two contexts; every thread must end balanced.
    init(r)
    pc = retain(r)
    c = create(r)
    pop(r)
    handles = (pc.val, c.val)
    d = r.d
    iters = 500
    results = [None] * 8
    start = threading.Barrier(8)

    def worker(k):
        bad_rc = bad_ctx = 0
        start.wait(30)
        for i in range(iters):
            h = handles[(i + k) % 2]
            e1 = d.cuCtxPushCurrent(h)[0]
            e2, got = d.cuCtxGetCurrent()
            e3, popped = d.cuCtxPopCurrent()
            bad_rc += int(e1) != 0 or int(e2) != 0 or int(e3) != 0
            bad_ctx += int(got) != int(h) or int(popped) != int(h)
        e4, left = d.cuCtxGetCurrent()
        results[k] = {
            "bad_rc": bad_rc,
            "bad_ctx": bad_ctx,
            "end_empty": int(e4) == 0 and int(left) == 0,
        }

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    r.note("per-thread results", results)
    cur(r, tag="main untouched")
    state(r, tag="primary still active")
    r.call("cuCtxDestroy", c.val)
    release(r)
    state(r)


# --- Two devices (skipped inside the scenario below 2) ----------------------------------------


@scenario
def s_two_devices_primary(r):
    init(r)
    need_devices(r, 2)
    p0 = retain(r, 0)
    p1 = retain(r, 1)
    r.note("distinct handles", p0.ok and p1.ok and not same(p0, p1))
    state(r, 0)
    state(r, 1)
    push(r, p1.val)
    r.call("cuCtxGetDevice", tag="device 1 current")
    r.call("cuCtxSetCurrent", p0.val, tag="switch to device 0")
    r.call("cuCtxGetDevice")
    push(r, p1.val)
    r.call("cuCtxGetDevice")
    pop(r)
    r.call("cuCtxGetDevice", tag="back on device 0")
    pop(r)
    cur(r)
    release(r, 1)
    state(r, 1, tag="device 1 inactive")
    state(r, 0, tag="device 0 unaffected")
    release(r, 0)
    state(r, 0)


@scenario
def s_two_devices_refcounts_and_reset(r):
    init(r)
    need_devices(r, 2)
    p0 = retain(r, 0)
    retain(r, 0)
    p1 = retain(r, 1)
    ctx_id(r, p0.val, tag="dev0 id")
    ctx_id(r, p1.val, tag="dev1 id")
    release(r, 1)
    state(r, 1, tag="dev1 released to zero")
    state(r, 0, tag="dev0 still held twice")
    p1b = retain(r, 1)
    ctx_id(r, p1b.val, tag="dev1 new id")
    r.call("cuDevicePrimaryCtxReset", 1, tag="reset dev1 only")
    state(r, 1)
    state(r, 0, tag="dev0 unaffected")
    ctx_id(r, p0.val, tag="dev0 id unchanged")
    ctx_id(r, p1.val, tag="dev1 stale")
    release(r, 1)
    release(r, 0)
    release(r, 0)
    state(r, 0)
    state(r, 1)


@scenario
def s_two_devices_created(r):
    init(r)
    need_devices(r, 2)
    p0 = retain(r, 0)
    c1 = create(r, dev=1)
    r.call("cuCtxGetDevice", tag="created on device 1")
    push(r, p0.val)
    r.call("cuCtxGetDevice")
    pop(r)
    r.call("cuCtxGetDevice")
    state(r, 1, tag="device 1 primary untouched by cuCtxCreate")
    r.call("cuCtxDestroy", c1.val)
    cur(r)
    release(r, 0)


# --- fork -------------------------------------------------------------------------------------


def _child_calls(t, pc=None):
    t.call("cuInit", 0)
    t.call("cuDriverGetVersion", out="info")
    t.call("cuDeviceGetCount")
    t.call("cuDeviceGet", 0)
    cur(t)
    retain(t)
    state(t)
    release(t)
    if pc is not None:
        push(t, pc)
        t.call("cuCtxSetCurrent", pc)
        t.call("cuCtxGetApiVersion", pc)
    pop(t)
    t.call("cuCtxGetDevice")
    create(t)
    t.call("cuGetErrorName", t.d.CUresult.CUDA_ERROR_NOT_INITIALIZED)


@scenario
def s_fork_after_init_with_context(r):
    # lab (probe2): "child: getcurrent r3 cur=(nil); cuInit r3; retain r3".
    init(r)
    pc = retain(r)
    push(r, pc.val)
    r.fork(lambda t: _child_calls(t, pc.val))
    cur(r, tag="parent unaffected")
    r.call("cuCtxGetApiVersion", pc.val)
    pop(r)
    release(r)


@scenario
def s_fork_after_init_only(r):
    init(r)
    r.fork(lambda t: _child_calls(t))
    count(r)
    cur(r, tag="parent unaffected")


@scenario
def s_fork_without_init(r):
    # The parent never called cuInit: the child may use CUDA normally, and so may the parent
    # afterwards.
    def child(t):
        t.call("cuInit", 0)
        count(t)
        pc = retain(t)
        push(t, pc.val)
        probe_current(t, tag="child")
        pop(t)
        release(t)
        state(t)

    r.fork(child)
    init(r)
    count(r)
    retain(r)
    state(r)
    release(r)


# --- Epilogue: the state every scenario leaves behind (compared too; tidy scenarios agree) ----


def epilogue(r):
    """Main thread's current context and each device's primary state after the scenario."""
    cur(r, tag="epilogue")
    n = r.call("cuDeviceGetCount", tag="epilogue")
    if n.ok:
        for k in range(min(int(n.val), 2)):
            state(r, k, tag="epilogue")


def run_scenario(name: str, driver) -> dict:
    """Run one scenario in this process; return {"events", "error", "skipped"}."""
    r = Recorder(driver)
    out = {"events": r.events, "error": None, "skipped": None}
    try:
        SCENARIOS[name](r)
    except Skip as e:
        out["skipped"] = str(e)
        return out
    except Exception:
        out["error"] = traceback.format_exc()
    try:
        epilogue(r)
    except Exception:
        out["error"] = (out["error"] or "") + "epilogue:\n" + traceback.format_exc()
    return out
