"""Enter and exit: what becomes current inside a block, what the thread gets back after it, what a
block that changed the context stack itself gets back, misuse, and an exit that fails."""

import contextlib

import pytest
from helpers.drivers import current, driver, ok, set_current
from helpers.threads import in_thread

from cyctx import ContextGuard, GuardError
from cyctx._guard import open_entries


def test_restores_null_on_a_fresh_thread(guard):
    def body():
        assert current() == 0
        with guard as g:
            assert g is guard
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_restores_null_when_block_raises(guard):
    def body():
        with pytest.raises(KeyError):
            with guard:
                raise KeyError("boom")
        return current()

    assert in_thread(body) == 0


def test_restores_previous_context_across_devices(guard, guard1):
    def body():
        with guard:
            with guard1:
                assert current() == guard1.handle
                with guard:
                    assert current() == guard.handle
                assert current() == guard1.handle
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_nesting_same_guard(guard):
    def body():
        with guard:
            with guard:
                with guard:
                    assert current() == guard.handle
            assert current() == guard.handle
        return current()

    assert in_thread(body) == 0


def test_fast_path_makes_no_switch(guard, sim):
    def body():
        with guard:
            n = (
                sim.call_count("cuCtxSetCurrent")
                + sim.call_count("cuCtxPushCurrent")
                + sim.call_count("cuCtxPopCurrent")
            )
            for _ in range(100):
                with guard:
                    pass
            m = (
                sim.call_count("cuCtxSetCurrent")
                + sim.call_count("cuCtxPushCurrent")
                + sim.call_count("cuCtxPopCurrent")
            )
            return m - n

    assert in_thread(body) == 0


def test_switching_keeps_stack_depth(guard, guard1, sim):
    def body():
        depth0 = sim.stack_depth()
        with guard:
            assert sim.stack_depth() == 1
            with guard1:
                assert sim.stack_depth() == 1, "a switch replaces the top, it does not push"
        return depth0, sim.stack_depth()

    assert in_thread(body) == (0, 0)


def test_deep_nesting_beyond_the_inline_entries(guard, guard1):
    # The per-thread entry stack keeps kInline entries inline (_cpp/thread_entries.h) and spills to the heap beyond.
    def body():
        def nest(k):
            g = (guard, guard1)[k % 2]
            with g:
                assert current() == g.handle
                if k:
                    nest(k - 1)
                assert current() == g.handle

        for _ in range(3):  # grow, shrink, grow again
            nest(150)
        return current()

    assert in_thread(body) == 0


@pytest.mark.strands
def test_blocks_left_from_other_frames_still_match_their_guard():
    # contextlib.ExitStack enters from enter_context and exits from __exit__: contextlib's frames
    # are skipped, so both blocks are the frame running `with ExitStack()`, left innermost first.
    def body():
        g = ContextGuard(0)
        with contextlib.ExitStack() as stack:
            stack.enter_context(g)
            stack.enter_context(g)
            assert open_entries() == 2 and current() == g.handle
        assert open_entries() == 0 and current() == 0
        g.close()

    in_thread(body)


# --- a block that changes the context stack ---------------------------------------------------


# What a block does behind the guard's back (what cudaSetDevice does, a pop of what it did not
# push), with or without an outer block of the guard: (outer, inner guard, act).
BLOCK_ACTS = {
    "set the outer context in another's block": (True, 1, lambda g, g1: set_current(g.context)),
    "set another context on the fast path": (True, 0, lambda g, g1: set_current(g1.context)),
    "pop on the fast path": (True, 0, lambda g, g1: ok(driver().cuCtxPopCurrent())),
    "set another context from an empty stack": (False, 0, lambda g, g1: set_current(g1.context)),
    "pop from an empty stack": (False, 0, lambda g, g1: ok(driver().cuCtxPopCurrent())),
    "set null from an empty stack": (False, 0, lambda g, g1: set_current(None)),
}


@pytest.mark.parametrize("outer, inner, act", BLOCK_ACTS.values(), ids=BLOCK_ACTS)
def test_a_block_that_changed_the_stack_is_repaired(guard, guard1, outer, inner, act):
    # From an empty stack the guard pushes and its exit pops one entry: when the block emptied
    # the stack already, the exit sees it is empty (as before the block) and raises nothing.
    def body():
        with guard if outer else contextlib.nullcontext():
            with (guard, guard1)[inner]:
                act(guard, guard1)
            after = current()
        return after, current()

    assert in_thread(body) == (guard.handle if outer else 0, 0)


def test_leaked_push_from_empty_stack_is_unwound_and_reported(guard, guard1):
    d = driver()

    def body():
        with pytest.raises(GuardError, match="pushed 1 context"):
            with guard:
                ok(d.cuCtxPushCurrent(guard1.context))
        return current()

    assert in_thread(body) == 0


def test_leaked_push_over_a_context_restores_current(guard, guard1):
    # Documented limitation: with a context below, the driver gives no stack depth, so a
    # push leaked by the block stays beneath; the current context is still restored.
    d = driver()

    def body():
        ok(d.cuCtxPushCurrent(guard.context))
        with guard1:
            ok(d.cuCtxPushCurrent(guard.context))
        restored = current()
        ok(d.cuCtxPopCurrent())
        ok(d.cuCtxPopCurrent())
        return restored, current()

    assert in_thread(body) == (guard.handle, 0)


@pytest.mark.parametrize("extra", [0, 5], ids=["at the cap", "past the cap"])
def test_unwind_cap(sim, extra):
    # Up to the cap, every leaked push is popped and the error says so; past it, the error says
    # what is still left.
    def body():
        g = ContextGuard(0)
        d = driver()
        with pytest.raises(GuardError) as ei:
            with g:
                for _ in range(4096 + extra):
                    ok(d.cuCtxPushCurrent(g.context))
        state = (str(ei.value), sim.stack_depth())
        while current():
            ok(d.cuCtxPopCurrent())
        g.close()
        return state

    msg, left = in_thread(body)
    if extra:
        assert left > 0 and "4096" in msg and "still" in msg, msg
        assert "were popped to restore" not in msg, msg
    else:
        assert left == 0 and "pushed 4096 context(s)" in msg, msg
        assert "were popped to restore" in msg, msg


# --- misuse -----------------------------------------------------------------------------------


def test_exit_without_enter(guard):
    with pytest.raises(GuardError, match="without a matching enter"):
        guard.__exit__(None, None, None)


def test_exit_on_another_thread(guard):
    def body():
        guard.__enter__()
        try:
            with pytest.raises(GuardError, match="without a matching enter on this thread"):
                in_thread(guard.__exit__, None, None, None)
            assert current() == guard.handle, "the failed exit must change nothing"
        finally:
            guard.__exit__(None, None, None)
        return current()

    assert in_thread(body) == 0


# --- an exit that fails: the block's exception wins -------------------------------------------
# (Each driver call of an exit failing, on every way a block is left: test_exit_faults.py.)


class _NotesNotAList(KeyError):
    """Its __notes__ is set to something that is not a list: add_note refuses (TypeError)."""


class _AddNoteRaises(KeyError):
    def add_note(self, note):
        raise RuntimeError("add_note of the user's exception")


def _notes_not_a_list(value):
    exc = _NotesNotAList("from the block")
    exc.__notes__ = value
    return exc


class _GuardWithRaisingRepr(ContextGuard):
    def __repr__(self):
        raise RuntimeError("repr of the guard subclass")


@pytest.mark.parametrize(
    "make_exc",
    [
        lambda: _notes_not_a_list("a str"),
        lambda: _notes_not_a_list(("a", "tuple")),
        lambda: _AddNoteRaises("from the block"),
    ],
    ids=["notes str", "notes tuple", "add_note raises"],
)
def test_block_exception_wins_when_the_cleanup_note_cannot_be_attached(make_exc, capfd):
    # The exit fails on any driver: the block pushed a context from an empty stack (a new
    # thread) and left it, which the exit pops and reports (GuardError). Attaching that as a
    # note fails; the block's own exception must still be what propagates, and the note,
    # best effort, goes to stderr instead.
    g = ContextGuard(0)
    exc = make_exc()
    notes_before = exc.__dict__.get("__notes__")

    def body():
        with pytest.raises(KeyError) as ei:
            with g:
                ok(driver().cuCtxPushCurrent(g.context))
                raise exc
        assert ei.value is exc
        return current()

    try:
        assert in_thread(body) == 0
    finally:
        g.close()
    assert exc.__dict__.get("__notes__") == notes_before  # the user's own value, untouched
    err = capfd.readouterr().err
    assert "pushed 1 context" in err and "propagated" in err, err


def test_cleanup_note_survives_a_guard_whose_repr_raises():
    # A note that can be attached is attached, even when the guard's repr cannot be made
    # (a subclass may override __repr__); the block's exception still propagates.
    g = _GuardWithRaisingRepr(0)

    def body():
        with pytest.raises(KeyError) as ei:
            with g:
                ok(driver().cuCtxPushCurrent(g.context))
                raise KeyError("from the block")
        return getattr(ei.value, "__notes__", [])

    try:
        notes = in_thread(body)
    finally:
        g.close()
    assert any("pushed 1 context" in n for n in notes), notes
