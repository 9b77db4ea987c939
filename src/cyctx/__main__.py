"""Command line: ``cyctx doctor [--json | --demo] [--simulate] [--cudart PATH]`` (the same as
``python -m cyctx doctor ...``), ``cyctx trace [--json FILE] [--simulate] SCRIPT [ARGS]`` and
``cyctx --version``.

Exit status of ``doctor``: 0 nothing wrong (warnings allowed), 1 a problem was found,
2 bad command line, 3 no usable NVIDIA driver or GPU. ``--demo``: 0 when the guarded steps
worked, 1 when they did not, 3 when it cannot run here.
"""

from __future__ import annotations

import argparse
import os
import sys

_SIM_RUNTIMES = {"11.8": 11080, "13.0": 13000}


def _version() -> str:
    from cyctx import BUILD_INFO, __version__
    from cyctx._compat import installed_bindings_version

    return (
        f"cyctx {__version__} (compiled with cuda-bindings {BUILD_INFO['cuda_bindings']} types, "
        f"Cython {BUILD_INFO['cython']}, Python {BUILD_INFO['python']}; running with "
        f"cuda-bindings {installed_bindings_version()}, Python {sys.version.split()[0]})"
    )


def _parser(prog: str = "python -m cyctx") -> argparse.ArgumentParser:
    # Raw text: the --version line is printed as it is, not wrapped.
    p = argparse.ArgumentParser(
        prog=prog,
        description="cyctx command line tools.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    doc = sub.add_parser(
        "doctor",
        help="report the CUDA driver, runtime and context state, and explain what is wrong",
        description=(
            "Report the CUDA driver, runtime, devices, primary contexts and this thread's current "
            "context, and explain in plain words (with the fix) what is wrong. Changes no state. "
            "Exit status: 0 nothing wrong, 1 a problem found, 2 bad command line, 3 no usable "
            "driver or GPU. With --demo: 0 the guarded steps worked, 1 they did not, 2 bad "
            "command line, 3 it cannot run here."
        ),
    )
    doc.add_argument(
        "--json", action="store_true", help="print the report as JSON (schema cyctx.diagnosis/2)"
    )
    doc.add_argument(
        "--demo",
        action="store_true",
        help="reproduce the classic failure step by step, then the same steps inside a ContextGuard",
    )
    doc.add_argument(
        "--simulate",
        action="store_true",
        help="run on cyctx's simulated driver (no GPU needed); every screen says so",
    )
    doc.add_argument(
        "--cudart",
        metavar="PATH",
        help="the libcudart to use (e.g. libcudart.so.11.0 of the nvidia-cuda-runtime-cu11 "
        "wheel); default: one already loaded, else cuda-pathfinder's",
    )
    doc.add_argument(
        "--device", type=int, default=0, metavar="N", help="device of the demo (default 0)"
    )
    doc.add_argument(
        "--sim-runtime",
        choices=sorted(_SIM_RUNTIMES),
        default="11.8",
        help="with --simulate --demo: the runtime version the stand-in models (default 11.8)",
    )
    tr = sub.add_parser(
        "trace",
        help="run a Python script and report every context change it made, and where",
        description=(
            "Run SCRIPT with ARGS as `python SCRIPT ARGS` would, recording every CUDA context "
            "change of the process (docs/tracing.md), then print the trace to stderr. Exit "
            "status: the script's; 3 when the simulated driver cannot be used."
        ),
    )
    tr.add_argument(
        "--json", metavar="FILE", help="also write the trace as JSON (schema cyctx.trace/1)"
    )
    tr.add_argument(
        "--simulate", action="store_true", help="run the script on cyctx's simulated driver"
    )
    tr.add_argument("--quiet", action="store_true", help="print no report (with --json)")
    tr.add_argument("script", metavar="SCRIPT")
    tr.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return p


def _trace(args: argparse.Namespace) -> int:
    import runpy

    if not os.path.isfile(args.script):
        print(f"cyctx trace: {args.script}: no such file", file=sys.stderr)
        return 2
    if args.simulate:
        from cyctx.testing import use_simulated_driver

        try:
            use_simulated_driver(device_count=2)
        except (RuntimeError, OSError) as exc:
            print(f"cyctx trace: cannot use the simulated driver: {exc}", file=sys.stderr)
            return 3
    import cyctx

    sys.argv = [args.script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    status = 0
    t = cyctx.trace()
    with t:
        try:
            runpy.run_path(args.script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
    if t.reason is None:
        if not args.quiet:
            print(t.report(), file=sys.stderr)
        if args.json:
            import json

            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(t.to_json(), f, indent=1)
    return status


def main(argv: list[str] | None = None, prog: str = "python -m cyctx") -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    # Importing the doctor loads no driver (its first driver call does), so --simulate below
    # still comes first.
    from cyctx._compat import load_doctor

    _doctor = load_doctor()

    parser = _parser(prog)
    args = parser.parse_args(argv)
    if args.command == "trace":
        return _trace(args)
    if args.command != "doctor":
        parser.print_help()
        return _doctor.EXIT_USAGE
    if args.json and args.demo:
        parser.error("--json is for the report, not --demo")
    if args.cudart is not None and args.simulate:
        parser.error(
            "--cudart needs the real driver; with --simulate the demo uses a stand-in "
            "runtime (choose its version with --sim-runtime)"
        )
    if args.cudart is not None and not os.path.isfile(args.cudart):
        parser.error(f"--cudart {args.cudart}: no such file")
    if args.device < 0:
        parser.error("--device must be >= 0")

    if args.simulate:
        # Before any driver call: the simulated libcuda.so.1 must be the first one loaded.
        from cyctx.testing import use_simulated_driver

        try:
            use_simulated_driver(device_count=2)
        except (RuntimeError, OSError) as exc:  # not found, not a library, not the simulator
            print(f"cyctx doctor: cannot use the simulated driver: {exc}", file=sys.stderr)
            return _doctor.EXIT_NO_CUDA

    colour = _doctor.use_colour(sys.stdout)
    if args.demo:
        return _demo(args, colour)
    report = _doctor.diagnose(cudart=args.cudart)
    if args.json:
        print(report.to_json())
    else:
        print(report.render(colour=colour, cli=True))
    return report.exit_status


def _demo(args: argparse.Namespace, colour: bool) -> int:
    from cyctx import _doctor

    rt: _doctor.Runtime
    if args.simulate:
        rt = _doctor.StandInRuntime(_SIM_RUNTIMES[args.sim_runtime])
    else:
        # The demo needs what the report needs: a driver with a device; say why not if not.
        report = _doctor.diagnose(cudart=False)
        if report.driver_error is not None:  # no driver, no device, forked child...
            print(report.render(colour=colour, cli=True))
            print(
                "\nThe demo needs a GPU; `cyctx doctor --demo --simulate` runs it on "
                "cyctx's simulated driver."
            )
            return _doctor.EXIT_NO_CUDA
        cudart, why = _doctor.load_cudart(args.cudart)
        if cudart is None:
            print(
                f"cyctx doctor --demo: {why}. Install the CUDA runtime "
                f"(pip install nvidia-cuda-runtime) or pass --cudart PATH.",
                file=sys.stderr,
            )
            return _doctor.EXIT_NO_CUDA
        rt = cudart
    if args.device >= _doctor.device_count():
        print(
            f"cyctx doctor --demo: no device {args.device} (the driver reports {_doctor.device_count()})",
            file=sys.stderr,
        )
        return _doctor.EXIT_USAGE
    return _doctor.run_demo(rt, device=args.device, colour=colour)


def run(prog: str = "cyctx") -> None:
    """Entry point of the ``cyctx`` console script (and of ``python -m cyctx``)."""
    try:
        status = main(prog=prog)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: stop quietly (Python's documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)


if __name__ == "__main__":
    run("python -m cyctx")
