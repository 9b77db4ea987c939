"""The plain build (public CPython API only) against the tested one, where they differ: the plain
build reads no strand, so an exit not made through its `with` statement's binding takes the
guard's sole entry on the thread or is refused loudly.
"""

import os

import pytest
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, GuardError
from cyctx._guard import PLAIN_PROTOCOL, open_entries


def test_the_build_is_the_one_this_run_expects():
    # CI's plain job sets CYCTX_EXPECT_PLAIN=1 beside CYCTX_PLAIN_PROTOCOL=1: a job that thinks
    # it tests the plain build but imports a tested one (or the reverse) fails here.
    assert PLAIN_PROTOCOL == (os.environ.get("CYCTX_EXPECT_PLAIN") == "1")


class Wrapper:
    def __init__(self, g):
        self.g = g

    def __enter__(self):
        self.g.__enter__()
        return self

    def __exit__(self, *a):
        return self.g.__exit__(*a)


def test_with_blocks_are_told_apart_in_both_builds():
    g = ContextGuard(0)

    def gen():
        with g:
            yield

    def body():
        a, b = gen(), gen()
        next(a)
        next(b)
        with pytest.raises(GuardError, match="out of order"):
            next(a, None)  # a's own entry, removed from under b's block
        assert cyctx.current_device() == 0 and open_entries() == 1
        next(b, None)
        return cyctx.current_device(), open_entries()

    assert in_thread(body) == (None, 0)
    g.close()


def test_two_wrapper_blocks_of_one_guard_nested_in_order():
    # Told apart by strand in the tested build (the same strand, innermost first: quiet); the
    # plain build cannot tell them apart and refuses, changing nothing.
    g = ContextGuard(0)

    def body():
        outer, inner = Wrapper(g), Wrapper(g)
        outer.__enter__()
        inner.__enter__()
        if not PLAIN_PROTOCOL:
            inner.__exit__(None, None, None)
            outer.__exit__(None, None, None)
            return "quiet", open_entries(), cyctx.current_device()
        with pytest.raises(GuardError, match="cannot tell which of its 2 open blocks") as e:
            inner.__exit__(None, None, None)
        assert "public CPython API only" in str(e.value)
        return "refused", open_entries(), cyctx.current_device()

    expected = ("refused", 2, 0) if PLAIN_PROTOCOL else ("quiet", 0, None)
    assert in_thread(body) == expected
    g.close()


def test_a_wrapper_block_alone_is_the_exits_in_both_builds():
    g = ContextGuard(0)

    def body():
        with Wrapper(g):
            assert cyctx.current_device() == 0
        return open_entries(), cyctx.current_device()

    assert in_thread(body) == (0, None)
    g.close()
