"""Smoke run of the benchmark suite (bench/run_all.py --sim --quick), so it cannot rot.

It runs on cyctx's simulated driver whatever driver this test session uses (the suite picks
it in its own processes), with few iterations, and checks that every benchmark ran and wrote
its output: every group of bench/groups/, through bench/harness.py. It never checks a speed:
benchmarks are not timed assertions (bench/README.md).
"""

import importlib.util
import json
import os
import subprocess
import sys
from functools import partial

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(BENCH, "run_all.py")), reason="needs the source tree's bench/"
)

PATHS = ("fast", "from_none", "from_other")  # the simulated driver has two devices
EXPECTED_ROWS = (
    [
        (k, p)
        for k in ("driver.pushpop", "driver.pushpop_cydriver", "driver.setset")
        for p in PATHS[1:]
    ]
    + [
        ("driver.full", "from_none"),
        ("driver.getcurrent", "fast"),
        ("driver.getid", "fast"),
        ("cython.tls", "fast"),
    ]
    + [(k, p) for k in ("cython.guard", "cython.switch", "cython.switch_id") for p in PATHS]
    + [("python.loop", "fast"), ("python.empty_with", "fast")]
    + [("python.guard", p) for p in PATHS]
    + [(k, p) for k in ("cuda_bindings.pushpop", "cuda_bindings.full") for p in PATHS]
)
MISSING_ON_SIM = ("cupy", "cuda_core", "torch", "numba")
THREAD_KINDS = ("guard.fast", "guard.switch", "driver.pushpop", "switch.fast", "driver.getid")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-build")


@pytest.fixture(scope="module")
def run(tmp_path_factory, build_dir):
    out = tmp_path_factory.mktemp("bench-results")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "run_all.py"),
            "--sim",
            "--quick",
            "--repeat",
            "2",
            "--out-dir",
            str(out),
            "--build-dir",
            str(build_dir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    with open(out / "bench-sim.json") as f:
        return proc.stdout, out, json.load(f)


@pytest.fixture(scope="module")
def bench_modules():
    """bench/harness.py and bench/groups/, imported as run_all.py imports them."""
    sys.path.insert(0, BENCH)
    try:
        import groups
        import harness

        yield harness, groups
    finally:
        sys.path.remove(BENCH)


def test_every_group_ran(run):
    _, _, res = run
    assert res["schema"] == "cyctx-bench/1"
    assert res["mode"] == {"driver": "simulated", "quick": True}
    status = {name: g["status"] for name, g in res["groups"].items()}
    for name in ("core", "threads", "memory", "peer:cuda_bindings"):
        assert status.pop(name) == "ok", res["groups"][name]
    assert status == {f"peer:{p}": "missing: simulated driver" for p in MISSING_ON_SIM}
    pids = [
        g["pid"] if isinstance(g["pid"], list) else [g["pid"]]
        for g in res["groups"].values()
        if "pid" in g
    ]
    assert [len(p) for p in pids] == [2, 1, 1, 2], (
        "core and peers repeat in 2 processes, threads and memory not"
    )
    pids = sum(pids, [])
    assert len(set(pids)) == len(pids), "each group runs in its own process"
    cpu = res["method"]["pinned_cpu"]
    assert (
        cpu is not None
        and res["groups"]["core"]["cpu"] == cpu
        and res["groups"]["threads"]["cpu"] is None
    )


def test_every_cost_row_measured(run):
    _, _, res = run
    rows = {(r["id"], r["path"]): r for r in res["cost"] if r["layer"] != "control"}
    for key in EXPECTED_ROWS:
        r = rows.get(key)
        assert r is not None, f"{key} not measured"
        assert r["status"] == "ok" and r["ns"] > 0 and r["n"] >= 1 and r["rounds"] >= 1, r
        assert len(r["per_process_ns"]) == 2 and all(v > 0 for v in r["per_process_ns"]), r
        assert r.get("restored", True), f"{key} left another context current"
        assert r.get("current_inside", True), f"{key}: device 0's context was not current inside"
    controls = {(r["group"], r["id"]): r for r in res["cost"] if r["layer"] == "control"}
    assert sorted(controls) == [
        ("peer:cuda_bindings", k) for k in ("cython.guard", "python.empty_with", "python.guard")
    ]
    assert all(r["status"] == "ok" and r["ns"] > 0 for r in controls.values())


def test_every_registered_case_and_process_ran(run, bench_modules):
    # A group added to bench/groups/ is run, or this fails: each registered case has its row
    # on every path the simulated driver's two devices give, and each process reported.
    _, _, res = run
    _, groups = bench_modules
    assert sorted(res["groups"]) == sorted(groups.PROCESSES)
    rows = {(r["group"], r["layer"], r["id"], r["path"]) for r in res["cost"]}
    for group, cases in groups.CASES.items():
        process = group if group.startswith("peer:") else "core"
        for c in cases:
            for path in c.paths:
                assert (process, c.layer, c.id, path) in rows, (group, c.id, path)


def test_the_tls_row_times_cyctx_own_header(run, build_dir):
    # Compiled against the installed cyctx's _cpp/thread_entries.h (no copy of the stack in bench/_bench.pyx).
    cpp = (build_dir / "_bench.cpp").read_text()
    assert '#include "_cpp/thread_entries.h"' in cpp
    assert "cyctx::tls_push(" in cpp and "cyctx::tls_pop_own(" in cpp  # what enter and exit call
    assert "static thread_local" not in (build_dir / "_bench.pyx").read_text()  # a stack of its own


def test_probe_reads_the_context_inside_the_block(bench_modules):
    # The check behind current_inside, on a fake context: it reads inside the block, so a body
    # that makes nothing current reads as such, and a body of another shape is refused.
    harness, _ = bench_modules
    from groups.from_python import with_object

    state = {"current": 0}

    class Switches:
        def __enter__(self):
            state["current"] = 7

        def __exit__(self, *exc):
            state["current"] = 0

    class DoesNothing:
        def __enter__(self):
            pass

        def __exit__(self, *exc):
            pass

    def current():
        return state["current"]

    assert harness.probe(partial(with_object, Switches()), current) == 7
    assert state["current"] == 0
    assert harness.probe(partial(with_object, DoesNothing()), current) == 0

    def pair(n):
        for _ in range(n):
            state.update(current=5)
            state.update(current=0)

    assert harness.probe(pair, current) == 5
    with pytest.raises(RuntimeError, match="not a `for` loop"):
        harness.probe(lambda n: None, current)


def test_missing_peers_are_reported_as_missing_never_zero(run):
    stdout, _, res = run
    for peer in MISSING_ON_SIM:
        rows = [r for r in res["cost"] if r["group"] == f"peer:{peer}"]
        assert rows, f"{peer} has no rows"
        for r in rows:
            assert r["ns"] is None and r["status"] == "missing: simulated driver", r
    assert "missing (simulated driver): cuda_core, cupy, numba, torch" in stdout
    by_id = {t["id"]: t for t in res["targets"]}
    for tid in ("cupy_vs_python", "cuda_core_vs_python", "torch_vs_python"):
        assert by_id[tid]["value"] is None and by_id[tid]["met"] is None
        assert "missing" in by_id[tid]["detail"]


def test_thread_scaling_ran_at_every_count(run):
    _, _, res = run
    rows = res["threads"]["rows"]
    for kind in THREAD_KINDS:
        got = {r["threads"]: r for r in rows if r["id"] == kind}
        assert sorted(got) == [1, 2, 4, 8, 16], kind
        for t, r in got.items():
            assert r["aggregate_ns_per_op"] > 0 and r["team"] == t, r
    assert res["threads"]["restored"]
    assert all(v > 0 for v in res["threads"]["main_thread_no_openmp_ns"].values())


def test_memory_run_balanced(run):
    _, _, res = run
    mem = res["memory"]
    assert [r["cycles"] for r in mem["runs"]] == [100_000, 100_000, 10_000]
    for r in mem["runs"]:
        assert r["rss_kib_before"] > 0 and r["rss_kib_after"] > 0 and r["restored"], r
    assert (
        mem["balanced"] and mem["retains_after_close"] == [0, 0] and mem["retains_during"] == [1, 1]
    )
    assert mem["open_entries_after"] == 0 and mem["primary_active_after_close"] == [False, False]


def test_targets_and_breakdown_computed(run):
    _, _, res = run
    ids = [t["id"] for t in res["targets"]]
    assert ids == [
        "python_vs_empty_with",
        "cupy_vs_python",
        "cuda_core_vs_python",
        "torch_vs_python",
        "cython_switch_vs_pushpop",
        "cython_switch_other_vs_pushpop",
        "cython_fast_vs_pushpop",
        "threads16_fast_speedup",
        "memory_flat",
    ]
    for t in res["targets"]:
        if t["id"] not in ("cupy_vs_python", "cuda_core_vs_python", "torch_vs_python"):
            assert isinstance(t["value"], (int, float)), t
        # On the simulated driver a timing target is neither met nor missed: its costs are not
        # a GPU driver's. The memory target (RSS growth, retains balanced) is cyctx's own.
        if t["id"] == "memory_flat":
            assert t["met"] is True, t
        else:
            assert t["met"] is None and t["detail"], t
            if t["value"] is not None:
                assert t["detail"].startswith("not measured here: "), t
    assert set(res["breakdown"]) == {"fast", "from_none", "from_other", "python_fast"}


def test_outputs_written(run):
    stdout, out, res = run
    with open(out / "bench-sim.txt") as f:
        table = f.read()
    for title in ("Per enter+exit", "Threads:", "Memory", "Targets"):
        assert title in table and title in stdout
    assert (out / "bench-sim.md").read_text().count("| layer | what |") == 1
    # The simulated driver's timings judge no target: none is shown as missed.
    assert "MISSED" not in table and "MISSED" not in stdout
    section = table.split("Targets", 1)[1]
    for t in res["targets"]:
        (row,) = [ln for ln in section.splitlines() if ln.lstrip().startswith(t["what"])]
        want = "met" if t["id"] == "memory_flat" else "not measured here"
        assert want in row.split(t["goal"], 1)[1], (t["id"], row)
    assert res["packages"]["cyctx"] and res["packages"]["cuda-bindings"]
    assert res["gpu"]["driver"] == "simulated" and res["gpu"]["devices"] == 2
    assert res["machine"]["python"] == sys.version.split()[0]
    assert res["outputs"]["json"] == "bench-sim.json"
    plots = res["outputs"]["plots"]
    if importlib.util.find_spec("matplotlib"):
        assert plots == ["bench-sim-cost.png", "bench-sim-threads.png"]
        for p in plots:
            assert (out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert plots.startswith("skipped: matplotlib is not installed")
        assert "plots skipped" in stdout


POOL_PATTERNS = ("baseline", "bind_once", "bind_per_task", "initializer", "guard_per_worker")
POOL_CALLS = (
    "plain_call",
    "bound_call",
    "bind_and_call",
    "guard_epoch",
    "context_epoch_of_handle",
    "relaxed_capture_block",
    "cuda_initialized",
)


def test_pool_patterns_benchmark_runs_on_the_simulator(tmp_path):
    # bench/pools.py (docs/thread-pools.md): every pattern and every call ran and has its
    # figures, on stdout (JSON), stderr (the table) and in the --out files, the same in each.
    prefix = str(tmp_path / "pools")
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH, "pools.py"), "--sim", "--quick", "--out", prefix],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["driver"] == "simulated"
    for name in POOL_PATTERNS:
        assert out[name]["ns_per_task"] > 0 and "over_baseline_ns" in out[name], name
    assert list(out["calls"]) == list(POOL_CALLS) and all(v > 0 for v in out["calls"].values())
    with open(prefix + ".json") as f:
        assert json.load(f) == out
    with open(prefix + ".txt") as f:
        table = f.read()
    assert table.strip() == proc.stderr.strip()
    for name in POOL_PATTERNS + POOL_CALLS:
        assert name in table, name


def test_a_verdict_is_met_missed_or_not_measured_here_on_the_simulated_driver(bench_modules):
    import report

    real, sim = {"mode": {"driver": "real"}}, {"mode": {"driver": "simulated"}}
    assert [report.verdict({"met": m}, real) for m in (True, False, None)] == [
        "met",
        "MISSED",
        "n/a",
    ]
    assert report.verdict({"met": None}, sim) == "not measured here"
