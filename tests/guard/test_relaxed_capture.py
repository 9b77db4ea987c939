"""cyctx.relaxed_capture(): the thread's capture mode is relaxed inside and the mode it found comes
back when its last block ends, in any order; other threads keep their own; a driver error
changes nothing. What the mode does to a capture: test_capture.py (gpu)."""

import asyncio

import pytest
from helpers.drivers import driver
from helpers.threads import in_thread

import cyctx
from cyctx._capture import open_blocks

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2


def exchange(mode):
    d = driver()
    err, prev = d.cuThreadExchangeStreamCaptureMode(d.CUstreamCaptureMode(mode))
    assert err == d.CUresult.CUDA_SUCCESS, err
    return int(prev)


def mode_now():
    """This thread's capture mode, read by exchanging it and putting it back."""
    m = exchange(GLOBAL)
    exchange(m)
    return m


@pytest.fixture(autouse=True)
def _mode_restored():
    before = mode_now()
    yield
    after = mode_now()
    exchange(before)
    assert (after, open_blocks()) == (before, 0), "the test left this thread's mode changed"


def test_relaxed_inside_and_the_mode_found_after():
    for found in (GLOBAL, THREAD_LOCAL, RELAXED):
        exchange(found)
        with cyctx.relaxed_capture():
            assert mode_now() == RELAXED
        assert mode_now() == found, found
    exchange(GLOBAL)


def test_a_new_thread_starts_global_and_keeps_its_own_mode():
    def other():
        before = mode_now()
        with cyctx.relaxed_capture():
            inside = mode_now()
        return before, inside, mode_now()

    with cyctx.relaxed_capture():
        assert in_thread(other) == (GLOBAL, RELAXED, GLOBAL)
        assert mode_now() == RELAXED
    exchange(THREAD_LOCAL)
    assert in_thread(mode_now) == GLOBAL  # another thread's mode is not this one's
    exchange(GLOBAL)


def test_nested_blocks_restore_at_the_outermost_end():
    exchange(THREAD_LOCAL)
    with cyctx.relaxed_capture():
        with cyctx.relaxed_capture():
            assert open_blocks() == 2
        assert mode_now() == RELAXED and open_blocks() == 1
    assert mode_now() == THREAD_LOCAL
    exchange(GLOBAL)


def test_interleaved_blocks_restore_when_the_last_one_ends():
    # Ends out of order (a ends before b): a stack of saved modes would put back the relaxed
    # mode b found and leave the thread relaxed.
    exchange(THREAD_LOCAL)
    a, b = cyctx.relaxed_capture(), cyctx.relaxed_capture()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert mode_now() == RELAXED  # b is still open
    b.__exit__(None, None, None)
    assert mode_now() == THREAD_LOCAL
    exchange(GLOBAL)


def test_two_asyncio_tasks_on_one_thread():
    seen = []

    async def task(name, entered, other_entered, release):
        with cyctx.relaxed_capture():
            entered.set()
            await other_entered.wait()
            await release.wait()
            seen.append((name, mode_now()))
        seen.append((name, "after", mode_now()))

    async def main():
        ea, eb, ra, rb = (asyncio.Event() for _ in range(4))
        ta = asyncio.create_task(task("a", ea, eb, ra))
        tb = asyncio.create_task(task("b", eb, ea, rb))
        await ea.wait()
        await eb.wait()
        ra.set()  # a leaves first, while b's block is open
        await ta
        rb.set()
        await tb

    asyncio.run(main())
    assert seen == [("a", RELAXED), ("a", "after", RELAXED), ("b", RELAXED), ("b", "after", GLOBAL)]


def test_the_body_error_goes_up_and_the_mode_comes_back():
    with pytest.raises(KeyError):
        with cyctx.relaxed_capture():
            raise KeyError("body")
    assert mode_now() == GLOBAL


def test_a_driver_error_on_entry_changes_nothing(sim):
    sim.inject_fault("cuThreadExchangeStreamCaptureMode", 999)
    with pytest.raises(cyctx.DriverError) as e:
        with cyctx.relaxed_capture():
            pytest.fail("the block ran")
    assert e.value.code == 999 and e.value.call == "cuThreadExchangeStreamCaptureMode"
    assert "unchanged" in str(e.value)
    assert (mode_now(), open_blocks()) == (GLOBAL, 0)


def test_a_driver_error_on_the_restore_says_the_mode_stays_relaxed(sim):
    with pytest.raises(cyctx.DriverError) as e:
        with cyctx.relaxed_capture():
            sim.inject_fault("cuThreadExchangeStreamCaptureMode", 999)
            raise KeyError("body")
    assert "stays relaxed" in " ".join(getattr(e.value, "__notes__", [])), e.value
    assert isinstance(e.value.__context__, KeyError)  # the body's error is not lost
    assert (mode_now(), open_blocks()) == (RELAXED, 0)
    exchange(GLOBAL)


def test_an_exit_without_an_entry_is_refused_and_changes_nothing():
    exchange(THREAD_LOCAL)
    with pytest.raises(cyctx.CyctxError, match="no relaxed_capture"):
        cyctx.relaxed_capture().__exit__(None, None, None)
    assert (mode_now(), open_blocks()) == (THREAD_LOCAL, 0)
    exchange(GLOBAL)


def test_a_block_left_on_another_thread_is_refused_there():
    r = cyctx.relaxed_capture()
    with r:
        with pytest.raises(cyctx.CyctxError, match="no relaxed_capture"):
            in_thread(r.__exit__, None, None, None)
        assert mode_now() == RELAXED


def test_in_a_forked_child_it_raises_forkerror():
    from helpers.forking import run_forked

    def child():
        try:
            with cyctx.relaxed_capture():
                return "ran"
        except cyctx.ForkError as e:
            return "ForkError" if "'spawn'" in str(e) else str(e)

    g = cyctx.ContextGuard(0)  # cyctx initialised CUDA in this parent, so it knows the child
    g.close()
    assert run_forked(child) == "ForkError"
