"""The load test (bench/stress.py), small and seeded: zero violations, retains balanced,
memory flat. The full-size load test (16 threads, 1M pairs) on an H200 is in docs/evidence.md,
"The load test on the H200"."""

import json
import os

from helpers.children import run_child

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")


def test_stress_small_seeded():
    out = run_child(
        f"""
        import json, sys
        sys.path.insert(0, {os.path.abspath(BENCH)!r})
        import stress
        print("RESULT", json.dumps(stress.run(threads=8, pairs=40000, seed=7, sim=drivers.SIM)))
    """,
        timeout=600,
    )
    res = json.loads(out.stdout.split("RESULT", 1)[1])
    assert res["pairs"] >= 40000 and res["exceptions"] > 0
    assert res["violations"] == 0
    if res["driver"] == "simulated":
        assert res["retains_held_during"] == [1] * res["devices"]
        assert res["retains_after_close"] == [0] * res["devices"]
    assert res["primary_active_after_close"] == [False] * res["devices"]
    assert res["rss_growth_kib"] < 4096, res


def test_stress_small_seeded_with_the_edges():
    # Shared guards, orphaned entries and late generator exits under load (docs/guarantees.md).
    out = run_child(
        f"""
        import json, sys
        sys.path.insert(0, {os.path.abspath(BENCH)!r})
        import stress
        print("RESULT", json.dumps(stress.run(threads=8, pairs=40000, seed=11, sim=drivers.SIM, edges=True)))
    """,
        timeout=600,
    )
    res = json.loads(out.stdout.split("RESULT", 1)[1])
    assert res["violations"] == 0, res
    assert res["orphaned_entries"] > 0 and res["late_generator_exits"] > 0, res
    if res["driver"] == "simulated":
        assert res["retains_held_during"] == [1] * res["devices"]
        assert res["retains_after_close"] == [0] * res["devices"]
    assert res["primary_active_after_close"] == [True] * res["devices"], (
        "the shared guards hold them"
    )
    assert res["rss_growth_kib"] < 4096, res
