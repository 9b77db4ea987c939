"""Smoke run of the benchmark suite (bench/run_all.py --sim --quick), so it cannot rot.

It runs on cyctx's simulated driver whatever driver this test session uses (the suite picks
it in its own processes), with few iterations, and checks that every benchmark ran and wrote
its output: every group of bench/groups/, the compiled ones through bench/harness.py and the
Python-level ones through pyperf (bench/python_group.py). It never checks a speed:
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
pytestmark = [
    pytest.mark.tooling,
    pytest.mark.skipif(
        not os.path.isfile(os.path.join(BENCH, "run_all.py")),
        reason="needs the source tree's bench/",
    ),
]

PATHS = ("fast", "from_none", "from_other")  # the simulated driver has two devices
EXPECTED_ROWS = (
    [
        ("nogil", k, p)
        for k in ("driver.pushpop", "driver.pushpop_cydriver", "driver.setset")
        for p in PATHS[1:]
    ]
    + [
        ("nogil", "driver.full", "from_none"),
        ("nogil", "driver.getcurrent", "fast"),
        ("nogil", "driver.getid", "fast"),
        ("nogil", "cython.tls", "fast"),
    ]
    + [
        ("nogil", k, p)
        for k in ("cython.guard", "cython.switch", "cython.switch_id")
        for p in PATHS
    ]
    + [("python", k, "fast") for k in ("python.loop", "python.empty_with", "python.call")]
    + [("python", "python.guard_call", "fast")]
    + [("python", "python.guard", p) for p in PATHS]
    + [
        ("peer:cuda_bindings", k, p)
        for k in ("cuda_bindings.pushpop", "cuda_bindings.full")
        for p in PATHS
    ]
)
MISSING_ON_SIM = ("cupy", "cuda_core", "torch", "numba")
THREAD_KINDS = ("guard.fast", "guard.switch", "driver.pushpop", "switch.fast", "driver.getid")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-build")


@pytest.fixture(scope="module")
def run(tmp_path_factory, build_dir):
    """(stdout, out dir, the pyperf suite {name: benchmark}, the report's JSON)."""
    pyperf = pytest.importorskip("pyperf", reason="the benchmarks need pyperf (the bench extra)")
    out = tmp_path_factory.mktemp("bench-results")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "run_all.py"),
            "--sim",
            "--quick",
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
    suite = pyperf.BenchmarkSuite.load(str(out / "bench-sim.json"))
    with open(out / "bench-sim-report.json") as f:
        return proc.stdout, out, {b.get_name(): b for b in suite.get_benchmarks()}, json.load(f)


@pytest.fixture(scope="module")
def bench_modules():
    """bench/harness.py, bench/groups/ and bench/run_all.py, imported as run_all.py imports them."""
    sys.path.insert(0, BENCH)
    try:
        import groups
        import harness

        yield harness, groups
    finally:
        sys.path.remove(BENCH)


def test_every_group_ran(run):
    _, _, suite, info = run
    assert info["schema"] == "cyctx-bench/2"
    assert info["mode"] == {"driver": "simulated", "quick": True}
    status = {name: g["status"] for name, g in info["groups"].items()}
    for name in ("nogil", "threads", "memory", "python", "peer:cuda_bindings"):
        assert status.pop(name) == "ok", info["groups"][name]
    assert status == {f"peer:{p}": "missing: simulated driver" for p in MISSING_ON_SIM}
    cpu = info["pinned_cpu"]
    assert cpu is not None
    for name, b in suite.items():
        # pyperf records an affinity narrower than the machine's: every single-threaded
        # process, pyperf's workers included, ran on the pinned CPU; the threads group did not.
        pinned = b.get_metadata().get("cpu_affinity")
        if name.startswith("threads/"):
            assert pinned is None or len(os.sched_getaffinity(0)) == 1, (name, pinned)
        else:
            assert pinned == str(cpu) or len(os.sched_getaffinity(0)) == 1, (name, pinned)


def test_every_cost_row_measured(run):
    _, _, suite, _ = run
    for group, row, path in EXPECTED_ROWS:
        b = suite.get(f"{group}/{row}/{path}")
        assert b is not None, f"{group}/{row}/{path} not measured"
        md = b.get_metadata()
        assert (md["group"], md["row"], md["path"]) == (group, row, path)
        assert b.median() > 0 and md["unit"] == "second"
        assert md.get("restored", 1) == 1, f"{row} left another context current"
        assert md.get("current_inside", 1) == 1, f"{row}: device 0's context was not current inside"
        timed = [r for r in b.get_runs() if r.values]
        if group == "nogil":
            # The compiled timer: one process, 3 rounds (--quick) after a warm-up round.
            assert len(timed) == 1 and len(timed[0].values) == 3 and len(timed[0].warmups) == 1
        else:
            # pyperf's worker, as --quick sets it: one process of 2 values of 1000 loops.
            assert len(timed) == 1 and len(timed[0].values) == 2 and md["loops"] == 1000, b
    controls = {n for n in suite if suite[n].get_metadata().get("layer") == "control"}
    assert sorted(controls) == [
        f"peer:cuda_bindings/{k}/fast"
        for k in ("cython.guard", "python.empty_with", "python.guard")
    ]


def test_every_registered_case_and_process_ran(run, bench_modules):
    # A group added to bench/groups/ is run, or this fails: each registered case has its row
    # on every path the simulated driver's two devices give, and each process reported.
    _, _, suite, info = run
    _, groups = bench_modules
    assert sorted(info["groups"]) == sorted([*groups.COMPILED, *groups.PYTHON_GROUPS])
    for group, cases in groups.CASES.items():
        process = {"floor": "nogil", "nogil": "nogil", "from_python": "python"}.get(group, group)
        if info["groups"][process]["status"] != "ok":
            continue
        for c in cases:
            for path in c.paths:
                b = suite.get(f"{process}/{c.id}/{path}")
                assert b is not None and b.get_metadata()["layer"] == c.layer, (group, c.id, path)
                # Its checks ran (before it was timed) and travel with its values.
                assert set(c.checks) <= set(b.get_metadata()), (group, c.id, path)


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


def test_missing_peers_are_reported_as_missing_never_zero(run, bench_modules):
    stdout, out, _, info = run
    import report

    res = report.load(
        str(out / "bench-sim.json")
    )  # the report's view of the run, as plot.py reads it
    for peer in MISSING_ON_SIM:
        rows = [r for r in res["cost"] if r["group"] == f"peer:{peer}"]
        assert rows, f"{peer} has no rows"
        for r in rows:
            assert r["ns"] is None and r["status"] == "missing: simulated driver", r
    assert "missing (simulated driver): cuda_core, cupy, numba, torch" in stdout
    by_id = {t["id"]: t for t in info["targets"]}
    for tid in ("cupy_vs_python", "cuda_core_vs_python", "torch_vs_python"):
        assert by_id[tid]["value"] is None and by_id[tid]["met"] is None
        assert "missing" in by_id[tid]["detail"]


def test_a_peer_not_installed_is_missing_not_an_error(
    bench_modules, build_dir, run, tmp_path, monkeypatch
):
    # Its set-up raises ImportError: the group reports it missing, with the import's words.
    monkeypatch.setattr(sys, "path", list(sys.path))  # run_all puts bench/ on it
    import run_all

    peer = next((p for p in MISSING_ON_SIM if not importlib.util.find_spec(p)), None)
    if peer is None:
        pytest.skip("every peer is installed here")
    out = str(tmp_path / "peer.json")
    cmd = [sys.executable, os.path.join(BENCH, "python_group.py"), f"peer:{peer}", "--sim"]
    status = run_all.spawn(cmd + ["--build-dir", str(build_dir), "--result", out], out, 120)
    assert status == {"status": f"missing: No module named '{peer}'"}
    assert not os.path.exists(out)


def test_thread_scaling_ran_at_every_count(run):
    _, _, suite, _ = run
    for kind in THREAD_KINDS:
        for t in (1, 2, 4, 8, 16):
            md = suite[f"threads/{kind}/{t}"].get_metadata()
            assert md["threads"] == md["team"] == md["inner_loops"] == t, md
    for kind in ("guard.fast", "driver.pushpop"):  # the main thread, outside OpenMP
        assert suite[f"threads/{kind}/main"].get_metadata()["openmp"] == "no"
    assert len([n for n in suite if n.startswith("threads/")]) == 5 * 5 + 2


def test_memory_run_balanced(run):
    _, _, _, info = run
    mem = info["memory"]
    assert [r["cycles"] for r in mem["runs"]] == [100_000, 100_000, 10_000]
    for r in mem["runs"]:
        assert r["rss_kib_before"] > 0 and r["rss_kib_after"] > 0 and r["restored"], r
    assert (
        mem["balanced"] and mem["retains_after_close"] == [0, 0] and mem["retains_during"] == [1, 1]
    )
    assert mem["open_entries_after"] == 0 and mem["primary_active_after_close"] == [False, False]


def test_targets_and_breakdown_computed(run):
    _, _, _, res = run
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
    stdout, out, _, res = run
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
    assert (
        res["packages"]["cyctx"] and res["packages"]["cuda-bindings"] and res["packages"]["pyperf"]
    )
    assert res["gpu"]["driver"] == "simulated"
    assert f"Python {sys.version.split()[0]}," in table and "2 device(s)" in table
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


FREE_THREADING_ROWS = (
    "with guard",
    "with cyctx.device(0)",
    "nogil enter+exit",
    "with guard, 16 Python threads",
    "nogil, 16 OpenMP threads",
)


def test_the_free_threading_costs_run_and_say_which_interpreter(build_dir):
    # bench/free_threading.py (docs/evidence.md, "Free-threading"): its own process, one round;
    # every row timed, and the interpreter and its GIL named (no pyperf needed).
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "free_threading.py"),
            "--sim",
            "--rounds",
            "1",
            "--build-dir",
            str(build_dir / "free-threading"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    version = "{}.{}.".format(*sys.version_info[:2])
    assert out["driver"] == "simulated" and out["python"].startswith(version)
    assert out["gil"] == (sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True)
    assert list(out["ns"]) == list(FREE_THREADING_ROWS) and all(v > 0 for v in out["ns"].values())
