"""Smoke test of an installed tvmgrad (scripts/check_wheel.sh runs it in a fresh venv holding only
the wheel and its core dependencies, from a folder outside the checkout).

Usage: python wheel_smoke.py WORKDIR      (TVMGRAD_CACHE_DIR should point into a temp folder)

1. every module of the package imports (pkgutil.walk_packages over tvmgrad),
2. every op's example call (tvmgrad.examples, what `tvmgrad build` builds) is made, and
   tvmgrad.run("relu_grad") equals numpy,
3. ``tvmgrad build --target llvm --ops relu_grad gelu_grad`` (the console script) makes a library
   that tvmgrad.load_library opens and runs,
4. relax.transform.Gradient with tvmgrad's registered gradients differentiates sum(gelu(x)), and
   the gradient module compiles and runs.
Exits non-zero on the first failure.
"""

from __future__ import annotations

import importlib
import math
import os
import pathlib
import pkgutil
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np

# Modules not imported in step 1, with why. Importing every other module must work with only the
# core dependencies installed (paddle, torch and scipy are not: benchrefs imports them lazily).
NOT_IMPORTED = {"tvmgrad.__main__": "runs the command line (checked as `python -m tvmgrad list`)"}

WORK = pathlib.Path(sys.argv[1]).resolve()
RESULTS: list[tuple[str, bool, str]] = []


def step(name):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            RESULTS.append((name, True, f"{detail} ({time.perf_counter() - t0:.1f} s)".strip()))
        except Exception:
            RESULTS.append((name, False, traceback.format_exc()))
        return fn
    return wrap


def _not_from_checkout(module):
    """The module must come from site-packages, not a checkout on sys.path."""
    where = pathlib.Path(module.__file__).resolve()
    assert "site-packages" in where.parts, f"{module.__name__} imported from {where}"
    return where


def _gelu_grad(x):
    """d/dx of x·Φ(x) (exact gelu), in float64."""
    erf = np.vectorize(math.erf)
    return 0.5 * (1 + erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


@step("installed from the wheel")
def _():
    import tvmgrad
    import tvmgrad.relax
    import tvmgrad.schedules.cpu
    import tvmgrad.specs
    import tvmgrad.te_defs
    for m in (tvmgrad, tvmgrad.relax, tvmgrad.te_defs, tvmgrad.schedules.cpu, tvmgrad.specs):
        _not_from_checkout(m)
    spec = pathlib.Path(tvmgrad.specs.__file__).with_name("backward.yaml")
    assert spec.is_file(), f"{spec} is missing"
    return f"tvmgrad {tvmgrad.__version__} at {pathlib.Path(tvmgrad.__file__).parent}"


@step("import every module")
def _():
    import tvmgrad
    names, failed = [], []

    def onerror(name):
        failed.append((name, traceback.format_exc(limit=3)))

    for info in pkgutil.walk_packages(tvmgrad.__path__, "tvmgrad.", onerror=onerror):
        if info.name in NOT_IMPORTED:
            continue
        try:
            importlib.import_module(info.name)
            names.append(info.name)
        except Exception:
            failed.append((info.name, traceback.format_exc(limit=3)))
    assert not failed, "\n".join(f"{n}:\n{tb}" for n, tb in failed)
    for required in ("tvmgrad.relax", "tvmgrad.examples.linalg", "tvmgrad.te_defs", "tvmgrad.schedules.cuda",
                     "tvmgrad.bench", "tvmgrad.benchrefs.linalg"):
        assert required in names, f"{required} was not found in the installed package"
    for absent in ("scipy", "paddle", "torch", "pytest"):
        assert absent not in sys.modules, f"importing tvmgrad imported {absent}"
    return f"{len(names)} modules; skipped: {', '.join(f'{k} ({v})' for k, v in NOT_IMPORTED.items())}"


@step("an example call of every op")
def _():
    """What `tvmgrad build` (every op) and `tvmgrad check --build` feed the kernels; the examples
    must not need a test-only package (scipy, paddle)."""
    from tvmgrad import examples
    ops = examples.implemented_ops()
    for op in ops:
        inputs, attrs = examples.sample(op)
        assert isinstance(inputs, dict) and isinstance(attrs, dict), op
        examples.broadcast_variant(op)
    assert len(ops) > 200, len(ops)
    for absent in ("scipy", "paddle", "torch"):
        assert absent not in sys.modules, f"the examples imported {absent}"
    return f"{len(ops)} ops"


@step("python -m tvmgrad list --summary")
def _():
    proc = subprocess.run([sys.executable, "-m", "tvmgrad", "list", "--summary"], capture_output=True,
                          text=True, timeout=300, cwd=WORK)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


@step("tvmgrad.run relu_grad")
def _():
    import tvmgrad
    rng = np.random.default_rng(0)
    x = rng.standard_normal((33, 65)).astype("float32")
    g = rng.standard_normal((33, 65)).astype("float32")
    got = tvmgrad.run("relu_grad", {"out": x, "out_grad": g})["x_grad"]
    np.testing.assert_array_equal(got, np.where(x > 0, g, 0))


@step("tvmgrad build + load_library")
def _():
    import tvmgrad
    out = WORK / "lib-cpu"
    exe = shutil.which("tvmgrad", path=os.path.dirname(sys.executable))
    assert exe, f"no tvmgrad console script next to {sys.executable}"
    proc = subprocess.run([exe, "build", "--target", "llvm", "--out", str(out), "--ops", "relu_grad", "gelu_grad"],
                          capture_output=True, text=True, timeout=900, cwd=WORK)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "manifest.json").is_file(), sorted(p.name for p in out.iterdir())
    lib = tvmgrad.load_library(out)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 130)).astype("float32")
    g = rng.standard_normal((7, 130)).astype("float32")
    relu = lib.run("relu_grad", {"out": x, "out_grad": g})["x_grad"]
    np.testing.assert_array_equal(relu, np.where(x > 0, g, 0))
    gelu = lib.run("gelu_grad", {"x": x, "out_grad": g}, {"approximate": False})["x_grad"]
    np.testing.assert_allclose(gelu, g * _gelu_grad(x.astype(np.float64)), rtol=1e-4, atol=1e-5)
    return f"{len(list(out.iterdir()))} files in the library"


@step("relax Gradient with tvmgrad gradients")
def _():
    import tvm
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tvmgrad.relax

    registered = tvmgrad.relax.register_gradients()
    assert "relax.nn.gelu" in registered, sorted(registered)

    @I.ir_module
    class Tiny:
        @R.function
        def main(x: R.Tensor((4, 9), "float32")):
            with R.dataflow():
                loss = R.sum(R.nn.gelu(x))
                R.output(loss)
            return loss

    grad_mod = relax.transform.Gradient("main")(Tiny)
    kernels = {str(f.attrs["tvmgrad.op"]) for f in grad_mod.functions.values()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "tvmgrad.op" in f.attrs}
    assert "gelu_grad" in kernels, kernels
    vm = relax.VirtualMachine(tvm.compile(grad_mod, target="llvm"), tvm.cpu())
    x = np.random.default_rng(2).standard_normal((4, 9)).astype("float32")
    loss, (dx,) = vm["main_adjoint"](tvm.runtime.tensor(x))
    x64 = x.astype(np.float64)
    want_loss = (x64 * 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))).sum()
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5)
    np.testing.assert_allclose(dx.numpy(), _gelu_grad(x64), rtol=1e-4, atol=1e-6)
    return f"{len(registered)} gradients registered; kernels {sorted(kernels)}"


for name, ok, detail in RESULTS:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail if ok else ''}")
    if not ok:
        print("\n".join("       " + line for line in detail.rstrip().splitlines()))
sys.exit(0 if all(ok for _, ok, _ in RESULTS) else 1)
