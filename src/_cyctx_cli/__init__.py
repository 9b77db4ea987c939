"""The ``cyctx`` console script's entry point, beside cyctx rather than in it: importing a module
of cyctx runs ``cyctx/__init__.py`` first, which stops at an unusable cuda-bindings; this module
tells it, before that import, that the command line is running and reports that itself
(``cyctx doctor``'s ``bindings_unusable`` finding, the reason in ``cyctx --version``)."""

running = False


def run() -> None:
    """Run ``cyctx`` (``cyctx.__main__.run``)."""
    global running
    running = True
    from cyctx.__main__ import run as _run

    _run("cyctx")
