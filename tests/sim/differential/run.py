#!/usr/bin/env python3
"""Record the differential scenarios against a driver, or compare two records.

    python tests/sim/differential/run.py record --driver real --out real.json
    python tests/sim/differential/run.py record --driver sim --out sim.json \
        [--sim-library PATH] [--devices N]
    python tests/sim/differential/run.py compare real.json sim.json \
        [--known-differences tests/sim/differential/known_differences.json]
    python tests/sim/differential/run.py list

Each scenario runs in its own fresh interpreter (``sys.executable``): primary-context
refcounts, ``cuInit`` and the thread's context stack are process-global, so a scenario must
not inherit another's leftovers. With ``--driver sim`` that interpreter loads the simulated
``libcuda.so.1`` with ``ctypes.CDLL(path, RTLD_GLOBAL)`` before cuda.bindings resolves the
driver, and ``CYCTX_SIM_DEVICES`` sets its device count; afterwards it checks in
``/proc/self/maps`` that the library it meant to test is the only libcuda mapped (a record
of the wrong driver is worse than none).

The known-differences file is a JSON object ``{"scenario_name": "why it may differ"}``
(keys starting with ``_`` are comments) or plain ``scenario_name: why`` lines. A listed scenario
that differs is reported as ``known`` and does not fail the comparison; a listed one that no longer differs is reported
so the entry can be dropped.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

# Keys of an event that the comparer ignores: "info" holds machine-specific data (names,
# memory sizes, driver version), "tag" is a human comment that may be reworded after a
# real record was committed.
IGNORED_KEYS = frozenset({"info", "tag"})

DEFAULT_TIMEOUT = 120.0


# --- Locating the simulated driver ------------------------------------------------------------


def find_sim_library(explicit: str | None = None) -> str | None:
    """--sim-library, else $CYCTX_SIM_LIBRARY, else cyctx.testing.sim_library_path()."""
    if explicit:
        return explicit
    env = os.environ.get("CYCTX_SIM_LIBRARY")
    if env:
        return env
    try:
        from cyctx.testing import sim_library_path  # the package's own build of the sim

        return str(sim_library_path())
    except Exception:
        pass
    # An in-place build (setup.py build_ext --inplace) without an importable cyctx: the
    # same default location cyctx.testing uses.
    inplace = HERE.parent.parent / "src" / "cyctx" / "_sim" / "libcuda.so.1"
    return str(inplace) if inplace.is_file() else None


# --- The per-scenario child process -----------------------------------------------------------


def _loaded_libcuda() -> list[str]:
    """Real paths of every libcuda mapped into this process."""
    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    p = parts[5].strip()
                    if os.path.basename(p).startswith("libcuda.so"):
                        paths.add(os.path.realpath(p))
    except OSError:
        pass
    return sorted(paths)


def _is_simulated(path: str) -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL(path), "cyctxsim_is_simulated")
    except OSError:
        return False


def _collect_meta(driver, kind: str) -> dict:
    import cuda.bindings

    meta = {
        "driver_kind": kind,
        "python": platform.python_version(),
        "cuda_bindings": getattr(cuda.bindings, "__version__", "?"),
        "platform": platform.platform(),
        "machine": platform.node(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    err, ver = driver.cuDriverGetVersion()
    meta["driver_version"] = int(ver) if int(err) == 0 else f"error {err.name}"
    err = driver.cuInit(0)[0]
    if int(err) != 0:
        meta["init_error"] = err.name
        meta["device_count"] = 0
        return meta
    err, n = driver.cuDeviceGetCount()
    meta["device_count"] = int(n) if int(err) == 0 else 0
    names, modes = [], []
    mode_attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
    for k in range(meta["device_count"]):
        err, name = driver.cuDeviceGetName(256, k)
        names.append(name.split(b"\0", 1)[0].decode() if int(err) == 0 else err.name)
        err, mode = driver.cuDeviceGetAttribute(mode_attr, k)
        modes.append(int(mode) if int(err) == 0 else None)
    meta["gpu_names"] = names
    meta["compute_modes"] = modes  # 0 = default (shared); others forbid parallel scenarios
    return meta


def child_main(scenario: str, result_path: str, sim_library: str | None) -> int:
    """Entry point of one scenario's interpreter; writes its result JSON to result_path."""
    import faulthandler

    # A driver crash kills the process before the result is written: the Python traceback
    # on stderr then says which call it was.
    faulthandler.enable()
    if sim_library:
        import ctypes

        # Loaded first, with its soname libcuda.so.1 and RTLD_GLOBAL, so cuda.bindings'
        # dlopen("libcuda.so.1") finds this one instead of searching the system.
        ctypes.CDLL(os.path.abspath(sim_library), mode=os.RTLD_GLOBAL)
    import scenarios
    from cuda.bindings import driver

    kind = "sim" if sim_library else "real"
    if scenario == "_meta":
        out = {"meta": _collect_meta(driver, kind)}
    else:
        out = scenarios.run_scenario(scenario, driver)
    loaded = _loaded_libcuda()
    out["libcuda"] = loaded
    if sim_library:
        want = os.path.realpath(sim_library)
        if loaded and loaded != [want]:
            out["error"] = f"expected only the simulated driver {want} mapped, found {loaded}"
    else:
        sims = [p for p in loaded if _is_simulated(p)]
        if sims:
            out["error"] = f"--driver real, but a simulated libcuda is mapped: {sims}"
    with open(result_path, "w") as f:
        json.dump(out, f)
    return 0


def _run_child(scenario: str, sim_library: str | None, devices: int, timeout: float) -> dict:
    """Run one scenario in a fresh interpreter; always returns a result dict."""
    env = dict(os.environ)
    env.pop("CYCTX_SIM_DEVICES", None)
    if sim_library:
        env["CYCTX_SIM_DEVICES"] = str(devices)
    # Each child's own PYTHONPATH is left alone: cuda.bindings comes from the interpreter.
    fd, result_path = tempfile.mkstemp(prefix=f"diff-{scenario}-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", scenario, result_path]
    if sim_library:
        cmd += ["--sim-library", os.path.abspath(sim_library)]
    # A new session so a timeout can kill the scenario and any fork child it left.
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=str(HERE),
    )
    out = None
    try:
        try:
            stderr = proc.communicate(timeout=timeout)[1]
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stderr, why = proc.communicate()[1], f"timed out after {timeout:.0f} s"
        else:
            with contextlib.suppress(OSError, ValueError), open(result_path) as f:
                out = json.loads(f.read() or "null")
            rc = proc.returncode
            how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
            why = f"scenario process died ({how}) without a result"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(result_path)
    tail = stderr.decode(errors="replace")[-4000:]
    if out is None:
        return {"events": [], "error": f"{why}\n{tail}", "skipped": None}
    if proc.returncode != 0 and not out.get("error"):
        out["error"] = f"exit code {proc.returncode}\n{tail}"
    return out


# --- record -----------------------------------------------------------------------------------


def scenario_names() -> list[str]:
    import scenarios

    return list(scenarios.SCENARIOS)


def record(
    driver: str,
    sim_library: str | None = None,
    devices: int = 1,
    jobs: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    only: list[str] | None = None,
    progress=None,
) -> dict:
    """Run every scenario (or ``only``) in its own process; return the record dict."""
    if driver == "sim":
        if not sim_library:
            raise ValueError(
                "--driver sim needs the simulated library: --sim-library PATH, "
                "$CYCTX_SIM_LIBRARY or cyctx.testing.sim_library_path()"
            )
        if not os.path.exists(sim_library):
            raise FileNotFoundError(f"simulated driver not found: {sim_library}")
    else:
        sim_library = None
    names = scenario_names()
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"unknown scenario(s): {', '.join(unknown)}")
        names = [n for n in names if n in only]
    meta_res = _run_child("_meta", sim_library, devices, timeout)
    meta = meta_res.get("meta")
    if not meta or meta_res.get("error") or meta.get("init_error"):
        # No usable driver (no libcuda, cuInit failing, the wrong library mapped): a record
        # of 45 identical failures would only mislead a later comparison.
        why = meta_res.get("error") or (meta or {}).get("init_error") or "no metadata"
        raise RuntimeError(
            f"the {driver} driver is not usable here: {why.strip().splitlines()[-1]}"
        )
    meta["libcuda"] = meta_res.get("libcuda")
    if not jobs:
        # Scenario processes mostly wait on interpreter start-up and cuInit; a few in
        # parallel keep a 2-core CI machine busy without starving the 8-thread scenario.
        # A GPU in an exclusive compute mode admits one context at a time: one by one.
        exclusive = any(m not in (0, None) for m in meta.get("compute_modes", []))
        jobs = 1 if exclusive else max(2, min(8, os.cpu_count() or 2))
    meta["jobs"] = jobs
    if sim_library:
        meta["sim_library"] = os.path.abspath(sim_library)
        with open(sim_library, "rb") as f:
            meta["sim_library_sha256"] = hashlib.sha256(f.read()).hexdigest()
        meta["sim_devices"] = devices
    results: dict[str, dict] = {}
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(_run_child, n, sim_library, devices, timeout): n for n in names}
        for fut in cf.as_completed(futs):
            n = futs[fut]
            res = fut.result()
            results[n] = {
                "events": res.get("events", []),
                "error": res.get("error"),
                "skipped": res.get("skipped"),
            }
            if progress:
                progress(n, results[n])
    return {"meta": meta, "scenarios": {n: results[n] for n in names}}


# --- compare ----------------------------------------------------------------------------------


def strip_event(ev):
    """The comparable part of an event (drops IGNORED_KEYS)."""
    return {k: v for k, v in ev.items() if k not in IGNORED_KEYS}


def first_difference(real_events: list, sim_events: list):
    """Index and both sides of the first differing event, or None when they agree."""
    for i in range(max(len(real_events), len(sim_events))):
        a = real_events[i] if i < len(real_events) else None
        b = sim_events[i] if i < len(sim_events) else None
        if (a is None or b is None) or strip_event(a) != strip_event(b):
            return i, a, b
    return None


def load_known(path: str | os.PathLike | None) -> dict[str, str]:
    """Read the known-differences file; a missing file means none.

    Either a JSON object ``{"scenario": "justification", "_comment": "..."}`` or, for
    people who would rather not write JSON, plain lines ``scenario: justification`` with
    ``#`` comments and blank lines ignored. Every entry needs a non-empty justification.
    """
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, why = line.partition(":")
            if not sep:
                raise ValueError(f"{path}:{n}: expected 'scenario: justification'") from None
            data[name.strip()] = why.strip()
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object scenario -> justification")
    known = {}
    for k, v in data.items():
        if k.startswith("_"):
            continue
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"{path}: {k!r} needs a non-empty justification string")
        known[k] = v
    return known


def compare(real: dict, sim: dict, known: dict[str, str] | None = None) -> list[dict]:
    """Compare two records; one row per scenario.

    ``status`` is one of: same, differs, known (differs but justified), error (a scenario
    raised, crashed or ran against the wrong library), skipped (the real run had too few
    devices), missing (in the real record but not the simulated one), unrecorded (no real
    record for it yet: nothing to compare). ``fails`` says whether it fails the comparison.
    """
    known = known or {}
    rs, ss = real.get("scenarios", {}), sim.get("scenarios", {})
    order = list(rs) + [n for n in ss if n not in rs]
    rows = []
    for name in order:
        a, b = rs.get(name), ss.get(name)
        row = {
            "scenario": name,
            "status": "same",
            "detail": None,
            "index": None,
            "real": None,
            "sim": None,
            "justification": known.get(name),
        }
        if a is None:
            row["status"] = "unrecorded"
        elif b is None:
            row["status"] = "missing"
            row["detail"] = "not in the simulated record"
        elif a.get("skipped"):
            row["status"] = "skipped"
            row["detail"] = a["skipped"]
        elif a.get("error") or b.get("error"):
            row["status"] = "error"
            side = "real" if a.get("error") else "sim"
            row["detail"] = (
                f"{side}: " + (a.get("error") or b.get("error")).strip().splitlines()[-1]
            )
            row["real"], row["sim"] = a.get("error"), b.get("error")
        elif b.get("skipped"):
            row["status"] = "differs"
            row["detail"] = f"sim skipped it ({b['skipped']}) but the real run did not"
        else:
            diff = first_difference(a.get("events", []), b.get("events", []))
            if diff is not None:
                row["status"] = "differs"
                row["index"], row["real"], row["sim"] = diff
        if row["status"] in ("differs", "error", "missing") and name in known:
            row["status"] = "known"
        row["fails"] = row["status"] in ("differs", "error", "missing")
        if row["status"] == "same" and name in known:
            row["detail"] = "listed in known differences but agrees: drop the entry"
        rows.append(row)
    return rows


def format_event(ev: dict) -> str:
    """One event as a short line: [thread] call(args) -> rc out  # tag."""
    head = f"[{ev['thread']}] " if "thread" in ev else ""
    if "call" in ev:
        args = ", ".join(json.dumps(x) for x in ev.get("args", []))
        res = ev.get("rc") or f"raised {ev.get('exc')}"
        res = res.replace("CUDA_ERROR_", "E_")
        if "out" in ev:
            res += f" {json.dumps(ev['out'])}"
        line = f"{head}{ev['call']}({args}) -> {res}"
    else:
        line = f"{head}note {ev.get('note')}: {json.dumps(ev.get('value', ev.get('info')))}"
    if "info" in ev and "call" in ev:
        line += f"   info={json.dumps(ev['info'])}"
    if ev.get("tag"):
        line += f"   # {ev['tag']}"
    return line


def _fmt_event(ev) -> str:
    if ev is None:
        return "(no event)"
    return json.dumps(ev, sort_keys=False)


def format_table(
    rows: list[dict], real_meta: dict | None = None, sim_meta: dict | None = None
) -> str:
    lines = []
    if real_meta and sim_meta:
        rc, sc = real_meta.get("device_count"), sim_meta.get("device_count")
        lines.append(
            f"real: {real_meta.get('gpu_names')} driver {real_meta.get('driver_version')}"
            f" bindings {real_meta.get('cuda_bindings')} devices {rc}"
        )
        lines.append(
            f"sim:  {sim_meta.get('sim_library')} bindings {sim_meta.get('cuda_bindings')}"
            f" devices {sc}"
        )
        if rc != sc:
            lines.append(
                f"WARNING: device counts differ (real {rc}, sim {sc}): record the sim "
                f"with --devices {rc}"
            )
    width = max([len(r["scenario"]) for r in rows] + [8])
    for r in rows:
        status = r["status"].upper() if r["fails"] else r["status"]
        line = f"{r['scenario']:<{width}}  {status}"
        if r["status"] == "skipped":
            line += f"  ({r['detail']})"
        lines.append(line)
        if r["status"] in ("differs", "known") and r["index"] is not None:
            lines.append(f"    first difference at event {r['index']}:")
            lines.append(f"      real: {_fmt_event(r['real'])}")
            lines.append(f"      sim:  {_fmt_event(r['sim'])}")
        elif r["detail"] and r["status"] != "skipped":
            lines.append(f"    {r['detail']}")
        if r["status"] == "known":
            lines.append(f"    known difference: {r['justification']}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    failing = sum(r["fails"] for r in rows)
    lines.append(
        "summary: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; {failing} failing"
    )
    return "\n".join(lines)


# --- CLI --------------------------------------------------------------------------------------


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        p = argparse.ArgumentParser(prog="run.py _child")
        p.add_argument("scenario")
        p.add_argument("result")
        p.add_argument("--sim-library")
        a = p.parse_args(argv[1:])
        return child_main(a.scenario, a.result, a.sim_library)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("record", help="run every scenario against one driver")
    pr.add_argument("--driver", choices=("real", "sim"), required=True)
    pr.add_argument("--out", required=True, help="JSON file to write")
    pr.add_argument(
        "--sim-library",
        help="simulated libcuda.so.1 (default: $CYCTX_SIM_LIBRARY, "
        "then cyctx.testing.sim_library_path())",
    )
    pr.add_argument(
        "--devices",
        type=int,
        default=1,
        help="simulated device count (CYCTX_SIM_DEVICES); match the real record's",
    )
    pr.add_argument("--jobs", type=int, default=None, help="scenario processes at a time")
    pr.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per scenario")
    pr.add_argument("--only", nargs="+", help="run only these scenarios")
    pc = sub.add_parser("compare", help="compare a real and a simulated record")
    pc.add_argument("real")
    pc.add_argument("sim")
    pc.add_argument(
        "--known-differences", default=None, help="JSON object scenario -> justification"
    )
    sub.add_parser("list", help="list the scenarios")
    ps = sub.add_parser("show", help="print a record's events, one line each")
    ps.add_argument("record")
    ps.add_argument("scenarios", nargs="*", help="only these (default: all)")
    a = p.parse_args(argv)

    if a.cmd == "list":
        print("\n".join(scenario_names()))
        return 0
    if a.cmd == "show":
        with open(a.record) as f:
            data = json.load(f)
        print(json.dumps(data.get("meta"), sort_keys=True))
        for name, s in data["scenarios"].items():
            if a.scenarios and name not in a.scenarios:
                continue
            print(f"== {name}" + (f"  SKIPPED {s['skipped']}" if s.get("skipped") else ""))
            for ev in s["events"]:
                print("   " + format_event(ev))
            if s.get("error"):
                print("   ERROR " + s["error"].strip().replace("\n", "\n   "))
        return 0
    if a.cmd == "record":
        sim_lib = find_sim_library(a.sim_library) if a.driver == "sim" else None

        def progress(name, res):
            state = (
                "skipped"
                if res["skipped"]
                else "ERROR"
                if res["error"]
                else f"{len(res['events'])} events"
            )
            print(f"  {name}: {state}", file=sys.stderr)

        try:
            data = record(a.driver, sim_lib, a.devices, a.jobs, a.timeout, a.only, progress)
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        with open(a.out, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        errors = [n for n, s in data["scenarios"].items() if s["error"]]
        print(
            f"wrote {a.out}: {len(data['scenarios'])} scenarios, {len(errors)} with errors"
            + (f" ({', '.join(errors)})" if errors else "")
        )
        return 0
    # compare
    with open(a.real) as f:
        real = json.load(f)
    with open(a.sim) as f:
        sim = json.load(f)
    known = load_known(a.known_differences)
    rows = compare(real, sim, known)
    print(format_table(rows, real.get("meta"), sim.get("meta")))
    return 1 if any(r["fails"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
