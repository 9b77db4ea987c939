"""The registry of live guards (a hash set of tokens in _cpp/registry.h): exit's slow path asks it
whether an entry left on the thread's stack belongs to a guard that still exists, and
cyctx.live_guards lists the guards it holds. Checked
through that path after thousands of additions and removals in random order, which grow the
table several times and delete from the middle of probe runs."""

import gc
import random

import pytest
from helpers.drivers import retains_unchanged
from helpers.finalizers import freed_on_purpose
from helpers.native import compile_and_run
from helpers.threads import in_thread

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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <vector>

// Each token's guard address stands in as the token itself, plus one: the snapshot gives back
// what was added with each token alive now, moved with it by growth and backward shifts.
static int take(void *) { return 1; }

static bool snapshot_matches(const std::set<unsigned long long> &model) {
    void **got = nullptr;
    size_t n = 0;
    if (cyctx::live_take(take, &got, &n) != 0) return false;
    std::set<unsigned long long> seen;
    for (size_t i = 0; i < n; i++) seen.insert((unsigned long long)(uintptr_t)got[i] - 1);
    std::free(got);
    return n == model.size() && seen == model;
}

// Random adds, removals and lookups of random tokens (random, unlike real tokens, so that
// probe runs form and removals happen inside them), checked against std::set at every step,
// and the snapshot of the guards' addresses every thousand steps.
int main() {
    std::mt19937_64 rng(12345);
    std::set<unsigned long long> model;
    std::vector<unsigned long long> pool;
    for (int i = 0; i < 4000; i++) pool.push_back((rng() >> 1) | 1);  // never 0, nor ~0 (+1 above)
    for (int step = 0; step < 300000; step++) {
        unsigned long long t = pool[rng() % (step < 150000 ? pool.size() : pool.size() / 4)];
        if (step % 1000 == 0 && !snapshot_matches(model)) {
            std::printf("snapshot mismatch at step %d\n", step);
            return 1;
        }
        switch (rng() % 3) {
        case 0:
            if (cyctx::live_add(t, (void *)(uintptr_t)(t + 1)) != 0) { std::puts("add failed"); return 1; }
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
    if (!snapshot_matches(model)) { std::puts("final snapshot mismatch"); return 1; }
    std::printf("ok %zu live\n", model.size());
    return 0;
}
"""


def test_registry_matches_a_reference_set(tmp_path):
    # The table itself, compiled from the installed header: thousands of random tokens
    # collide, so removals exercise the backward shift that keeps probe runs unbroken.
    out = compile_and_run(tmp_path, MODEL_CHECK, "registry")
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr


BOUNDS_CHECK = r"""
#include "_cpp/thread_entries.h"
#include <climits>
#include <cstdio>

#define CHECK(cond) do { if (!(cond)) { std::printf("FAILED line %d: %s\n", __LINE__, #cond); return 1; } } while (0)

int main() {
    // Before the first add there is no table (capacity 0: a slot mask of SIZE_MAX): lookups
    // and removals of any token, the extremes too, touch nothing.
    const unsigned long long extremes[] = {0ull, 1ull, 1ull << 63, ULLONG_MAX - 1, ULLONG_MAX};
    for (unsigned long long t : extremes) {
        CHECK(!cyctx::live_has(t));
        cyctx::live_remove(t);
    }
    CHECK(cyctx::live_capacity() == 0 && cyctx::live_count() == 0);

    // Token 0 marks an empty slot: refused (-2) before the table exists and after, and never
    // found or removed, however many empty slots the table has.
    CHECK(cyctx::live_add(0) == -2);
    CHECK(cyctx::live_capacity() == 0 && cyctx::live_count() == 0);
    for (unsigned long long t : extremes)
        if (t) CHECK(cyctx::live_add(t) == 0 && cyctx::live_has(t));
    CHECK(cyctx::live_capacity() == 64 && cyctx::live_count() == 4);
    CHECK(cyctx::live_add(0) == -2 && cyctx::live_count() == 4);
    CHECK(!cyctx::live_has(0));
    cyctx::live_remove(0);
    CHECK(cyctx::live_count() == 4);
    for (unsigned long long t : extremes)
        if (t) CHECK(cyctx::live_has(t));
    CHECK(cyctx::live_add(ULLONG_MAX) == 0 && cyctx::live_count() == 4);  // held once

    // At most half full: the 32nd token is the last the 64 slots take, the 33rd doubles them.
    unsigned long long next = 2;
    while (cyctx::live_count() < 32) CHECK(cyctx::live_add(next++) == 0);
    CHECK(cyctx::live_capacity() == 64);
    CHECK(cyctx::live_add(next++) == 0);
    CHECK(cyctx::live_capacity() == 128 && cyctx::live_count() == 33);
    for (unsigned long long t = 2; t < next; t++) CHECK(cyctx::live_has(t));
    for (unsigned long long t : extremes)
        if (t) CHECK(cyctx::live_has(t));

    // Removed down to empty, the extremes last: nothing is found, nothing is counted.
    for (unsigned long long t = 2; t < next; t++) cyctx::live_remove(t);
    for (unsigned long long t : extremes) cyctx::live_remove(t);
    CHECK(cyctx::live_count() == 0);
    for (unsigned long long t : extremes) CHECK(!cyctx::live_has(t));
    for (unsigned long long t = 2; t < next; t++) CHECK(!cyctx::live_has(t));

    // The token counter's extreme: past ULLONG_MAX it would wrap to 0, which the table refuses
    // rather than take as a token.
    cyctx::g_next_token.store(ULLONG_MAX);
    unsigned long long last = cyctx::new_token(), wrapped = cyctx::new_token();
    CHECK(last == ULLONG_MAX && wrapped == 0);
    CHECK(cyctx::live_add(last) == 0 && cyctx::live_add(wrapped) == -2);
    CHECK(cyctx::live_count() == 1 && cyctx::live_has(last) && !cyctx::live_has(wrapped));
    std::puts("ok");
    return 0;
}
"""


def test_registry_bounds_empty_table_token_zero_extremes_and_half_full(tmp_path):
    # The table's edges, each of which a weakened check turns into a crash (the first lookup
    # before any add reads through a null table), a hang (a full table has no empty slot to
    # stop a probe) or a wrong answer (token 0 matches an empty slot).
    out = compile_and_run(tmp_path, BOUNDS_CHECK, "bounds")
    assert out.returncode == 0 and out.stdout.strip() == "ok", (
        f"exit {out.returncode}: {out.stdout}{out.stderr}"
    )
