"""Environments whose cuda-bindings is missing or another version, for child interpreters.

`site_without_cuda_bindings`: a directory with everything of this environment's site-packages
but cuda-bindings (and the other NVIDIA packages); run `python -S` with `env_of(it)`, and cyctx
is installed while cuda-bindings is not. `fake_bindings`: a cuda.bindings package shadowing the
real one, whose _version.py says a version and whose import fails, as a cuda-bindings cyctx
cannot use does. Neither mocks cyctx: the child finds what the import system finds.
"""

import os
import sys

import cyctx

# cyctx's own directory's parent: site-packages when installed, src/ when editable (an editable
# install is found through a .pth that `python -S` does not read).
_CYCTX_HOME = os.path.dirname(os.path.dirname(os.path.abspath(cyctx.__file__)))


def site_without_cuda_bindings(tmp_path):
    farm = tmp_path / "site"
    farm.mkdir()
    sites = [
        p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)
    ]
    for sp in sites:  # in import order: the first of a name is the one imported
        for entry in os.listdir(sp):
            if entry.lower().startswith(("cuda", "nvidia")) or (farm / entry).exists():
                continue
            os.symlink(os.path.join(sp, entry), farm / entry)
    return farm


def fake_bindings(tmp_path, version):
    root = tmp_path / f"fake-{version}"
    pkg = root / "cuda" / "bindings"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the fake cuda.bindings')\n")
    (pkg / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    dist = root / f"cuda_bindings-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: cuda-bindings\nVersion: {version}\n"
    )
    return root


def env_of(path):
    """The environment of a child whose first path entry is `path`; cyctx stays importable."""
    entries = [str(path)]
    if not os.path.exists(os.path.join(path, "cyctx")):
        entries.append(_CYCTX_HOME)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(entries))
    env.pop("PYTHONWARNINGS", None)
    return env
