"""``tvmgrad bench``: our LLVM kernels side by side with PyTorch CPU, Paddle CPU and the memory
roofline, in one run, as ratios (their time over ours: > 1 means tvmgrad is faster).

Fair by construction:
* each framework runs in its own process, with the same thread count (``--threads``, default
  the cores this process may use), the processes taking turns op by op (``--rounds`` turns
  each, best of all): no thread pool spins against another, and both sides of a ratio are timed
  within seconds of each other (a shared VM's bandwidth drifts by tens of percent in minutes);
* the same allocation policy on every side: every call allocates its outputs, and glibc is told
  to keep freed memory mapped (``MALLOC_MMAP_MAX_=0``, ``MALLOC_TRIM_THRESHOLD_``), so no side
  pays page faults the other does not;
* the same vector ISA: when the target has AVX2 but not AVX-512 (``$TVMGRAD_CPU=x86-64-v3`` on
  an AVX-512 host), PyTorch's and Paddle's kernels are held to AVX2 too (``same_isa_caps``);
* the roofline is a parallel copy of the same bytes on the same threads (a TVM kernel built for
  the kernels' target, on aligned arrays, with streaming stores at the sizes where the kernels
  stream theirs), not a single-thread numpy copy, its calls taking turns with the kernel's (both
  see the same moments of a drifting memory bandwidth). A kernel that reads two arrays for each
  it writes can beat it: this VM's memory moved a 2:1 mix of streamed reads and writes at
  ~44 GB/s, a 1:1 copy at ~39;
* times are the best and the median of ``--repeat`` calls after two warm-up calls; bytes are every
  input the kernel reads (silu_grad is passed ``out`` and never reads it) plus every output
  written.

Paddle and PyTorch are optional (neither is a tvmgrad dependency: ``pip install paddlepaddle``,
``pip install torch``): without one, its columns read n/a and a note says why.
``--suite`` benchmarks a fixed list covering every family (``SUITE``).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import registry
from .workloads import best_and_median, copy_kernel, make_inputs, taking_turns

__all__ = ["main", "SUITE", "run_suite", "same_isa_caps"]

# Every family, at the inputs benchrefs give it (the dense, norm and attention ops at realistic
# model shapes; pointwise ops at 2**24 elements).
SUITE = (
    "conv2d_grad", "depthwise_conv2d_grad", "conv3d_grad", "bmm_grad", "addmm_grad",
    "flash_attn_grad", "fft_c2c_grad", "svd_grad", "cholesky_grad", "group_norm_grad",
    "layer_norm_grad", "rms_norm_grad", "log_softmax_grad", "cross_entropy_with_softmax_grad",
    "take_along_axis_grad", "index_select_grad", "gather_grad", "pad3d_grad", "grid_sample_grad",
    "bilinear_interp_grad", "relu_grad", "sigmoid_grad", "silu_grad", "gelu_grad",
    "tanh_double_grad", "atan2_grad", "concat_grad", "warpctc_grad", "cumsum_grad",
    "max_pool2d_with_index_grad", "topk_grad", "roi_align_grad",
)

# Paddle 3.3.1 bindings known to crash (memory corruption) for these variants.
PADDLE_CRASHES = {("atan2_grad", True)}


# -- Paddle / PyTorch -----------------------------------------------------------------------

OPTIONAL = {"paddle": "pip install paddlepaddle", "torch": "pip install torch"}


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


# -- one framework's process -------------------------------------------------------------------

FRAMEWORKS = ("tvmgrad", "torch", "paddle")


def _nbytes(value) -> int:
    return sum(_nbytes(v) for v in value) if isinstance(value, list) else getattr(value, "nbytes", 0)


def _read_by_kernel(plan) -> set:
    """The input names whose arrays the plan's kernel reads: those whose parameter buffer a block
    of its function names in ``T.reads``; every input when none does (a kernel of extern calls)."""
    import re
    func = plan.make()
    reads = " ".join(re.findall(r"T\.reads\((.*)\)", func.script()))
    inputs = {a.name for a in plan.args if a.kind == "input"}
    read = {a.name for a, param in zip(plan.args, func.params)
            if a.kind == "input" and re.search(rf"\b{re.escape(str(param.name))}\[", reads)}
    return read or inputs


def _aligned(value):
    """``value`` in 64-byte aligned memory: the runtime copies arrays that are not (the kernels
    are built assuming it), which is not the kernel's time."""
    if isinstance(value, list):
        return [_aligned(v) for v in value]
    if not isinstance(value, np.ndarray):
        return value
    from .runtime import aligned_empty
    out = aligned_empty(value.shape, value.dtype)
    np.copyto(out, value)
    return out


def _measure(framework: str, job: dict) -> dict:
    """Time one op in this process: tvmgrad's kernel (and the roofline of its bytes), or a
    reference framework's call on the same inputs."""
    op, size, dtype, bcast, repeat = (job[k] for k in ("op", "size", "dtype", "broadcast", "repeat"))
    inputs, attrs = make_inputs(op, size, dtype, bcast)
    if framework == "tvmgrad":
        from .runtime import prepare
        inputs = {k: _aligned(v) for k, v in inputs.items()}
        launch = prepare(op, inputs, attrs)
        result = launch()
        read = _read_by_kernel(launch.plan) if launch.plan.make is not None else set(inputs)
        nbytes = (sum(_nbytes(v) for k, v in inputs.items() if k in read)
                  + sum(_nbytes(v) for v in result.values()))
        copy, moved = copy_kernel(nbytes)
        (best, median), (copy_best, _) = taking_turns([launch, copy], repeat)
        from .benchrefs import flop_counts
        count = flop_counts().get(op)
        return {"best_ms": best * 1e3, "median_ms": median * 1e3, "bytes": nbytes,
                "roofline_gbs": moved / copy_best / 1e9,
                "flops": count(inputs, attrs) if count else None}
    make = _torch_fn if framework == "torch" else _paddle_fn
    if framework == "paddle" and (op, bcast) in PADDLE_CRASHES:
        return {"missing": "its binding crashes for this call"}
    if _optional(framework) is None:
        return {"missing": "not installed"}
    fn = make(op, inputs, attrs)
    if fn is None:
        return {"missing": "no reference for this op"}
    best, median = best_and_median(fn, repeat)
    return {"best_ms": best * 1e3, "median_ms": median * 1e3}


def _worker(framework: str) -> int:
    """``python -m tvmgrad.bench FRAMEWORK``: one job (JSON) per stdin line, one JSON result line
    back per job, until stdin closes."""
    threads = int(os.environ.get("TVM_NUM_THREADS", "1"))
    if framework == "torch" and _optional("torch") is not None:
        import torch
        torch.set_num_threads(threads)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            result = _measure(framework, job)
        except Exception as exc:  # noqa: BLE001 - one failing reference must not end the table
            result = {"missing": f"{type(exc).__name__}: {exc}"[:200]}
        print(json.dumps({"op": job["op"], "broadcast": job["broadcast"], **result}), flush=True)
    return 0


def _environment(threads: int) -> dict:
    """Same threads and the same allocator policy for every framework's process."""
    env = dict(os.environ)
    for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["MALLOC_MMAP_MAX_"] = "0"                       # large buffers from the heap too ...
    env["MALLOC_TRIM_THRESHOLD_"] = str(1 << 62)         # ... which is never given back
    env["MALLOC_TOP_PAD_"] = str(1 << 28)
    return env


# what holds ATen's kernel dispatch, oneDNN and MKL to AVX2 code
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def same_isa_caps() -> dict:
    """Environment variables that hold PyTorch's and Paddle's CPU kernels to the vector ISA of the
    code tvmgrad runs: with ``$TVMGRAD_CPU=x86-64-v3`` on an AVX-512 host both sides run AVX2
    code (else torch's AVX-512 kernels would be timed against our AVX2 ones). Empty when the
    target has AVX-512 (or is not an AVX2 x86 CPU): each side then uses what the host has."""
    from .targets import resolve
    features = resolve("llvm").features
    if "avx2" in features and "avx512f" not in features:
        return dict(AVX2_CAPS)
    return {}


# Seconds between two frameworks' turns: an idle thread pool spins a while after its last call
# before it sleeps, and the next side's timing must not share the cores with it. Measured on a
# 2-core VM (CPU time of the idle process): tvmgrad's worker spins one core for ~0.15 s after
# its turn; torch's and paddle's used none.
SETTLE_S = 0.5


class _Worker:
    """One framework's measuring process, kept for the whole run and given one job at a time, so
    the frameworks take turns op by op. A process that dies (a signal, a crash in a binding)
    costs its current job only: its stdout closes, the job reads as missing with the last line
    of its stderr, and the next job starts a fresh process."""

    def __init__(self, framework: str, threads: int):
        self.framework, self.threads = framework, threads
        self.proc = None
        self.stderr = None

    def _start(self):
        env = _environment(self.threads)
        if self.framework != "tvmgrad":
            env.update(same_isa_caps())
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "tvmgrad.bench", self.framework],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=env)

    def measure(self, job: dict) -> dict:
        if self.proc is None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:            # libraries may print lines of their own
                if line.startswith("{"):
                    return json.loads(line)
        except BrokenPipeError:
            pass
        return {"missing": f"its process failed: {self._failure()}"}

    def _failure(self) -> str:
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().strip().splitlines()[-1:] or [f"exit code {code}"]
        self.stderr.close()
        self.proc = None
        return tail[0][:200]

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
            self.stderr.close()
            self.proc = None


def _merge_turn(kept: dict | None, new: dict) -> dict:
    """One op's measurement over turns: the best time of any turn with the median of the turns'
    medians (the roofline: the fastest copy seen); a turn that failed counts for nothing."""
    if kept is None or "missing" in kept:
        return {**new, "medians": [new["median_ms"]]} if "best_ms" in new else new
    if "missing" in new:
        return kept
    merged = dict(kept if kept["best_ms"] <= new["best_ms"] else new)
    merged["medians"] = kept["medians"] + [new["median_ms"]]
    merged["median_ms"] = float(np.median(merged["medians"]))
    if "roofline_gbs" in kept:
        merged["roofline_gbs"] = max(kept["roofline_gbs"], new["roofline_gbs"])
    return merged


def run_suite(specs, *, size: int, dtype: str, repeat: int, threads: int,
              rounds: int = 1) -> list[dict]:
    """One row per ``op[:bcast]`` spec: every framework timed in its own process, the processes
    taking turns op by op, ``rounds`` turns each (a shared VM's memory bandwidth drifts by tens
    of percent between minutes: timing one framework's whole list after the other's would time
    the two sides in different minutes)."""
    if rounds < 1:
        raise ValueError(f"bench: rounds must be at least 1, got {rounds}")
    jobs = []
    for spec in specs:
        op, _, variant = spec.partition(":")
        registry.get(op)                                  # unknown op -> ValueError now
        jobs.append({"op": op, "broadcast": variant in ("bcast", "broadcast"), "size": size,
                     "dtype": dtype, "repeat": repeat})
    measured = {fw: {} for fw in FRAMEWORKS}
    workers = [_Worker(fw, threads) for fw in FRAMEWORKS]
    try:
        for job in jobs:
            key = (job["op"], job["broadcast"])
            for _ in range(rounds):
                for worker in workers:
                    result = worker.measure(job)
                    measured[worker.framework][key] = _merge_turn(
                        measured[worker.framework].get(key), result)
                    time.sleep(SETTLE_S)
    finally:
        for worker in workers:
            worker.close()
    rows = []
    for job in jobs:
        key = (job["op"], job["broadcast"])
        ours = measured["tvmgrad"].get(key, {"missing": "no result"})
        row = {"op": job["op"] + (" (broadcast)" if job["broadcast"] else ""), "threads": threads}
        if "missing" in ours:
            row["error"] = ours["missing"]
            rows.append(row)
            continue
        t = ours["best_ms"] / 1e3
        row.update(ms=ours["best_ms"], median_ms=ours["median_ms"], gbs=ours["bytes"] / t / 1e9,
                   roofline_gbs=ours["roofline_gbs"],
                   gflops=ours["flops"] / t / 1e9 if ours.get("flops") else None)
        row["roofline"] = row["gbs"] / ours["roofline_gbs"]
        for fw in ("torch", "paddle"):
            other = measured[fw].get(key, {"missing": "no result"})
            row[f"{fw}_ms"] = other.get("best_ms")
            row[f"{fw}_median_ms"] = other.get("median_ms")
            row[f"x_{fw}"] = other["best_ms"] / ours["best_ms"] if "best_ms" in other else None
            if "missing" in other:
                row[f"{fw}_missing"] = other["missing"]
        rows.append(row)
    return rows


def main(args) -> int:
    threads = getattr(args, "threads", None) or len(os.sched_getaffinity(0))
    specs = list(SUITE) if getattr(args, "suite", False) else list(args.ops or [])
    if not specs:
        raise ValueError("name ops to benchmark, or --suite")
    rounds = getattr(args, "rounds", 1)
    rows = run_suite(specs, size=args.size, dtype=args.dtype, repeat=args.repeat, threads=threads,
                     rounds=rounds)
    missing = {fw: how for fw, how in OPTIONAL.items()      # as its own process found it
               if any(r.get(f"{fw}_missing") == "not installed" for r in rows)}
    if getattr(args, "json", False):
        print(json.dumps({"size": args.size, "dtype": args.dtype, "threads": threads, "rounds": rounds,
                          "reference_isa_caps": same_isa_caps(),
                          "missing": sorted(missing), "rows": rows}, indent=1, default=str))
        return 0
    turns = (f"{rounds} turns each (best of all, median of the turns' medians)" if rounds > 1
             else "one turn each")
    print(f"{args.dtype}, {threads} threads per framework, each in its own process, taking turns op "
          f"by op, {turns}; allocator keeps freed memory; roof = a {threads}-thread copy of the same "
          f"bytes")
    caps = same_isa_caps()
    if caps:
        print("torch and paddle held to the target's ISA: " + " ".join(f"{k}={v}" for k, v in caps.items()))
    for name, how in missing.items():
        print(f"{name} is not installed: its columns read n/a ({how})")
    header = (f"{'op':<34} {'tvmgrad ms':>10} {'median':>8} {'GB/s':>7} {'%roof':>6} "
              f"{'torch ms':>9} {'x torch':>8} {'paddle ms':>10} {'x paddle':>8}")
    print(header)
    print("-" * len(header))

    def num(v, width, fmt):
        return f"{v:{width}{fmt}}" if v is not None else f"{'n/a':>{width}}"
    for r in rows:
        if "error" in r:
            print(f"{r['op']:<34} failed: {r['error']}")
            continue
        flops = f" {r['gflops']:.1f} GFLOP/s" if r["gflops"] else ""
        print(f"{r['op']:<34} {r['ms']:10.3f} {r['median_ms']:8.3f} {r['gbs']:7.1f} "
              f"{100 * r['roofline']:5.0f}% {num(r['torch_ms'], 9, '.3f')} {num(r['x_torch'], 8, '.2f')} "
              f"{num(r['paddle_ms'], 10, '.3f')} {num(r['x_paddle'], 8, '.2f')}{flops}")
    print("x torch / x paddle: their best time over ours (> 1: tvmgrad is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
