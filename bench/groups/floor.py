"""The driver floor: what making a context current costs at the driver itself.

Compiled nogil loops (bench/_bench.pyx) calling the driver through pointers from
cuGetProcAddress, as C calls it. They do not check return codes (cyctx does, and that is part
of its cost); the core process calls bench.checked() first, which makes each call once, checked.
"""

from functools import partial

from . import SWITCHING, registrar

case = registrar("floor", layer="driver")


@case("driver.pushpop", "push+pop (cuCtxPushCurrent/cuCtxPopCurrent)", paths=SWITCHING)
def pushpop(env, path):
    return partial(env.bench.pushpop, env.h0)


@case(
    "driver.pushpop_cydriver",
    "push+pop through cuda.bindings' cydriver",
    paths=SWITCHING,
    note="what a Cython caller of cydriver pays",
)
def pushpop_cydriver(env, path):
    return partial(env.bench.pushpop_cydriver, env.h0)


@case(
    "driver.setset",
    "cuCtxSetCurrent(target)+cuCtxSetCurrent(previous)",
    paths=SWITCHING,
    note="the switch a guard makes, at the driver",
)
def setset(env, path):
    return partial(env.bench.setset, env.h0, env.starts[path])


@case(
    "driver.full",
    "retain+push+pop+release",
    paths=("from_none",),
    note="the primary context is held by a guard meanwhile, as in the lab",
)
def full(env, path):
    return partial(env.bench.full, 0)


@case("driver.getcurrent", "cuCtxGetCurrent")
def getcurrent(env, path):
    return env.bench.getcurrent


@case("driver.getid", "cuCtxGetId (the guard's per-enter reset check)")
def getid(env, path):
    return partial(env.bench.getid, env.h0)
