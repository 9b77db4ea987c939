"""Every way of wrapping one shared guard, in every way code interleaves on one thread (asyncio,
trio, greenlets, generators; and threads). Strand A enters the shared guard of device 0 and
suspends; B enters a guard of device 1, then the shared guard, and suspends; A leaves first.
A's exit takes its own entry ("out of order") or is refused ("cannot tell"), never B's; B's block
keeps device 0 and then restores device 1, then nothing. EXPECTED is each cell's outcome.
"""

import asyncio
import contextlib
import functools
import threading

import pytest
from helpers.drivers import second_device
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, GuardError
from cyctx._guard import PLAIN_PROTOCOL, open_entries

D1 = second_device()


# --- wrappers --------------------------------------------------------------------------------


def _open(cm):
    cm.__enter__()


class HelperMethod:
    """Enters through a helper method (the wrapper that lost its block before)."""

    def __init__(self, g):
        self.g = g

    def __enter__(self):
        self._open()
        return self

    def _open(self):
        self.g.__enter__()

    def __exit__(self, *a):
        return self.g.__exit__(*a)


class HelperFunction(HelperMethod):
    def __enter__(self):
        _open(self.g)
        return self


class Partial(HelperMethod):
    def __enter__(self):
        functools.partial(type(self.g).__enter__, self.g)()
        return self


class Lambda(HelperMethod):
    def __enter__(self):
        (lambda: self.g.__enter__())()
        return self


# A wrapper class whose methods are another class's functions, assigned.
Assigned = type(
    "Assigned",
    (),
    {
        "__init__": HelperMethod.__init__,
        "__enter__": HelperMethod.__enter__,
        "_open": HelperMethod._open,
        "__exit__": HelperMethod.__exit__,
    },
)


@contextlib.contextmanager
def around(g):
    with g:
        yield


@contextlib.contextmanager
def around_by_hand(g):
    g.__enter__()
    try:
        yield
    finally:
        g.__exit__(None, None, None)


class Stack:
    """An ExitStack holding the guard."""

    def __init__(self, g):
        self.g = g

    def __enter__(self):
        self.st = contextlib.ExitStack()
        self.st.enter_context(self.g)
        return self

    def __exit__(self, *a):
        return self.st.__exit__(*a)


def three_deep(g):
    return HelperMethod(HelperFunction(Lambda(g)))


class NvtxGuard(ContextGuard):
    """A subclass that wraps __enter__ (for an NVTX range, say) and calls super() via a helper."""

    def __enter__(self):
        return self._push()

    def _push(self):
        return super().__enter__()

    def __exit__(self, *a):
        return self._pop(*a)

    def _pop(self, *a):
        return super().__exit__(*a)


class AsyncHelper:
    """An async wrapper of the sync guard: `async def __aenter__` through a helper."""

    def __init__(self, g):
        self.g = g

    async def __aenter__(self):
        self._open()
        return self

    def _open(self):
        self.g.__enter__()

    async def __aexit__(self, *a):
        return self.g.__exit__(*a)


class AsyncStackSync:
    """An AsyncExitStack holding the guard with enter_context."""

    def __init__(self, g):
        self.g = g

    async def __aenter__(self):
        self.st = contextlib.AsyncExitStack()
        await self.st.__aenter__()
        self.st.enter_context(self.g)
        return self

    async def __aexit__(self, *a):
        return await self.st.__aexit__(*a)


class AsyncStackAsync(AsyncStackSync):
    """An AsyncExitStack holding an async wrapper of the guard (enter_async_context)."""

    async def __aenter__(self):
        self.st = contextlib.AsyncExitStack()
        await self.st.__aenter__()
        await self.st.enter_async_context(AsyncHelper(self.g))
        return self


@contextlib.asynccontextmanager
async def around_async(g):
    with g:
        yield


SYNC = {
    "direct": lambda g: g,
    "helper method": HelperMethod,
    "helper function": HelperFunction,
    "functools.partial": Partial,
    "lambda": Lambda,
    "assigned methods": Assigned,
    "@contextmanager": around,
    "@contextmanager by hand": around_by_hand,
    "ExitStack": Stack,
    "three deep": three_deep,
    "subclass via super() helper": None,  # the guard itself is an NvtxGuard
}
ASYNC = {
    "async helper": AsyncHelper,
    "AsyncExitStack enter_context": AsyncStackSync,
    "AsyncExitStack enter_async_context": AsyncStackAsync,
    "@asynccontextmanager": around_async,
}

# The expected outcome of A's exit in each interleaving: "own" (its own entry, removed from under
# B's open block: GuardError "out of order") for every wrapper. The plain build (public CPython
# API only) tells no strand from another: only the blocks `with` itself opens, which carry their
# tag, are told apart there; every other cell is "refused" (GuardError "cannot tell"), and B's
# exit is refused too.
OWN, REFUSED = "own", "refused"
TAGGED = {"direct", "@contextmanager", "@asynccontextmanager"}  # `with g:` opens the block
STRANDS = REFUSED if PLAIN_PROTOCOL else OWN  # a block told by its strand
EXPECTED = {
    (i, w): OWN if w in TAGGED else STRANDS
    for i in ("asyncio", "trio", "greenlet", "generator")
    for w in SYNC
}
EXPECTED.update(
    {(i, w): OWN if w in TAGGED else STRANDS for i in ("asyncio", "trio") for w in ASYNC}
)


@pytest.fixture
def shared():
    # One guard object that both strands use (what `cyctx.device(0)` gives every caller; a
    # guard of the test's own, so that no retain outlives the test).
    g = ContextGuard(0)
    yield g
    g.close()


@pytest.fixture
def shared_and_other(shared):
    g = shared
    h = ContextGuard(D1)
    nvtx = NvtxGuard(0)
    yield g, h, nvtx
    h.close()
    nvtx.close()


def _guard_for(wrapper, g, nvtx):
    return (
        (nvtx, nvtx)
        if wrapper == "subclass via super() helper"
        else (g, SYNC.get(wrapper) or ASYNC[wrapper])
    )


class Record:
    def __init__(self):
        self.a_error = None
        self.b_inside = self.b_after_g = self.b_after_h = "unset"


def _run(expected, cell):
    """Run one cell on a thread of its own: a refused block's entries stay on that thread until
    it ends. Returns what B's refused exit raised (None where nothing is refused) and how many
    entries the thread had left."""

    def body():
        try:
            cell()
        except (GuardError, BaseExceptionGroup) as e:
            if expected != REFUSED:
                raise
            return e, open_entries()
        return None, open_entries()

    return in_thread(body)


def _cannot_tell(e):
    if isinstance(e, BaseExceptionGroup):
        return all(_cannot_tell(x) for x in e.exceptions)
    return isinstance(e, GuardError) and "cannot tell" in str(e)


def _check(rec, expected, h, ran):
    b_error, entries_left = ran
    if expected == OWN:
        assert isinstance(rec.a_error, GuardError), rec.a_error
        # B's block of the same guard is the innermost: named as such.
        msg = str(rec.a_error)
        assert all(w in msg for w in ("out of order", "same guard", "removed")), msg
    else:
        assert _cannot_tell(rec.a_error), rec.a_error
        # Nothing was changed: B's block still has its device, and B's own exit cannot be told
        # from A's either.
        assert rec.b_inside == 0, "B's block of device 0 runs on another device"
        assert _cannot_tell(b_error), b_error
        return
    assert b_error is None
    assert rec.b_inside == 0, "B's block of device 0 runs on another device"
    assert rec.b_after_g == D1 and rec.b_after_h is None
    assert entries_left == 0


def _strand_b(h, cm, rec):
    """Strand B as a generator: a guard of device 1, then `cm` (the shared guard through a
    wrapper), suspended inside both; records what is current inside and after each."""
    with h:
        with cm:
            yield
            rec.b_inside = cyctx.current_device()
        rec.b_after_g = cyctx.current_device()
    rec.b_after_h = cyctx.current_device()
    yield


# --- interleavings ---------------------------------------------------------------------------


def _sync_cm(wrapper, g, nvtx):
    target, make = _guard_for(wrapper, g, nvtx)
    return make(target) if make is not nvtx else target


async def _hold(wrapper, cm, entered, go, inside=lambda: None):
    # Enter `cm` (with `async with` for an async wrapper), say so, wait for `go`, then record.
    if wrapper in ASYNC:
        async with cm:
            entered.set()
            await go.wait()
            inside()
    else:
        with cm:
            entered.set()
            await go.wait()
            inside()


def _task_bodies(wrapper, g, h, nvtx, rec, events):
    """Strand A's and strand B's coroutines (A enters the shared guard; B a guard of device 1,
    then the shared guard), for any task framework whose events have set() and wait()."""
    a_in, a_go, b_in, b_go = events

    async def a():
        try:
            await _hold(wrapper, _sync_cm(wrapper, g, nvtx), a_in, a_go)
        except GuardError as e:
            rec.a_error = e

    async def b():
        with h:
            await _hold(
                wrapper,
                _sync_cm(wrapper, g, nvtx),
                b_in,
                b_go,
                lambda: setattr(rec, "b_inside", cyctx.current_device()),
            )
            rec.b_after_g = cyctx.current_device()
        rec.b_after_h = cyctx.current_device()

    return a, b


@pytest.mark.parametrize("wrapper", list(SYNC) + list(ASYNC))
def test_two_asyncio_tasks(shared_and_other, wrapper):
    g, h, nvtx = shared_and_other
    rec = Record()

    async def main():
        events = a_in, a_go, b_in, b_go = [asyncio.Event() for _ in range(4)]
        a, b = _task_bodies(wrapper, g, h, nvtx, rec, events)
        ta = asyncio.create_task(a())
        await a_in.wait()
        tb = asyncio.create_task(b())
        await b_in.wait()
        a_go.set()
        await ta
        b_go.set()
        await tb

    expected = EXPECTED[("asyncio", wrapper)]
    _check(rec, expected, h, _run(expected, lambda: asyncio.run(main())))


@pytest.mark.parametrize("wrapper", list(SYNC) + list(ASYNC))
def test_two_trio_tasks(shared_and_other, wrapper):
    trio = pytest.importorskip("trio")
    g, h, nvtx = shared_and_other
    rec = Record()

    async def main():
        events = a_in, a_go, b_in, b_go = [trio.Event() for _ in range(4)]
        a, b = _task_bodies(wrapper, g, h, nvtx, rec, events)
        a_done = trio.Event()

        async def a_then_done():
            await a()
            a_done.set()

        async with trio.open_nursery() as n:
            n.start_soon(a_then_done)
            await a_in.wait()
            n.start_soon(b)
            await b_in.wait()
            a_go.set()
            await a_done.wait()
            b_go.set()

    expected = EXPECTED[("trio", wrapper)]
    _check(rec, expected, h, _run(expected, lambda: trio.run(main)))


@pytest.mark.parametrize("wrapper", list(SYNC))
def test_two_greenlets(shared_and_other, wrapper):
    greenlet = pytest.importorskip("greenlet")
    g, h, nvtx = shared_and_other
    rec = Record()
    main = None

    def a_body():
        try:
            with _sync_cm(wrapper, g, nvtx):
                main.switch()
        except GuardError as e:
            rec.a_error = e

    def b_body():
        with h:
            with _sync_cm(wrapper, g, nvtx):
                main.switch()
                rec.b_inside = cyctx.current_device()
            rec.b_after_g = cyctx.current_device()
        rec.b_after_h = cyctx.current_device()

    def cell():
        nonlocal main
        main = greenlet.getcurrent()
        a, b = greenlet.greenlet(a_body), greenlet.greenlet(b_body)
        a.switch()
        b.switch()
        a.switch()
        b.switch()
        assert a.dead and b.dead

    expected = EXPECTED[("greenlet", wrapper)]
    _check(rec, expected, h, _run(expected, cell))


@pytest.mark.parametrize("wrapper", list(SYNC))
def test_two_generators(shared_and_other, wrapper):
    g, h, nvtx = shared_and_other
    rec = Record()

    def a_gen():
        try:
            with _sync_cm(wrapper, g, nvtx):
                yield
        except GuardError as e:
            rec.a_error = e
        yield

    def cell():
        a, b = a_gen(), _strand_b(h, _sync_cm(wrapper, g, nvtx), rec)
        next(a)
        next(b)
        next(a)  # A leaves first
        next(b)

    expected = EXPECTED[("generator", wrapper)]
    _check(rec, expected, h, _run(expected, cell))


@pytest.mark.parametrize("wrapper", list(SYNC))
def test_two_threads_each_leave_in_order(shared_and_other, wrapper):
    # Entries are per thread: each thread's exit is in order on its own thread, never an error.
    g, h, nvtx = shared_and_other
    a_in, a_go, b_in = threading.Event(), threading.Event(), threading.Event()
    out = {}

    def a():
        with _sync_cm(wrapper, g, nvtx):
            a_in.set()
            a_go.wait(10)
            out["a inside"] = cyctx.current_device()
        out["a after"] = cyctx.current_device()

    def b():
        a_in.wait(10)
        with h:
            with _sync_cm(wrapper, g, nvtx):
                b_in.set()
                out["b inside"] = cyctx.current_device()
            out["b after g"] = cyctx.current_device()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start()
    tb.start()
    b_in.wait(10)
    a_go.set()
    ta.join(10)
    tb.join(10)
    assert out == {"a inside": 0, "a after": None, "b inside": 0, "b after g": D1}


def test_two_blocks_that_cannot_be_told_apart_are_refused_and_keep_their_contexts(shared):
    # Two async-wrapped blocks in one task whose enters ran in coroutines that returned, the
    # second inside an async generator suspended with its block open: the exit of either through
    # its wrapper could be the other's. Refused loudly, and nothing changes. (On a thread of its
    # own: the refused blocks' entries stay there until it ends.)
    g = shared

    async def main():
        outer = AsyncHelper(g)
        await outer.__aenter__()

        async def agen():
            async with AsyncHelper(g):
                yield

        it = agen()
        await it.__anext__()  # its block is open, the generator suspended
        with pytest.raises(GuardError, match="cannot tell which of its 2 open blocks") as e:
            await outer.__aexit__(None, None, None)
        if not PLAIN_PROTOCOL:  # the plain build does not see which generators run
            assert "inside a generator or coroutine that is not running now" in str(e.value)
        assert open_entries() == 2 and cyctx.current_device() == 0
        with pytest.raises(GuardError, match="cannot tell"):
            await it.__anext__()
        assert open_entries() == 2 and cyctx.current_device() == 0
        return "refused"

    assert in_thread(lambda: asyncio.run(main())) == "refused"


@pytest.mark.parametrize("wrapper", ["helper method", "ExitStack", "three deep"])
def test_two_tasks_sharing_one_context_object_are_told_apart_by_their_coroutine(
    shared_and_other, wrapper
):
    # create_task(context=...) may give two tasks the same Context: their outermost coroutines
    # still differ.
    g, h, nvtx = shared_and_other
    rec = Record()

    async def main():
        ctx = __import__("contextvars").copy_context()
        a_in, a_go, b_in, b_go = (asyncio.Event() for _ in range(4))

        async def a():
            try:
                with _sync_cm(wrapper, g, nvtx):
                    a_in.set()
                    await a_go.wait()
            except GuardError as e:
                rec.a_error = e

        async def b():
            with h:
                with _sync_cm(wrapper, g, nvtx):
                    b_in.set()
                    await b_go.wait()
                    rec.b_inside = cyctx.current_device()
                rec.b_after_g = cyctx.current_device()
            rec.b_after_h = cyctx.current_device()

        ta = asyncio.create_task(a(), context=ctx)
        await a_in.wait()
        tb = asyncio.create_task(b(), context=ctx)
        await b_in.wait()
        a_go.set()
        await ta
        b_go.set()
        await tb

    _check(rec, STRANDS, h, _run(STRANDS, lambda: asyncio.run(main())))


@pytest.mark.parametrize("wrapper", ["helper method", "ExitStack", "lambda"])
def test_a_generator_driven_by_a_task_is_told_apart_from_the_task(shared_and_other, wrapper):
    # Same Context, same outermost coroutine (the task's): the running generator differs.
    g, h, nvtx = shared_and_other
    rec = Record()

    async def main():
        it = _strand_b(h, _sync_cm(wrapper, g, nvtx), rec)
        try:
            with _sync_cm(wrapper, g, nvtx):
                next(it)  # the generator's block opens inside the task's, and stays open
        except GuardError as e:
            rec.a_error = e
        next(it)

    _check(rec, STRANDS, h, _run(STRANDS, lambda: asyncio.run(main())))


@pytest.mark.skipif(
    PLAIN_PROTOCOL,
    reason="the plain build tells these exits by no strand: the family's cells cover it",
)
def test_an_exit_binding_made_in_one_strand_tags_no_enter_of_another(shared_and_other):
    # A generator binds the guard's __exit__ and suspends before entering; the caller then
    # enters through a wrapper. The binding announced an enter in the generator's strand only:
    # the caller's entry must not carry its tag, or the generator's exit through that binding
    # would take the caller's entry.
    g, h, _ = shared_and_other
    seen = {}

    def gen():
        ex = g.__exit__
        yield
        g.__enter__()
        yield
        ex(None, None, None)
        seen["generator after"] = cyctx.current_device()
        yield

    it = gen()
    with h:
        next(it)  # the binding is made (after h's own); the generator suspends
        with HelperMethod(g):  # binds the wrapper's __exit__, not the guard's
            next(it)  # the generator enters (its entry above the caller's)
            next(it)  # and leaves through the binding it made: its own entry, in order
            seen["caller inside"] = cyctx.current_device()
            seen["entries"] = open_entries()
        seen["caller after"] = cyctx.current_device()
    assert seen == {"generator after": 0, "caller inside": 0, "entries": 2, "caller after": D1}
    assert open_entries() == 0


@pytest.mark.skipif(
    PLAIN_PROTOCOL,
    reason="the plain build tells these exits by no strand: the family's cells cover it",
)
def test_an_announced_binding_tags_only_the_enter_that_takes_it(shared_and_other):
    # A generator binds the guard's __exit__, enters through a helper (that enter takes the
    # announcement) and suspends; the caller enters through a wrapper (no announcement left);
    # the generator's exit through its binding then finds its own entry, under the caller's
    # block: out of order, and the caller's block keeps its context.
    g, h, _ = shared_and_other
    seen = {}

    def gen():
        ex = g.__exit__
        _open(g)
        yield
        try:
            ex(None, None, None)
        except GuardError as e:
            seen["generator"] = str(e)
        yield

    it = gen()
    with h:
        next(it)
        with HelperMethod(g):
            next(it)
            seen["caller inside"] = cyctx.current_device()
        seen["caller after"] = cyctx.current_device()
    assert "out of order" in seen["generator"] and "removed" in seen["generator"], seen
    assert seen["caller inside"] == 0 and seen["caller after"] == D1
    assert open_entries() == 0
