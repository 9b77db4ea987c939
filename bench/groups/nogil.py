"""cyctx from Cython: the guard's nogil enter()/exit(), the raw switch layer with and without
the guard's per-enter reset check, and the per-thread entry stack of src/cyctx/_cpp/thread_entries.h alone,
so that the guard's cost can be taken apart (report.py's breakdown)."""

from functools import partial

from . import PATHS, registrar

case = registrar("nogil", layer="cython")


@case(
    "cython.tls",
    "thread-local entry push+pop (cyctx's _cpp/thread_entries.h, in an extension module)",
)
def tls(env, path):
    return env.bench.tls_loop


@case("cython.guard", "guard.enter()/exit() (nogil)", paths=PATHS)
def guard(env, path):
    return partial(env.bench.guard_loop, env.g0)


@case(
    "cython.switch",
    "switch_to()/switch_back() (no bookkeeping; the id read for its way back)",
    paths=PATHS,
)
def switch(env, path):
    return partial(env.bench.switch_loop, env.h0)


@case("cython.switch_id", "cuCtxGetId + switch_to()/switch_back()", paths=PATHS)
def switch_id(env, path):
    return partial(env.bench.switch_id_loop, env.h0)
