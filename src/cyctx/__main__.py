"""Command line: ``cyctx doctor [--json | --demo] [--simulate] [--cudart PATH]`` (the same as
``python -m cyctx doctor ...``), ``cyctx trace [--json FILE] [--simulate [N]] SCRIPT [ARGS]``
(``_trace_cli``) and ``cyctx --version``.

Exit status of ``doctor``: 0 nothing wrong (warnings allowed), 1 a problem was found,
2 bad command line, 3 no usable NVIDIA driver or GPU. ``--demo``: 0 when the guarded steps
worked, 1 when they did not, 3 when it cannot run here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cyctx._compat import IncompatibleBindingsError

_SIM_RUNTIMES = {"11.8": 11080, "13.0": 13000}


def _version() -> str:
    from cyctx import BUILD_INFO, __version__
    from cyctx._compat import bindings_problem, installed_bindings_version

    line = (
        f"cyctx {__version__} (compiled with cuda-bindings {BUILD_INFO['cuda_bindings']} types, "
        f"Cython {BUILD_INFO['cython']}, Python {BUILD_INFO['python']}; running with "
        f"cuda-bindings {installed_bindings_version()}, Python {sys.version.split()[0]})"
    )
    problem = bindings_problem()
    return line if problem is None else f"{line}\ncuda-bindings is not usable: {problem}"


class _Version(argparse.Action):
    # argparse's "version" action takes the text when the parser is built: this one makes it
    # only when asked (it imports cuda.bindings to say whether it is usable).
    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(_version())
        parser.exit()


def _parser(prog: str = "python -m cyctx") -> argparse.ArgumentParser:
    # Raw text: the --version line is printed as it is, not wrapped.
    p = argparse.ArgumentParser(
        prog=prog,
        description="cyctx command line tools.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-V", "--version", action=_Version, help="show cyctx's version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    p.set_defaults(subparsers={})
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
    p.get_default("subparsers")["doctor"] = doc
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
    # No defaults here: given without --demo (or --simulate), they are refused, not ignored.
    doc.add_argument("--device", type=int, metavar="N", help="with --demo: its device (default 0)")
    doc.add_argument(
        "--sim-runtime",
        choices=sorted(_SIM_RUNTIMES),
        help="with --simulate --demo: the runtime version the stand-in models (default 11.8)",
    )
    tr = sub.add_parser(
        "trace",
        help="run a Python script and report every context change it made, and where",
        description=(
            "Run SCRIPT with ARGS as `python SCRIPT ARGS` would (-m MODULE as `python -m "
            "MODULE`), recording every CUDA context "
            "change of the process (docs/tracing.md), then print the trace to stderr, however "
            "the script ends. Options go before SCRIPT; everything after it is the script's. "
            "Exit status: the script's; 2 bad command line; 3 when the simulated driver cannot "
            "be used."
        ),
        allow_abbrev=False,  # an option's value is told from SCRIPT by its exact name
    )
    from cyctx import _trace_cli

    _trace_cli.add_options(tr)
    p.get_default("subparsers")["trace"] = tr
    return p


def main(argv: list[str] | None = None, prog: str = "python -m cyctx") -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    # Importing the doctor loads no driver (its first driver call does), so --simulate below
    # still comes first.
    from cyctx._compat import bindings_problem

    parser = _parser(prog)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["trace"]:
        # The script's arguments are its own, verbatim: only what comes before SCRIPT is
        # parsed (argparse would take the script's `--` and options for its own).
        from cyctx import _trace_cli

        tr = parser.get_default("subparsers")["trace"]
        options, script = _trace_cli.split(argv[1:])
        args, extra = parser.parse_known_args(
            ["trace", *options, *(["--", script[0]] if script else [])]
        )
        if extra:  # with the trace's usage, as below
            tr.error(f"unrecognized arguments: {' '.join(extra)}")
        return _trace_cli.run(tr, args, script[1:])
    # A subcommand's bad flag gets that subcommand's usage (argparse hands unknown arguments
    # up to the top-level parser, whose usage does not show the subcommand's flags).
    args, extra = parser.parse_known_args(argv)
    command = parser.get_default("subparsers").get(args.command)
    if extra:
        (command or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command != "doctor":
        parser.print_help()
        return 2
    doc = parser.get_default("subparsers")["doctor"]
    if args.json and args.demo:
        doc.error("--json is for the report, not --demo")
    if args.cudart is not None and args.simulate:
        doc.error(
            "--cudart needs the real driver; with --simulate the demo uses a stand-in "
            "runtime (choose its version with --sim-runtime)"
        )
    if args.device is not None and not args.demo:
        doc.error("--device N is the demo's device: use it with --demo")
    if args.sim_runtime is not None and not (args.demo and args.simulate):
        doc.error("--sim-runtime is the stand-in runtime of --simulate --demo: use it with both")
    if args.cudart is not None and not os.path.isfile(args.cudart):
        doc.error(f"--cudart {args.cudart}: no such file")
    if args.device is not None and args.device < 0:
        doc.error("--device must be >= 0")
    args.device = args.device or 0
    args.sim_runtime = args.sim_runtime or "11.8"

    problem = bindings_problem()
    if problem is not None:
        return _bindings_unusable(problem, args)
    from cyctx import _doctor

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


def _bindings_unusable(problem: IncompatibleBindingsError, args: argparse.Namespace) -> int:
    """The doctor's report when cuda-bindings cannot be used: a finding with the fix; the demo
    cannot run at all (exit status 3, as without a driver)."""
    from cyctx import __version__
    from cyctx._compat import installed_bindings_version
    from cyctx._doctor.bindings import bindings_report
    from cyctx._doctor.model import EXIT_NO_CUDA
    from cyctx._doctor.render import use_colour

    what = str(problem)
    if problem.fix and what.endswith(problem.fix):
        what = what[: -len(problem.fix)].rstrip(": ")
    report = bindings_report(what, problem.fix, installed_bindings_version(), __version__)
    if args.json:
        print(report.to_json())
    else:
        print(report.render(colour=use_colour(sys.stdout), cli=True))
    if args.demo:
        print("\nThe demo needs a usable cuda-bindings too: fix the above first.")
        return EXIT_NO_CUDA
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
