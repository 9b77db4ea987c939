"""cyctx from Python: `with guard:`, beside the floor of any Python-level row, the loop
itself and a `with` over an extension type that does nothing.

Every Python-level body, here and in peers.py, is one plain `for _ in range(n):` around its
enter and exit, so every such row pays the same loop overhead (`python.loop` measures it).
The enter is the loop body's first line: harness.probe reads the current context as the line
after it starts, which is inside the block.
"""

from functools import partial

from . import PATHS, registrar

case = registrar("from_python", layer="python", python=True)


def empty_loop(n):
    for _ in range(n):
        pass


def with_object(cm, n):
    """`with cm:` n times, cm made beforehand (a guard, an Empty, a peer's device object)."""
    for _ in range(n):
        with cm:
            pass


@case("python.loop", "empty loop iteration (for _ in range(n): pass)", checks=())  # no context work
def loop(env, path):
    return empty_loop


@case("python.empty_with", "with Empty(): an extension type doing nothing", checks=("restored",))
def empty_with(env, path):
    return partial(with_object, env.empty)


@case("python.guard", "with guard: (pre-built ContextGuard)", paths=PATHS)
def guard(env, path):
    return partial(with_object, env.g0)


def empty_function():
    pass


def call_each(fn, n):
    """fn() n times: a block in a function called per step, in a new frame each call."""
    for _ in range(n):
        fn()


@case("python.call", "call of an empty function (the floor of the row below)", checks=())
def call(env, path):
    return partial(call_each, empty_function)


def guard_block(guard):
    def block():
        with guard:
            pass

    return block


# A `with guard:` in a loop reuses one frame; a block in a function called per step gets a new
# frame each call, and cyctx records the block's frame: that is where its cost shows. The
# probe reads the loop's own frame, outside the called block, so only `restored` is checked.
@case("python.guard_call", "with guard: in a function called per block", checks=("restored",))
def guard_call(env, path):
    return partial(call_each, guard_block(env.g0))


def temporary_guards(ordinal, n):
    """`with ContextGuard(ordinal):` n times, a new guard per block, freed at the block's end:
    the spelling CuPy's users bring (the process keeps the retain, so nothing is destroyed)."""
    from cyctx import ContextGuard

    for _ in range(n):
        with ContextGuard(ordinal):
            pass


@case("python.temporary", "with ContextGuard(0): (a guard per block, collected)", paths=PATHS)
def temporary(env, path):
    import warnings

    warnings.simplefilter("ignore", ResourceWarning)  # the row times the block, not a shown warning
    return partial(temporary_guards, 0)
