"""Write python.inv, the intersphinx inventory of the few Python objects these pages link to.

The documentation builds offline (CI has no network beyond the package index), so the
inventory is committed instead of fetched. It is written from the table below, in Sphinx's
inventory format; each URL is the Python documentation's own anchor for the object. With a
network, ``--download`` replaces it by docs.python.org's full inventory instead.

    python docs/_intersphinx/make_python_inv.py [--download]
"""

import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "python.inv")

# name, role, page (the anchor is the name, "$")
OBJECTS = [
    ("concurrent.futures.ThreadPoolExecutor", "class", "library/concurrent.futures.html"),
    ("concurrent.futures.ProcessPoolExecutor", "class", "library/concurrent.futures.html"),
    ("threading.Thread", "class", "library/threading.html"),
    ("threading.local", "class", "library/threading.html"),
    ("multiprocessing.get_context", "function", "library/multiprocessing.html"),
    ("multiprocessing.set_start_method", "function", "library/multiprocessing.html"),
    ("os.fork", "function", "library/os.html"),
    ("os.PathLike", "class", "library/os.html"),
    ("bytes", "class", "library/stdtypes.html"),
    ("warnings.simplefilter", "function", "library/warnings.html"),
    ("RuntimeWarning", "exception", "library/exceptions.html"),
    ("ResourceWarning", "exception", "library/exceptions.html"),
    ("ValueError", "exception", "library/exceptions.html"),
    ("TypeError", "exception", "library/exceptions.html"),
    ("ImportError", "exception", "library/exceptions.html"),
    ("Exception", "exception", "library/exceptions.html"),
    ("MemoryError", "exception", "library/exceptions.html"),
    ("int", "class", "library/functions.html"),
    ("str", "class", "library/functions.html"),
    ("bool", "class", "library/functions.html"),
    ("list", "class", "library/stdtypes.html"),
    ("dict", "class", "library/stdtypes.html"),
    ("typing.Any", "data", "library/typing.html"),
    ("typing.SupportsIndex", "class", "library/typing.html"),
    ("typing.Literal", "data", "library/typing.html"),
    ("dataclasses.dataclass", "function", "library/dataclasses.html"),
]


def write() -> None:
    body = "".join(f"{name} py:{role} 1 {page}#$ -\n" for name, role, page in OBJECTS)
    head = (
        "# Sphinx inventory version 2\n# Project: Python\n# Version: 3\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    with open(OUT, "wb") as f:
        f.write(head.encode() + zlib.compress(body.encode()))


def download() -> None:
    import urllib.request

    with (
        urllib.request.urlopen("https://docs.python.org/3/objects.inv", timeout=60) as r,
        open(OUT, "wb") as f,
    ):
        f.write(r.read())


if __name__ == "__main__":
    download() if "--download" in sys.argv[1:] else write()
    print(f"wrote {OUT}")
