"""What the benchmark (``tvmgrad bench``) and the tuner (``tvmgrad tune``) run an op on and measure
it against: an op's representative inputs at a given size, the timing of a call, and the memory
roofline (a parallel copy of the same bytes)."""

from __future__ import annotations

import time

import numpy as np

from . import registry

__all__ = ["make_inputs", "best_and_median", "copy_roofline"]

ATTR_BY_TYPE = {"float": 0.5, "double": 0.5, "Scalar": 2.0, "int": 1, "int64_t": 1, "bool": False}
BENCH_ATTRS = {"prelu_grad": {"mode": "all"}}


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
    free = impl.broadcasting_inputs(entry.spec) if hasattr(impl, "broadcasting_inputs") else set()
    names = [p.name for p in entry.spec.tensor_args if p.name in free]
    return names[1] if len(names) > 1 else None


def best_and_median(fn, repeat: int) -> tuple[float, float]:
    """(best, median) seconds of ``repeat`` calls after two warm-up calls."""
    return taking_turns([fn], repeat)[0]


TURN_BLOCKS = 4       # blocks of consecutive calls per function in ``taking_turns``
TURN_WARMUP = 2       # untimed calls that start each block


def taking_turns(fns, repeat: int) -> list[tuple[float, float]]:
    """(best, median) seconds of ``repeat`` calls of each of ``fns`` (after two warm-up calls
    each), the functions taking turns: on a machine whose memory bandwidth drifts from second to
    second (a shared VM), a kernel and its roofline are timed in the same moments.

    With several ``fns`` they take turns by blocks (``TURN_BLOCKS`` of them), each block
    starting with TURN_WARMUP untimed calls, its timed calls consecutive: the other function
    has evicted this one's data from the caches, and a last-level cache takes more than one
    pass to keep data again (a kernel whose 64 MiB fit this VM's L3, warpctc_grad, timed 2.1 ms
    straight after the copy roof, 1.7 after one untimed call, 1.35 after two, 1.2 alone), as a
    reference framework timed alone, call after call, finds its own data there."""
    for fn in fns:
        fn()
        fn()
    times = [[] for _ in fns]
    repeat = max(1, repeat)
    blocks = min(TURN_BLOCKS, repeat) if len(fns) > 1 else 1
    per = -(-repeat // blocks)
    for _ in range(blocks):
        for fn, spent in zip(fns, times):
            if len(fns) > 1:
                for _ in range(TURN_WARMUP):
                    fn()
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                spent.append(time.perf_counter() - t0)
    return [(min(t), float(np.median(t))) for t in times]


def copy_kernel(nbytes: int):
    """(a call, the bytes it moves): a parallel copy (all TVM threads, vectorised) of nbytes/2
    into nbytes/2, what moving the same bytes costs at best on this machine. Built for the
    target the kernels are (``"llvm"``: the host, or $TVMGRAD_CPU) on aligned arrays, as they
    run: a roof of baseline x86-64 code (16-byte SSE moves) would sit below what the kernels
    reach. A copy that the kernels' size would stream (tvmgrad/streaming.py) is streamed too,
    as the kernels then are: an ordinary copy pays the read for ownership that they skip."""
    import tvm
    from tvm import s_tir, te

    from . import streaming
    from .runtime import aligned_empty
    from .schedules.cpu._isa import vector_unit
    from .targets import resolve
    half = max(nbytes // 2 // 4, 64)
    half -= half % 64
    a = te.placeholder((half,), "float32", name="a")
    b = te.compute((half,), lambda i: a[i], name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]).with_attr("global_symbol", "copy"))
    target = resolve("llvm").target
    stream = streaming.large_enough(half * 4)
    lanes = vector_unit(target).lanes("float32") if stream else 64   # whole aligned vectors
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, lanes])
    sch.parallel(outer)
    sch.vectorize(inner)
    module = tvm.compile(sch.mod, target=target)
    kernel = (streaming.recompile(module.mod) if stream else module)["copy"]
    src, dst = aligned_empty((half,), np.float32), aligned_empty((half,), np.float32)
    src[:] = np.random.default_rng(0).random(half, dtype=np.float32)
    return (lambda: kernel(src, dst)), 2 * src.nbytes


def copy_roofline(nbytes: int, repeat: int) -> float:
    """GB/s of ``copy_kernel(nbytes)``, best of ``repeat`` calls."""
    copy, moved = copy_kernel(nbytes)
    best, _ = best_and_median(copy, repeat)
    return moved / best / 1e9
