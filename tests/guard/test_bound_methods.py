"""A guard's bound __enter__ and __exit__: `with guard:` binds them through cyctx's own quick
method objects (src/cyctx/_protocol/methods.h), which must behave as the plain bound methods they
stand for, keep the guard alive exactly as long as they live, and never be given to an object
that could put them in a reference cycle (a subclass instance, which has a __dict__)."""

import copy
import gc
import inspect
import pickle
import sys
import types
import weakref

import pytest
from helpers.children import run_child
from helpers.drivers import current
from helpers.threads import in_thread

from cyctx import ContextGuard
from cyctx._guard import open_entries


def test_a_bound_method_reads_as_the_method_it_stands_for(guard):
    other = ContextGuard(0)
    for name in ("__enter__", "__exit__"):
        m = getattr(guard, name)
        plain = types.MethodType(getattr(ContextGuard, name), guard)
        assert isinstance(m, types.MethodType) and inspect.ismethod(m)
        assert m.__self__ is guard and m.__func__ is getattr(ContextGuard, name)
        assert m.__name__ == name and m.__qualname__ == f"ContextGuard.{name}"
        assert m.__doc__ == plain.__doc__ and repr(m) == repr(plain)
        assert inspect.signature(m) == inspect.signature(plain)
        assert m == getattr(guard, name) and hash(m) == hash(getattr(guard, name))
        assert m != getattr(other, name)
    other.close()
    assert guard.__enter__ != guard.__exit__
    assert str(inspect.signature(guard.__exit__)) == "(exc_type, exc, tb)"


def test_the_class_and_the_class_dict_give_the_plain_function(guard):
    # contextlib.ExitStack takes type(cm).__enter__ and calls it with the guard.
    enter = ContextGuard.__enter__
    assert not isinstance(enter, types.MethodType) and enter.__name__ == "__enter__"

    def body():
        assert enter(guard) is guard and current() == guard.handle
        ContextGuard.__exit__(guard, None, None, None)
        direct = ContextGuard.__dict__["__enter__"]  # the slot itself, called as the function
        assert direct(guard) is guard and current() == guard.handle
        ContextGuard.__dict__["__exit__"](guard, None, None, None)
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


def test_calls_the_quick_path_does_not_take_behave_as_the_plain_method(guard):
    def body():
        with pytest.raises(TypeError, match="__enter__"):
            guard.__enter__(1)
        with pytest.raises(TypeError, match="__enter__"):
            guard.__enter__(x=1)  # keywords: never taken for a plain enter
        with pytest.raises(TypeError, match="__exit__"):
            guard.__exit__(None, None)
        assert (current(), open_entries()) == (0, 0)  # a refused call changes nothing
        assert guard.__enter__() is guard
        assert guard.__exit__(exc_type=None, exc=None, tb=None) is False  # keywords work
        assert guard.__enter__() is guard
        assert guard.__exit__(None, exc=None, tb=None) is False
        return current(), open_entries()

    assert in_thread(body) == (0, 0)


def test_a_bound_method_keeps_its_guard_alive_and_no_longer():
    g = ContextGuard(0)
    dead = weakref.ref(g)
    held = [g.__enter__, g.__exit__]
    del g
    gc.collect()
    assert dead() is not None  # the bound methods hold it

    def body():
        enter, leave = held
        assert enter() is dead() and current() == dead().handle
        leave(None, None, None)
        return current()

    assert in_thread(body) == 0
    dead().close()
    held.clear()
    assert dead() is None  # freed by reference counting, without the collector


def test_with_blocks_take_and_give_back_no_reference(guard):
    def body():
        before = sys.getrefcount(guard)
        for _ in range(1000):
            with guard:
                pass
        bounds = [guard.__enter__ for _ in range(100)]  # more than the free list keeps
        del bounds
        return sys.getrefcount(guard) - before

    assert in_thread(body) == 0


def test_a_subclass_instance_gets_plain_methods_and_its_cycles_are_collected():
    # A subclass instance has a __dict__: a bound method stored in it makes a cycle, which
    # only a method object the collector tracks can break.
    class Sub(ContextGuard):
        pass

    s = Sub(0)
    assert type(s.__enter__) is types.MethodType and type(s.__exit__) is types.MethodType
    s.keep = (s.__enter__, s.__exit__)
    s.close()
    dead = weakref.ref(s)
    del s
    gc.collect()
    assert dead() is None


def test_a_temporary_guard_lives_to_the_end_of_its_block():
    # `with ContextGuard(0):` holds the guard only through the bound __exit__.
    out = run_child("""
        import gc, warnings
        from cyctx import ContextGuard
        warnings.simplefilter("ignore", ResourceWarning)  # the temporary's release warns
        for _ in range(3):
            with ContextGuard(0) as g:
                del g
                gc.collect()
                inside = drivers.current()
            print("INSIDE", inside != 0, "AFTER", drivers.current() == 0)
    """)
    assert out.stdout.count("INSIDE True AFTER True") == 3, out.stdout


def test_a_shared_guards_bound_method_pickles_and_copies():
    out = run_child("""
        import copy, pickle, cyctx
        m = cyctx.device(0).__exit__
        back = pickle.loads(pickle.dumps(m))
        print("PICKLED", back == m, back.__self__ is cyctx.device(0))
        print("COPIED", copy.copy(m) == m)
    """)
    assert "PICKLED True True" in out.stdout and "COPIED True" in out.stdout, out.stdout


def test_a_kept_guards_bound_method_refuses_to_pickle_as_the_guard_does(guard):
    with pytest.raises(TypeError, match="pickle"):
        pickle.dumps(guard.__enter__)
    with pytest.raises(TypeError):
        copy.deepcopy(guard.__exit__)


def test_an_exact_guard_binds_cyctxs_quick_methods(guard):
    # What makes `with guard:` cheap: not a new garbage-collected method object per lookup,
    # but cyctx's own (scripts/quality/fastpath_instructions.py counts the difference).
    for m in (guard.__enter__, guard.__exit__):
        assert type(m) is not types.MethodType and not gc.is_tracked(m)


def test_a_bound_method_equals_and_hashes_as_the_plain_method(guard):
    for name in ("__enter__", "__exit__"):
        m, plain = getattr(guard, name), getattr(ContextGuard, name).__get__(guard)
        assert type(plain) is types.MethodType
        assert m == plain and plain == m and not (m != plain) and hash(m) == hash(plain)
        assert hash(m) == m.__hash__() and len({m, plain}) == 1
        assert copy.copy(plain) == plain  # rebuilt through getattr(guard, name)
    other = ContextGuard.__enter__.__get__(ContextGuard(0))  # another guard of the same device
    assert guard.__enter__ != other
    other.__self__.close()


def test_a_bound_method_takes_weak_references(guard):
    # As a plain method does: weakref.ref, WeakSet, finalize, and WeakMethod (which rebuilds
    # the method from its function and self when called).
    m = guard.__exit__
    r = weakref.ref(m)
    ws = weakref.WeakSet([m])
    fired = []
    weakref.finalize(m, fired.append, "freed")
    wm = weakref.WeakMethod(guard.__exit__)
    assert r() is m and m in ws and wm() == m
    del m
    assert r() is None and len(ws) == 0 and fired == ["freed"]
    assert wm() == guard.__exit__  # the guard lives: the method is made again
    with pytest.raises(TypeError):
        type(guard.__enter__)(ContextGuard.__enter__, guard, extra=1)
