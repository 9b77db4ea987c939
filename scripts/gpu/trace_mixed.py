"""The trace of one process mixing torch, CuPy, cuda.core and cyctx, for docs/tracing.md ("A
trace on the H200"): prints cyctx.trace()'s report of the script below, each context change
with its line and library, and writes its JSON.

    python scripts/gpu/trace_mixed.py [--json FILE] [--fill-docs docs/tracing.md]

``--fill-docs`` puts the report (the script and the trace) between the page's
``<!-- trace-mixed:begin -->`` and ``<!-- trace-mixed:end -->`` lines. ``--simulate`` runs the
cuda.bindings and cyctx lines alone on cyctx's simulated driver (the script's own test: no GPU,
no torch, CuPy or cuda.core).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

# The workload, one statement per line, so that each traced line is the one shown.
WORKLOAD = """\
import threading
import cyctx
from cuda.bindings import driver as d
torch = cupy = Device = None
if not SIMULATE:
    import cupy
    import torch
    from cuda.core import Device

def main():
    d.cuInit(0)
    if torch is not None:
        torch.cuda.set_device(0)                  # torch: the runtime's cudaSetDevice
        x = torch.ones(4, device="cuda")
    d.cuCtxSetCurrent(None)                       # cuda.bindings, directly
    if cupy is not None:
        with cupy.cuda.Device(0):                 # CuPy's device context
            cupy.cuda.runtime.setDevice(0)
        d.cuCtxSetCurrent(None)
        Device(0).set_current()                   # cuda.core (through cuda-bindings' cydriver)
        d.cuCtxSetCurrent(None)
    with cyctx.ContextGuard(0):                   # a cyctx guard
        pass
    err, p = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxSetCurrent(p)                          # someone leaves device 0 current
    threading.Thread(target=worker, name="worker", daemon=True).start()
    done.wait()                                   # (alive when the trace stops: named)
    d.cuCtxSetCurrent(None)
    d.cuDevicePrimaryCtxRelease(0)

def worker():
    if torch is not None:
        torch.cuda.set_device(0)                  # another thread: its own current context
    with cyctx.ContextGuard(0):
        pass
    done.set()
    threading.Event().wait()

done = threading.Event()
"""


def run(simulate: bool) -> tuple[object, str]:
    if simulate:
        from cyctx.testing import use_simulated_driver

        use_simulated_driver(1)
    import cyctx

    code = compile(WORKLOAD, "mixed.py", "exec")
    env = {"SIMULATE": simulate, "__name__": "mixed"}
    exec(code, env)  # the workload's imports happen here, before the trace
    with cyctx.trace() as t:
        env["main"]()
    return t, WORKLOAD


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = [f"Python {platform.python_version()}"]
    for dist in ("cyctx", "cuda-bindings", "torch", "cupy-cuda13x", "cupy-cuda12x", "cuda-core"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def fill(page: str, block: str) -> None:
    begin, end = "<!-- trace-mixed:begin -->", "<!-- trace-mixed:end -->"
    text = open(page).read()
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{page}: needs one {begin} line and one {end} line")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    with open(page, "w") as f:
        f.write(f"{head}{begin}\n{block}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--fill-docs", metavar="PAGE")
    ap.add_argument("--simulate", action="store_true")
    args = ap.parse_args(argv)
    t, workload = run(args.simulate)
    if t.reason is not None:  # type: ignore[attr-defined]
        print(f"not tracing: {t.reason}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1
    report = t.report()  # type: ignore[attr-defined]
    block = (
        f"Traced with {versions()}"
        + ("" if args.simulate else " on the machine's GPU")
        + ":\n\n```python\n# mixed.py\n"
        + workload
        + "main()\n```\n\n```text\n"
        + report
        + "\n```"
    )
    print(block)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(t.to_json(), f, indent=1)  # type: ignore[attr-defined]
    if args.fill_docs:
        fill(args.fill_docs, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
