"""Callables whose body runs in steps (async def, async generator, generator), hidden every way
a decorator is handed one: what the guard's decorator and cyctx.bind refuse, by one rule."""

import functools


async def _coro():
    pass


async def _agen():
    yield


def _gen():
    yield


class _AsyncCall:
    async def __call__(self):
        pass


class _GenCall:
    def __call__(self):
        yield


def wrapped_by_wraps(inner):
    @functools.wraps(inner)
    def wrapper(*a, **k):
        return inner(*a, **k)

    return wrapper


HIDDEN = {
    "async def": _coro,
    "async generator": _agen,
    "generator": _gen,
    "partial of async def": functools.partial(_coro),
    "partial of async generator": functools.partial(_agen),
    "partial of partial of generator": functools.partial(functools.partial(_gen)),
    "functools.wraps around async def": wrapped_by_wraps(_coro),
    "functools.wraps around a generator": wrapped_by_wraps(_gen),
    "functools.wraps around a partial of async def": wrapped_by_wraps(functools.partial(_coro)),
    "object with async __call__": _AsyncCall(),
    "object with generator __call__": _GenCall(),
    "staticmethod of async def": staticmethod(_coro),
    "classmethod of async generator": classmethod(_agen),
    "staticmethod of wraps around generator": staticmethod(wrapped_by_wraps(_gen)),
}
