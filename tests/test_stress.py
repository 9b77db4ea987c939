"""The load test (bench/stress.py), small and seeded: zero violations, retains balanced,
memory flat. The full-size load test (16 threads, 1M pairs) on an H200 is in docs/evidence.md,
"The load test on the H200"."""

import json
import os

import pytest
from helpers.children import run_child

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")


@pytest.mark.parametrize("edges", [False, True], ids=["plain", "edges"])
def test_stress_small_seeded(edges):
    # edges: shared guards, orphaned entries and late generator exits under load
    # (docs/guarantees.md).
    seed = 11 if edges else 7
    out = run_child(
        f"""
        import json, sys
        sys.path.insert(0, {os.path.abspath(BENCH)!r})
        import stress
        res = stress.run(threads=8, pairs=40000, seed={seed}, sim=drivers.SIM, edges={edges})
        print("RESULT", json.dumps(res))
    """,
        timeout=600,
    )
    res = json.loads(out.stdout.split("RESULT", 1)[1])
    assert res["violations"] == 0, res
    if edges:
        assert res["orphaned_entries"] > 0 and res["late_generator_exits"] > 0, res
    else:
        assert res["pairs"] >= 40000 and res["exceptions"] > 0, res
    if res["driver"] == "simulated":
        assert res["retains_held_during"] == [1] * res["devices"]
        assert res["retains_after_close"] == [0] * res["devices"]
    # The shared guards of the edges hold their primary contexts; the plain guards' are released.
    assert res["primary_active_after_close"] == [edges] * res["devices"], res
    assert res["rss_growth_kib"] < 4096, res
