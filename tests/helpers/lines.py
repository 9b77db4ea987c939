"""The line of a test file that an event must point at, found by the comment that ends it
(``# set-here``), so that no test writes a line number down."""

import inspect
import sys


def line_of(marker, text=None):
    """The one line of `text` (default: the calling module's source) that ends with `# marker`."""
    if text is None:
        text = inspect.getsource(sys.modules[sys._getframe(1).f_globals["__name__"]])
    hits = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, f"{marker!r} ends {len(hits)} lines"
    return hits[0]
