"""Helpers shared by the tests, imported as ``helpers`` (tests/conftest.py puts tests/ on
sys.path; children started by ``helpers.children.run_child`` get it through PYTHONPATH).

drivers     which driver this process runs on (real or simulated), small driver calls, and
            retains_unchanged(): a block leaves every primary-context refcount as it found it
threads     run functions on new threads; a thread's exception fails the test
forking     run a function in a forked child and get its result back, with a timeout
children    run code in a fresh interpreter on the same driver
finalizers  code that runs late: generators suspended inside a guard, unraisable errors,
            freed_on_purpose(): guards let go without close(), their ResourceWarning expected
fakes       stand-ins for framework objects (torch, CuPy, ...) without the framework

Nothing here imports cyctx or cuda.bindings at import time, so the simulator's own tests
(tests/sim/) can use ``threads`` and ``children`` before they load the simulated driver.
"""
