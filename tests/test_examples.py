"""The examples under examples/: built against the INSTALLED cyctx like any downstream package
(on CI: compiled, imported), and run on the real driver (marked gpu): kernels compiled with
NVRTC and launched from nogil threads on every device; the same kernel on torch and CuPy
memory and streams while those frameworks keep their own current device."""

import os
import shutil
import subprocess
import sys

import pytest
from helpers.drivers import current, device_count
from helpers.threads import in_thread

import cyctx

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(os.path.dirname(HERE), "examples", "kernels")
pytestmark = pytest.mark.skipif(
    not os.path.isdir(KERNELS), reason="needs the source tree's examples/"
)


@pytest.fixture(scope="module")
def kernels_mod(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels")
    shutil.copytree(KERNELS, d / "kernels")
    proc = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=d / "kernels",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sys.path.insert(0, str(d / "kernels" / "src"))
    try:
        import cyctx_kernels

        yield cyctx_kernels
    finally:
        sys.path.remove(str(d / "kernels" / "src"))


def test_kernels_example_builds_and_imports(kernels_mod):
    assert set(kernels_mod.MODES) == {
        "guard_per_launch",
        "guard_per_batch",
        "raw_push_pop",
        "guard_launch_sync",
        "raw_set_current",
    }
    with pytest.raises(TypeError):
        kernels_mod.DeviceKernel(0, b"", b"add")  # a guard is required


@pytest.fixture(scope="module")
def nvrtc_ok():
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # no nvidia-cuda-nvrtc wheel of this cuda-bindings' major here
        pytest.skip(f"NVRTC not available: {type(exc).__name__}: {exc}")


def test_nvrtc_compiles_the_kernel(kernels_mod, nvrtc_ok):
    # Also in a process on the simulated driver (NVRTC looks up the driver's export table).
    assert kernels_mod.compile_kernel("sm_90")[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_launch_from_nogil_threads_on_every_device(kernels_mod, nvrtc_ok):
    devices = list(range(device_count()))
    ks = kernels_mod.load(devices)
    try:
        for mode in kernels_mod.MODES:
            r = kernels_mod.run_threads(ks, threads=4 * len(devices), launches=200, mode=mode)
            assert r["wrong"] == [0] * (4 * len(devices)), (mode, r["wrong"])
        assert current() == 0
    finally:
        for k in ks:
            k.close()


@pytest.mark.gpu
def test_kernel_on_torch_and_cupy_memory(kernels_mod, nvrtc_ok):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    dev = device_count() - 1  # device 1 where there are two, while the frameworks sit on 0
    other = 0
    cubin = kernels_mod.compile_kernel("sm_90")

    def body():  # on a thread of its own: torch and CuPy leave their context current on it
        torch.cuda.set_device(other)
        t = torch.zeros(4096, device=f"cuda:{dev}")
        ts = torch.cuda.Stream(device=dev)
        g = cyctx.ContextGuard(ts)  # the guard from torch's stream
        assert g.device == dev and g.is_primary
        k = kernels_mod.DeviceKernel(g, cubin, b"add")
        kernels_mod.launch_on(k, t.data_ptr(), t.numel(), 2.0, ts.cuda_stream)
        ts.synchronize()
        assert bool(torch.all(t == 2.0))
        assert torch.cuda.current_device() == other
        k.close()
        g.close()

        with cupy.cuda.Device(other):
            with cupy.cuda.Device(dev):
                a = cupy.zeros(4096, dtype=cupy.float32)
                cs = cupy.cuda.Stream(non_blocking=True)
            g = cyctx.ContextGuard(cs)  # the guard from CuPy's stream
            assert g.device == dev
            k = kernels_mod.DeviceKernel(g, cubin, b"add")
            kernels_mod.launch_on(k, a.data.ptr, a.size, 3.0, cs.ptr)
            cs.synchronize()
            assert bool((a == 3.0).all())
            assert cupy.cuda.runtime.getDevice() == other
            k.close()
            g.close()
        return True

    assert in_thread(body) is True


def example_commands(readme: str) -> list[str]:
    """The commands .ci/run runs for an example: the lines of the code block after
    ``<!-- ci-example-commands -->`` in its README."""
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    head, marker, rest = text.partition("<!-- ci-example-commands -->\n")
    if not marker or not rest.startswith("```"):
        return []
    return [line for line in rest.split("\n```", 1)[0].splitlines()[1:] if line.strip()]


def test_every_example_has_a_readme_whose_commands_ci_runs():
    examples = os.path.join(os.path.dirname(HERE), "examples")
    dirs = sorted(d for d in os.listdir(examples) if os.path.isdir(os.path.join(examples, d)))
    assert {"minimal", "downstream", "kernels", "pools"} <= set(dirs), dirs
    for d in dirs:
        readme = os.path.join(examples, d, "README.md")
        assert os.path.isfile(readme), f"examples/{d} has no README.md"
        assert example_commands(readme), f"examples/{d}/README.md has no ci-example-commands block"
    ci = os.path.join(os.path.dirname(HERE), ".ci", "run")
    if not os.path.isfile(ci):
        pytest.skip("no .ci/run here: a checkout's file, not in the source distribution")
    with open(ci, encoding="utf-8") as f:
        assert "<!-- ci-example-commands -->" in f.read(), ".ci/run does not run the READMEs"


def test_readme_commands_are_read_as_ci_reads_them(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n\n```\nnot this\n```\n<!-- ci-example-commands -->\n```\na\n\nb c\n```\nafter\n"
    )
    assert example_commands(str(readme)) == ["a", "b c"]
    readme.write_text("# x\n```\nno marker\n```\n")
    assert example_commands(str(readme)) == []
