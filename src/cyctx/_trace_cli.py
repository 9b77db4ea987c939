"""``cyctx trace [--json FILE] [--simulate [N]] [--quiet] SCRIPT [ARGS...]``: run SCRIPT as
``python SCRIPT ARGS`` would (``-m MODULE [ARGS...]`` as ``python -m MODULE ARGS``), under
:func:`cyctx.trace`, and report however it ends. docs/tracing.md tells the arguments, the exit
status and what ``--simulate`` gives the processes the script starts.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
import types


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(cyctx trace's options, [SCRIPT, ARGS...]): the options end at the first argument that
    is not one (or after ``--``), or at ``-m``; everything from SCRIPT (or ``-m``) on is the
    script's, untouched."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], argv[i + 1 :]
        if a in ("-", "-m") or not a.startswith("-"):
            return argv[:i], argv[i:]
        if a == "--json":
            i += 1  # its value, whatever it looks like
        elif a == "--simulate" and i + 1 < len(argv) and argv[i + 1].isdigit():
            i += 1  # its count
        i += 1
    return argv, []


def add_options(tr: argparse.ArgumentParser) -> None:
    tr.add_argument(
        "--json", metavar="FILE", help="also write the trace as JSON (schema cyctx.trace/1)"
    )
    tr.add_argument(
        "--simulate",
        nargs="?",
        const=0,
        type=_device_count,
        metavar="N",
        help="run the script on cyctx's simulated driver with N devices (default: the count "
        "the script's own use_simulated_driver asks for, else 2)",
    )
    tr.add_argument("--quiet", action="store_true", help="print no report (with --json)")
    tr.add_argument(
        "script", metavar="SCRIPT", help="the script, or -m MODULE to run as python -m does"
    )
    tr.add_argument("args", nargs="*", metavar="ARGS", help="the script's, as python passes them")


def _device_count(text: str) -> int:
    n = int(text) if text.isdigit() else 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"a number of devices from 1 to 64, not {text!r}")
    return n


def run(tr: argparse.ArgumentParser, args: argparse.Namespace, script_args: list[str]) -> int:
    """Trace the script (``args.script``, ``script_args``); its exit status (or, for a
    KeyboardInterrupt, the process ends by SIGINT)."""
    script = args.script
    if script == "-m":
        if not script_args:
            tr.error("-m: give the module to run, as python -m takes it: -m MODULE [ARGS...]")
        script = f"-m {script_args[0]}"
    elif not os.path.isfile(script):
        tr.error(f"{script}: no such file")
    out = None
    if args.json == "-":
        tr.error(
            "--json -: the script's own output goes to stdout, and the JSON would be mixed "
            "into it; give a file: --json trace.json"
        )
    if args.json is not None:
        path = os.path.abspath(args.json)  # here, not wherever the script goes
        try:
            out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed after the script
        except OSError as exc:
            tr.error(f"--json {args.json}: cannot write {path}: {exc.strerror}")
    if args.simulate is not None:
        from cyctx import testing

        try:
            testing.use_simulated_driver(args.simulate or 2)
        except (RuntimeError, OSError) as exc:
            print(f"cyctx trace: cannot use the simulated driver: {exc}", file=sys.stderr)
            return 3
        why = testing._export_to_children()
        if why is not None:
            print(f"cyctx trace: {why}", file=sys.stderr)
        if not args.simulate:
            testing._count_open_to_the_script()
    import cyctx

    # Python exits by SIGINT after its last atexit handler: registered before the script's,
    # this one runs after them.
    atexit.register(_die_by_sigint_if_interrupted)
    t = cyctx.trace(quiet=True)
    t.start()
    if t.reason is not None:
        print(f"cyctx trace: not tracing: {t.reason}{_hint(args, script)}", file=sys.stderr)
    traced = os.getpid()
    once = threading.RLock()  # RLock: an os._exit from a signal handler while writing them
    written: list[bool] = []

    def write():
        # The report and the JSON: once, by the traced process (a child it forked is the
        # script's, and writes none: it would repeat the parent's events into its file).
        with once:
            if written or os.getpid() != traced:
                return
            written.append(True)
            t.stop()
            if t.reason is None and not args.quiet:
                print(t.report(), file=sys.stderr)
            if out is not None:
                import json

                with out:
                    json.dump(t.to_json(), out, indent=1)

    real_exit = os._exit

    def _exit(n, /):  # the script's os._exit, which runs no atexit handler: written first
        write()
        real_exit(n)

    os._exit = _exit
    if args.script == "-m":
        status, raised = _run_module(script_args[0], script_args[1:])
    else:
        status, raised = _run_script(os.path.abspath(script), [script, *script_args])
    os._exit = real_exit
    t.stop()
    if raised is not None:
        _print_as_python_does(raised)
    write()
    if isinstance(raised, KeyboardInterrupt):
        global _interrupted
        _interrupted = True
    return status


def _hint(args: argparse.Namespace, script: str) -> str:
    from _cyctx_libcuda import loaded_libcuda

    if args.simulate is None and loaded_libcuda() is None:  # no driver loads here
        return (
            f"; `cyctx trace --simulate {script}` runs the script on cyctx's simulated "
            f"driver (no GPU needed)"
        )
    return ""


def _run_script(path: str, argv: list[str]) -> tuple[int, BaseException | None]:
    """Run the file at ``path`` as ``python`` runs its script (``__main__``, its directory
    first on sys.path, ``sys.argv``); what :func:`_as_python_ends` returns."""
    import importlib.machinery

    main = _new_main()
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.realpath(path))

    def body():
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
        exec(code, main.__dict__)

    return _as_python_ends(body)


def _run_module(name: str, args: list[str]) -> tuple[int, BaseException | None]:
    """Run the module ``name`` as ``python -m`` does, with the working directory first on
    sys.path: through runpy's _run_module_as_main, which is what python -m calls (it finds
    the module, or a package's __main__, puts its file at sys.argv[0], runs it in __main__,
    and words a module that cannot run as python does)."""
    import runpy

    _new_main()
    sys.argv = ["-m", *args]
    sys.path[0] = os.getcwd()
    return _as_python_ends(lambda: runpy._run_module_as_main(name))  # type: ignore[attr-defined]


def _new_main() -> types.ModuleType:
    import builtins

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None)
    sys.modules["__main__"] = main  # for good, as under python: pickles find its functions
    return main


def _as_python_ends(body) -> tuple[int, BaseException | None]:
    """``body()``, then its non-daemon threads waited for, as Python does at exit; (exit
    status, the exception that ended it, if one did other than SystemExit)."""
    try:
        body()
        for th in threading.enumerate():
            if th is not threading.current_thread() and not th.daemon:
                th.join()
    except SystemExit as exc:
        return _exit_status(exc.code), None
    except BaseException as exc:  # noqa: BLE001 - the script's end, reported as Python would
        return 1, exc
    return 0, None


def _exit_status(code: object) -> int:
    # What Python makes of SystemExit(code): None is 0, an int is itself, anything else is
    # printed to stderr and is 1.
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_as_python_does(exc: BaseException) -> None:
    # The traceback from the script's own frames: this module's are cyctx's, not the script's.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    exc.__traceback__ = tb
    sys.excepthook(type(exc), exc, tb)


_interrupted = False


def _die_by_sigint_if_interrupted() -> None:
    if not _interrupted:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
