"""``tvmgrad bench``: our LLVM kernels side by side with Paddle CPU, PyTorch CPU and the memory
roofline (a numpy copy of the same bytes), in one run, as ratios. Timing is the best of
``--repeat`` calls after a warm-up; bytes are every input read plus every output written.

Paddle and PyTorch are optional (neither is a tvmgrad dependency: ``pip install paddlepaddle``,
``pip install tvmgrad[bench]`` for torch): without one, its columns read n/a and a note says why.
"""

from __future__ import annotations

import importlib
import time

import numpy as np

from . import registry
from .runtime import aligned_empty, prepare

__all__ = ["main", "bench_op", "make_inputs"]

ATTR_BY_TYPE = {"float": 0.5, "double": 0.5, "Scalar": 2.0, "int": 1, "int64_t": 1, "bool": False}
BENCH_ATTRS = {"prelu_grad": {"mode": "all"}}

# Paddle 3.3.1 bindings known to crash (memory corruption) for these variants.
PADDLE_CRASHES = {("atan2_grad", True)}


def make_inputs(op: str, n: int, dtype: str, broadcast: bool, seed: int = 0):
    """Float inputs of ``n`` elements in (0.1, 0.9) (inside every pointwise op's domain but
    acosh's); with ``broadcast``, the op's second broadcasting input is one row of a square."""
    import ml_dtypes

    from .benchrefs import input_makers
    maker = input_makers().get(op)
    if maker is not None and not broadcast:
        return maker(n, dtype)
    spec = registry.get(op).spec
    rng = np.random.default_rng(seed)
    npd = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    side = int(round(n ** 0.5))
    shape = (side, n // side) if broadcast else (n,)
    bcast_name = _second_broadcast_input(op) if broadcast else None
    if broadcast and bcast_name is None:
        raise ValueError(f"{op} has no broadcasting input")
    inputs = {}
    for p in spec.tensor_args:
        s = (shape[1],) if p.name == bcast_name else shape
        inputs[p.name] = rng.uniform(0.1, 0.9, size=s).astype(npd)
    attrs = dict(BENCH_ATTRS.get(op, {}))
    for p in spec.attrs:
        if p.name not in spec.defaults and p.name not in attrs:
            attrs[p.name] = ATTR_BY_TYPE[p.base_type]
    return inputs, attrs


def _second_broadcast_input(op):
    entry = registry.get(op)
    impl = entry.implementation
    free = impl._broadcasting_inputs(entry.spec) if hasattr(impl, "_broadcasting_inputs") else set()
    names = [p.name for p in entry.spec.tensor_args if p.name in free]
    return names[1] if len(names) > 1 else None


def _best(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _copy_roofline(nbytes: int, repeat: int) -> float:
    """GB/s of np.copyto over buffers of nbytes/2 each (read + write = nbytes moved)."""
    half = max(nbytes // 2 // 4, 1)
    src = np.random.default_rng(0).random(half, dtype=np.float32)
    dst = np.empty_like(src)
    t = _best(lambda: np.copyto(dst, src), repeat)
    return 2 * src.nbytes / t / 1e9


# -- Paddle / PyTorch -----------------------------------------------------------------------

OPTIONAL = {"paddle": "pip install paddlepaddle", "torch": "pip install 'tvmgrad[bench]'"}


def _optional(name: str):
    """The framework module, or None when it is not installed (or does not import): its columns
    read n/a."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _convert(value, make):
    """An input for another framework: ``make(array)`` per array (half types go through float32,
    which numpy-to-framework conversion needs), lists element by element."""
    if isinstance(value, list):
        return [_convert(v, make) for v in value]
    if value is None:
        return None
    wide = value.astype(np.float32) if value.dtype.kind == "V" or str(value.dtype) == "bfloat16" else value
    return make(np.ascontiguousarray(wide), str(value.dtype))


def _paddle_fn(op, inputs, attrs):
    paddle = _optional("paddle")
    if paddle is None:
        return None
    from .benchrefs import paddle_refs
    paddle.set_device("cpu")
    spec = registry.get(op).spec
    tensors = {k: _convert(v, lambda a, dt: paddle.to_tensor(a).astype(dt)) for k, v in inputs.items()}
    full = {**spec.defaults, **attrs}
    custom = paddle_refs().get(op)
    if custom is not None:
        return custom(tensors, full)
    if not hasattr(paddle._C_ops, op):
        return None
    args = [tensors[p.name] if p.is_tensor else full[p.name] for p in spec.args]
    fn = getattr(paddle._C_ops, op)
    return lambda: fn(*args)


def _torch_fn(op, inputs, attrs):
    torch = _optional("torch")
    if torch is None:
        return None
    from .benchrefs import torch_refs
    make = torch_refs().get(op)
    if make is None:
        return None
    tensors = {k: _convert(v, lambda a, dt: torch.from_numpy(a).to(getattr(torch, dt)))
               for k, v in inputs.items()}
    return make(tensors, {**registry.get(op).spec.defaults, **attrs})


# -- the run ----------------------------------------------------------------------------------

def _aligned(value):
    """``value`` in 64-byte aligned memory: the kernels assume it, and the runtime copies arrays
    that are not (large numpy allocations start 16 bytes past a page), which is not the kernel's
    time."""
    if isinstance(value, list):
        return [_aligned(v) for v in value]
    if not isinstance(value, np.ndarray):
        return value
    out = aligned_empty(value.shape, value.dtype)
    np.copyto(out, value)
    return out


def _nbytes(value) -> int:
    return sum(_nbytes(v) for v in value) if isinstance(value, list) else getattr(value, "nbytes", 0)


def bench_op(op: str, n: int, dtype: str, broadcast: bool, repeat: int, roofline: float) -> dict:
    inputs, attrs = make_inputs(op, n, dtype, broadcast)
    inputs = {k: _aligned(v) for k, v in inputs.items()}
    launch = prepare(op, inputs, attrs)
    outs = {o.name: [aligned_empty(x.shape, x.dtype.numpy) for x in m] if isinstance(m, list)
            else aligned_empty(m.shape, m.dtype.numpy)
            for o, m in zip(launch.op.spec.outputs, launch.outputs) if m is not None}
    ours = _best(lambda: launch(out=outs), repeat)
    nbytes = sum(_nbytes(v) for v in inputs.values()) + sum(_nbytes(v) for v in outs.values())
    row = {"op": op + (" (broadcast)" if broadcast else ""), "ms": ours * 1e3,
           "gbs": nbytes / ours / 1e9}
    row["roofline"] = row["gbs"] / roofline
    from .benchrefs import flop_counts
    count = flop_counts().get(op)
    row["gflops"] = count(inputs, attrs) / ours / 1e9 if count else None
    paddle_fn = None if (op, broadcast) in PADDLE_CRASHES else _paddle_fn(op, inputs, attrs)
    row["paddle_ms"] = _best(paddle_fn, max(3, repeat // 4)) * 1e3 if paddle_fn else None
    torch_fn = _torch_fn(op, inputs, attrs)
    row["torch_ms"] = _best(torch_fn, max(3, repeat // 4)) * 1e3 if torch_fn else None
    return row


def main(args) -> int:
    import os
    rows = []
    roofline = _copy_roofline(3 * 4 * args.size, args.repeat)
    for spec in args.ops:
        op, _, variant = spec.partition(":")
        rows.append(bench_op(op, args.size, args.dtype, variant in ("bcast", "broadcast"),
                             args.repeat, roofline))
    if getattr(args, "json", False):
        import json
        print(json.dumps({"size": args.size, "dtype": args.dtype, "roofline_gbs": roofline,
                          "threads": os.environ.get("TVM_NUM_THREADS"),
                          "missing": [n for n in OPTIONAL if _optional(n) is None], "rows": rows},
                         indent=1, default=str))
        return 0
    print(f"{args.size} elements, {args.dtype}, TVM threads {os.environ.get('TVM_NUM_THREADS')}, "
          f"copy roofline (numpy copyto) {roofline:.1f} GB/s")
    for name, how in OPTIONAL.items():
        if _optional(name) is None:
            print(f"{name} is not installed: its columns read n/a ({how})")
    header = (f"{'op':<28} {'tvmgrad ms':>10} {'GB/s':>7} {'%roof':>6} {'paddle ms':>10} "
              f"{'x paddle':>8} {'torch ms':>9} {'x torch':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        def ratio(other):
            return f"{other / r['ms']:8.2f}" if other else f"{'n/a':>8}"

        def ms(v):
            return f"{v:10.3f}" if v else f"{'n/a':>10}"
        flops = f" {r['gflops']:.1f} GFLOP/s" if r["gflops"] else ""
        print(f"{r['op']:<28} {r['ms']:10.3f} {r['gbs']:7.1f} {100 * r['roofline']:5.0f}% "
              f"{ms(r['paddle_ms'])} {ratio(r['paddle_ms'])} {ms(r['torch_ms'])[1:]} {ratio(r['torch_ms'])}"
              f"{flops}")
    print("x paddle / x torch: their time over ours (> 1: tvmgrad is faster)")
    return 0
