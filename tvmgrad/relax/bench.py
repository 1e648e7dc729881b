"""One training step (forward + backward) of a real model: the Relax VM on tvmgrad gradients
against PyTorch's eager autograd, on the same CPU threads.

``bench_training_step(model_name, *, batch=None, repeat=20, threads=None) -> dict`` runs each
framework in its own subprocess (so that torch's OpenMP pool and TVM's thread pool never spin
against each other), with the same seeded model and inputs (``tvmgrad.relax.models``), and
returns best-of-``repeat`` and median step times:

    {"model", "batch", "threads", "repeat", "variant", "target",
     "tvm_ms", "tvm_median_ms", "torch_ms", "torch_median_ms",
     "ratio", "ratio_median",        # tvm / torch (below 1: tvmgrad is faster)
     "compile_s", "max_rel_err"}     # tvm build time; worst gradient vs torch (max |Δ| / max |g|)

A TVM step is one ``main_adjoint`` call (the loss and every parameter gradient); a torch step
is ``zero_grad(set_to_none=True)``, the forward and ``loss.backward()``. ``variant``:
``"tvmgrad"`` (registered gradients + the tvmgrad pipeline: every kernel scheduled),
``"backward"`` (only the gradient kernels scheduled, TVM's forward kernels as TVM leaves them),
``"unscheduled"`` (tvmgrad gradients, nothing scheduled: the path before the pipeline existed),
``"tvm"`` (TVM's own gradients; fails for models with an op TVM cannot differentiate).
``target`` is a tvmgrad target name (``"llvm"``: this host's CPU, see ``tvmgrad.targets``).

``tvmgrad bench --relax MODEL...`` prints a table of them (``report``; ``--json`` the dicts);
``python -m tvmgrad.relax.bench MODEL [--batch N] [--repeat N] [--threads N]`` prints one as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

__all__ = ["bench_training_step", "report", "VARIANTS", "kernel_profile"]

VARIANTS = ("tvmgrad", "backward", "unscheduled", "tvm")


def _stats(times) -> tuple[float, float]:
    ts = sorted(times)
    return ts[0] * 1e3, ts[len(ts) // 2] * 1e3


def _timed(step, repeat: int, warmup: int) -> list:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _torch_worker(model, batch, size, repeat, warmup, threads) -> dict:
    import torch
    torch.set_num_threads(threads)
    from .models import torch_model
    tm = torch_model(model, batch, size=size)
    module = tm.module
    module.train(tm.train)

    def step():
        module.zero_grad(set_to_none=True)
        module(*tm.inputs).backward()

    best, median = _stats(_timed(step, repeat, warmup))
    return {"torch_ms": best, "torch_median_ms": median}


def _tvm_worker(model, batch, size, repeat, warmup, threads, variant, target) -> dict:
    import numpy as np
    import torch
    torch.set_num_threads(1)               # torch only exports here; it must not hold cores
    import tvm
    from tvm import relax

    from ..targets import resolve
    from . import passes
    from .models import as_tensors, export, gradient, torch_grads, torch_model
    tm = torch_model(model, batch, size=size)
    exp = export(tm)
    if variant != "tvm":
        from . import register_gradients
        register_gradients()
        if variant == "backward":
            passes.configure(forward=False)
        elif variant == "unscheduled":
            passes.uninstall()
    t0 = time.perf_counter()
    grad_mod = gradient(exp)
    ex = tvm.compile(grad_mod, target=resolve(target).target)
    compile_s = time.perf_counter() - t0
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = as_tensors(exp.inputs + exp.params)
    fn = vm["main_adjoint"]
    loss, grads = fn(*args)
    _, want = torch_grads(tm, exp.param_names)
    err = max(float(np.abs(g.numpy() - w).max() / (np.abs(w).max() + 1e-30)) for g, w in zip(grads, want))
    best, median = _stats(_timed(lambda: fn(*args), repeat, warmup))
    return {"tvm_ms": best, "tvm_median_ms": median, "compile_s": compile_s, "max_rel_err": err,
            "tvm_threads": tvm.runtime.num_threads()}


def _run_worker(kind: str, env_threads: dict, argv: list, timeout: float) -> dict:
    env = dict(os.environ)
    env.update(env_threads)
    cmd = [sys.executable, "-m", "tvmgrad.relax.bench", "--worker", kind, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise RuntimeError(f"bench_training_step: the {kind} worker failed (exit {proc.returncode}):\n"
                           + "\n".join(tail))
    return json.loads(lines[-1])


def bench_training_step(model_name: str, *, batch: int | None = None, repeat: int = 20,
                        threads: int | None = None, size: int | None = None, warmup: int = 3,
                        variant: str = "tvmgrad", target: str = "llvm", timeout: float = 1800) -> dict:
    """Time one training step of ``model_name`` (one of ``tvmgrad.relax.models.MODELS``) in
    the Relax VM and in PyTorch, each in its own process on ``threads`` CPU threads (default:
    every core). See the module doc for the result's keys."""
    from .models import DEFAULT_BATCH, MODELS
    if model_name not in MODELS:
        raise ValueError(f"unknown model {model_name!r} (have {', '.join(MODELS)})")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (have {', '.join(VARIANTS)})")
    batch = batch or DEFAULT_BATCH[model_name]
    threads = threads or os.cpu_count() or 1
    argv = ["--model", model_name, "--batch", str(batch), "--repeat", str(repeat), "--warmup", str(warmup),
            "--threads", str(threads), "--variant", variant, "--target", target]
    if size is not None:
        argv += ["--size", str(size)]
    n = str(threads)
    torch_env = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "TVM_NUM_THREADS": "1"}
    tvm_env = {"TVM_NUM_THREADS": n, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = {"model": model_name, "batch": batch, "threads": threads, "repeat": repeat,
              "variant": variant, "target": target}
    result.update(_run_worker("torch", torch_env, argv, timeout))
    result.update(_run_worker("tvm", tvm_env, argv, timeout))
    result["ratio"] = result["tvm_ms"] / result["torch_ms"]
    result["ratio_median"] = result["tvm_median_ms"] / result["torch_median_ms"]
    return result


def report(rows: list[dict]) -> str:
    """A table of ``bench_training_step`` results: best and median ms per step, tvm/torch."""
    lines = [f"{'model':12s} {'batch':>5s} {'thr':>3s} {'tvm best':>9s} {'median':>9s} "
             f"{'torch best':>10s} {'median':>9s} {'ratio':>6s} {'(median)':>8s} {'max err':>8s}"]
    for r in rows:
        lines.append(f"{r['model']:12s} {r['batch']:5d} {r['threads']:3d} {r['tvm_ms']:9.2f} "
                     f"{r['tvm_median_ms']:9.2f} {r['torch_ms']:10.2f} {r['torch_median_ms']:9.2f} "
                     f"{r['ratio']:6.2f} {r['ratio_median']:8.2f} {r['max_rel_err']:8.1e}")
    lines.append("ratio: tvm time / torch time per training step (below 1: tvmgrad is faster)")
    return "\n".join(lines)


def kernel_profile(vm, func_name: str, args, repeat: int = 5) -> list[tuple[str, int, float]]:
    """(callee, calls, best total ms) for each function a VM call invokes (kernels and VM
    builtins), from ``VirtualMachine.set_instrument`` (which adds a little time to each call);
    the slowest first."""
    best: dict = {}
    counts: dict = {}
    for _ in range(repeat):
        acc: dict = {}
        cnt: dict = {}
        start: dict = {}

        def instrument(func, symbol, before, ret, *a):
            if before:
                start[symbol] = time.perf_counter()
            else:
                acc[symbol] = acc.get(symbol, 0.0) + time.perf_counter() - start[symbol]
                cnt[symbol] = cnt.get(symbol, 0) + 1
            return 0

        vm.set_instrument(instrument)
        try:
            vm[func_name](*args)
        finally:
            vm.set_instrument(None)
        for k, v in acc.items():
            best[k] = min(best.get(k, v), v)
        counts = cnt
    return sorted(((k, counts.get(k, 0), v * 1e3) for k, v in best.items()), key=lambda r: -r[2])


def _parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m tvmgrad.relax.bench",
                                description="Time one training step: Relax VM (tvmgrad) vs PyTorch.")
    p.add_argument("model", nargs="?")
    p.add_argument("--model", dest="model_opt")
    p.add_argument("--batch", type=int)
    p.add_argument("--size", type=int)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--variant", default="tvmgrad", choices=VARIANTS)
    p.add_argument("--target", default="llvm")
    p.add_argument("--worker", choices=("tvm", "torch"))
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    model = args.model_opt or args.model
    if model is None:
        _parser().error("a model is required")
    if args.worker is not None:
        threads = args.threads or os.cpu_count() or 1
        if args.worker == "torch":
            out = _torch_worker(model, args.batch, args.size, args.repeat, args.warmup, threads)
        else:
            out = _tvm_worker(model, args.batch, args.size, args.repeat, args.warmup, threads,
                              args.variant, args.target)
        print(json.dumps(out), flush=True)
        return 0
    out = bench_training_step(model, batch=args.batch, repeat=args.repeat, threads=args.threads,
                              size=args.size, warmup=args.warmup, variant=args.variant, target=args.target)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
