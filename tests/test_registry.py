"""The registry of live guards (a hash set of tokens in _cpp/thread_entries.h): exit's slow path asks it
whether an entry left on the thread's stack belongs to a guard that still exists. Checked
through that path after thousands of additions and removals in random order, which grow the
table several times and delete from the middle of probe runs."""

import gc
import os
import random
import shutil
import subprocess

import pytest
from helpers.drivers import retains_unchanged
from helpers.finalizers import freed_on_purpose
from helpers.threads import in_thread

import cyctx
from cyctx import ContextGuard, GuardError
from cyctx._guard import open_entries


def test_registry_keeps_every_live_guard_and_forgets_every_freed_one(sim):
    with retains_unchanged():

        def body():
            rng = random.Random(7)
            guards = [ContextGuard(i % 2) for i in range(3000)]
            rng.shuffle(guards)
            keep = guards[:1000]
            with freed_on_purpose():
                del guards[:1000]
                while guards:  # freed in random order: removals inside probe runs
                    guards.pop(rng.randrange(len(guards)))

            outer = ContextGuard(0)
            for g in keep:
                # A live guard's entry on top is never dropped: leaving the outer guard past it
                # is out of order (a dropped entry would let the outer exit succeed), and takes
                # the outer entry from under it, leaving g's own for g to leave.
                outer.__enter__()
                g.__enter__()
                with pytest.raises(GuardError, match="out of order"):
                    outer.__exit__(None, None, None)
                assert open_entries() == 1
                g.__exit__(None, None, None)
                assert open_entries() == 0
            outer.__enter__()
            for g in keep:
                g.close()
            del keep
            gc.collect()
            # Guards freed while entered (and the 1000 just freed) are gone from the registry:
            # the outer guard's exit drops all their entries.
            with freed_on_purpose():
                for _ in range(50):
                    ContextGuard(1).__enter__()
            with pytest.warns(ResourceWarning, match="dropped 50"):
                outer.__exit__(None, None, None)
            assert open_entries() == 0
            outer.close()

        in_thread(body)


MODEL_CHECK = r"""
#include "_cpp/thread_entries.h"
#include <cstdio>
#include <random>
#include <set>
#include <vector>

// Random adds, removals and lookups of random tokens (random, unlike real tokens, so that
// probe runs form and removals happen inside them), checked against std::set at every step.
int main() {
    std::mt19937_64 rng(12345);
    std::set<unsigned long long> model;
    std::vector<unsigned long long> pool;
    for (int i = 0; i < 4000; i++) pool.push_back(rng() | 1);  // never 0
    for (int step = 0; step < 300000; step++) {
        unsigned long long t = pool[rng() % (step < 150000 ? pool.size() : pool.size() / 4)];
        switch (rng() % 3) {
        case 0:
            if (cyctx::live_add(t) != 0) { std::puts("add failed"); return 1; }
            model.insert(t);
            break;
        case 1:
            cyctx::live_remove(t);
            model.erase(t);
            break;
        default:
            break;
        }
        unsigned long long probe = pool[rng() % pool.size()];
        if (cyctx::live_has(probe) != (model.count(probe) != 0) || cyctx::live_has(t) != (model.count(t) != 0)) {
            std::printf("mismatch at step %d\n", step);
            return 1;
        }
    }
    for (unsigned long long t : pool)
        if (cyctx::live_has(t) != (model.count(t) != 0)) { std::puts("final mismatch"); return 1; }
    std::printf("ok %zu live\n", model.size());
    return 0;
}
"""


def test_registry_matches_a_reference_set(tmp_path):
    # The table itself, compiled from the installed header: thousands of random tokens
    # collide, so removals exercise the backward shift that keeps probe runs unbroken.
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    src = tmp_path / "registry.cpp"
    src.write_text(MODEL_CHECK)
    exe = tmp_path / "registry"
    includes = [f"-I{d}" for d in [*cyctx.get_include_dirs(), os.path.dirname(cyctx.__file__)]]
    subprocess.run(
        [cxx, "-std=c++17", "-O1", *includes, str(src), "-o", str(exe), "-pthread"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr
