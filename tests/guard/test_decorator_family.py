"""Decorators see what a callable hides: staticmethod/classmethod are seen through (the method
still binds as it did, and runs inside the guard); a callable that runs in steps (async def,
async generator, generator) is refused at decoration however it is wrapped."""

import functools

import pytest
from helpers.children import run_child
from helpers.stepwise import HIDDEN, wrapped_by_wraps

import cyctx


@pytest.fixture
def deco():
    # A guard of its own: cyctx.device(k) is a ContextGuard with the same __call__ (a shared
    # guard lives as long as the process: test_device_decorator_does_the_same runs in a child).
    g = cyctx.ContextGuard(0)
    yield g
    g.close()


def test_staticmethod_and_classmethod_are_seen_through(deco):
    class C:
        @deco
        @staticmethod
        def s(x):
            return x, cyctx.current_device()

        @deco
        @classmethod
        def c(cls, x):
            return cls, x, cyctx.current_device()

    assert isinstance(C.__dict__["s"], staticmethod) and isinstance(C.__dict__["c"], classmethod)
    assert C.s(1) == (1, 0) and C().s(2) == (2, 0)
    assert C.c(3) == (C, 3, 0) and C().c(4) == (C, 4, 0)
    assert cyctx.current_device() is None


@pytest.mark.parametrize("name", list(HIDDEN))
def test_what_runs_in_steps_is_refused_at_decoration(deco, name):
    with pytest.raises(
        TypeError, match=r"cannot decorate an? (async def|async generator|generator) function"
    ) as e:
        deco(HIDDEN[name])
    assert "Write `with guard:` inside it" in str(e.value) and "thread" in str(e.value)
    assert str(e.value).count(". ") <= 1  # two sentences


@pytest.mark.parametrize(
    "how",
    ["guard", "cyctx.device(0)", "@cyctx.bind(device=0)", "bind(C, device=0)", "@cyctx.bind"],
)
def test_a_class_is_refused_at_decoration_by_every_decorator(deco, how):
    # Wrapped, only the construction would run in the context and the name would stop being a
    # class; refused before the driver is asked anything (no context is current here).
    class C:
        pass

    apply = {
        "guard": deco,
        "cyctx.device(0)": cyctx.device(0),
        "@cyctx.bind(device=0)": cyctx.bind(device=0),
        "bind(C, device=0)": lambda c: cyctx.bind(c, device=0),
        "@cyctx.bind": cyctx.bind,
    }[how]
    with pytest.raises(TypeError, match=r"^cannot decorate a class \(.*C\) with ") as e:
        apply(C)
    assert "Decorate the methods that make driver calls" in str(e.value)
    assert cyctx.current_device() is None


def test_plain_callables_are_still_decorated(deco):
    class Call:
        def __call__(self, x):
            return x, cyctx.current_device()

    assert deco(Call())(1) == (1, 0)
    assert deco(functools.partial(lambda x, y: (x, y, cyctx.current_device()), 1))(2) == (1, 2, 0)
    assert deco(wrapped_by_wraps(lambda: cyctx.current_device()))() == 0
    assert deco(len)([1]) == 1  # a builtin


def test_device_decorator_does_the_same():
    out = run_child(
        """
        import functools, cyctx
        class C:
            @cyctx.device(0)
            @staticmethod
            def s():
                return cyctx.current_device()
        async def a():
            pass
        print("STATIC", C.s(), C().s())
        for hidden in (functools.partial(a), staticmethod(a)):
            try:
                cyctx.device(0)(hidden)
            except TypeError as e:
                print("REFUSED", "async def" in str(e))
        """
    )
    assert "STATIC 0 0" in out.stdout and out.stdout.count("REFUSED True") == 2, out.stdout
