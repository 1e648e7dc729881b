"""Streaming stores: a CPU kernel whose outputs are far larger than the caches writes them with
non-temporal stores, when they are already in memory.

An ordinary store to a line that is not in the cache first reads that line from memory (a
read for ownership), so a kernel that reads two arrays and writes a third moves four arrays'
bytes, not three. Non-temporal stores write whole lines through write-combining buffers and
skip that read. Measured on a 2-core Sapphire Rapids class VM (2 threads, relu_grad, float32,
2^24 elements, 2 MiB of L2 per core; in-process best of 10), in ms:

====================================================  ========  ========
output memory                                         streamed  ordinary
====================================================  ========  ========
already in memory (an ``out=`` buffer reused, or       3.7-3.9   5.6-5.8
glibc keeping freed memory, as ``tvmgrad bench`` runs)
freshly mapped (``np.empty`` of 64 MiB: an mmap        10.2-10.4  8.6-8.7
whose pages fault in during the kernel)
====================================================  ========  ========

Onto fresh pages streaming loses: the kernel zeroes each page as it faults in, through the
cache, and the non-temporal stores then evict those dirty lines. So a streamed plan runs as
``Streaming``: the streamed kernel and its ordinary twin, the streamed one called only when the
outputs hold ``min_bytes`` together and each is aligned and already in memory (its first, middle
and last pages resident: ``mincore``, a few microseconds against a kernel of milliseconds).

``min_bytes``: ``L2_MULTIPLE`` times the L2 of the threads that run the kernel (below that the
output could have stayed in their caches for its consumer: under the L2, 3 MiB of data here,
streamed stores measured 2x slower; from 6 to 96 MiB equal), or ``$TVMGRAD_STREAM_MIN_BYTES``
(a byte count, or ``off``).

TVM has no store hint, so the kernel is compiled as usual and its LLVM IR (already vectorised)
gets ``!nontemporal`` on the vector stores of its body that are aligned to their size, then is
compiled again from that text (``recompile``). Its schedule (``schedules/cpu/stream_stores.py``)
and its outputs, declared 64-byte aligned, make its stores so; the runtime calls it only on
aligned outputs. (Unaligned ones would become 8-byte ``movnti`` pieces: relu_grad 4.8 ms,
and the extra instructions took gelu_grad and silu_grad to 0.72x and 0.56x of the ordinary
kernel.) Aligned, onto outputs in memory, against the ordinary kernel: relu_grad 1.52x,
sigmoid_grad 1.45x, tanh_double_grad 1.65x, atan2_grad 1.55x. Only memory-bound bodies
stream (``memory_bound``).

A family opts a plan in by setting ``Plan.stream_bytes`` (the output bytes of a kernel that
writes each output element once, by contiguous vector stores, and stores nothing else in its
body); ``planning`` marks it streamed (``streamed``) for an LLVM target when the call is large
enough. The mark is part of the cache key, not of the variant: a prepared launch keeps serving
every size (``Plan.variant_key``), its ``Streaming`` choosing per call.

A family may instead give its own streamed kernel (``Plan.stream_variant``), built for its
rows' length (a whole number of ``ROW_MULTIPLE`` elements) so that LLVM proves each row's
vector stores aligned; ``Streaming`` runs it only on calls of that length (``Plan.baked``), and
only the stores into its outputs are marked (a row's partial sums, in scratch, must stay in the
cache). At 2^24 elements (2 threads, in-process best of 15 turns), ordinary -> streamed:

* the row kernels of the norm and softmax grads (tvmgrad/families/view.py) keep their
  schedule: their outputs are written once each row is reduced, from data still in the L2, and
  streamed, that pass no longer reads the output lines first. AVX-512: group_norm_grad
  9.7 -> 6.0 ms (AVX2 8.9 -> 6.7), layer_norm_grad 10.0 -> 6.0, rms_norm_grad 9.2 -> 5.3,
  instance_norm_grad 12.3 -> 9.5, gumbel_softmax_grad 7.6 -> 4.3. Only memory-bound ones:
  log_softmax_grad (its exp) gained 10 % into one output buffer used again and again, but
  writing a new one each call (as ``tvmgrad.run`` and the bench do, the memory already mapped)
  it went from 5.6-6.8 to 10.6-11.6 ms, a slowdown the memory-bound kernels do not show
  (group_norm, layer_norm, concat, relu: within noise of the reused buffer);
* the generic shape kernels (tvmgrad/families/shape.py) take the stream_stores schedule, over
  rows of the baked length: concat_grad 6.2 -> 3.0 ms (AVX2 6.4 -> 4.0).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import mmap
import math
import os
import re
import tempfile

import numpy as np

__all__ = ["L2_MULTIPLE", "ROW_MULTIPLE", "ENV", "min_bytes", "large_enough", "output_bytes",
           "streamed", "memory_bound",
           "Streaming",
           "mark_nontemporal", "recompile"]

L2_MULTIPLE = 8
# A family's own streamed kernel bakes in its outputs' row length when it is a whole number of
# this many elements (64 bytes of float32: an AVX-512 vector), so that every vector store of a
# row is aligned (tvmgrad/families/view.py, shape.py)
ROW_MULTIPLE = 16
ENV = "TVMGRAD_STREAM_MIN_BYTES"       # bytes, "auto" (the default) or "off"
MARK = ("stream",)                     # what a streamed plan's key ends with
PATTERN = "stream_stores"              # its schedule (schedules/cpu/stream_stores.py)
_DEFAULT_L2 = 1 << 20                  # where the OS does not say


def min_bytes() -> int | None:
    """The output bytes from which a CPU kernel streams its stores (None: never):
    ``$TVMGRAD_STREAM_MIN_BYTES`` (a byte count, ``auto`` or ``off``), by default ``auto``:
    L2_MULTIPLE x the L2 of one core x the kernel threads (``TVM_NUM_THREADS``, else the cores
    this process may use)."""
    text = os.environ.get(ENV, "").strip().lower() or "auto"
    if text == "off":
        return None
    if text == "auto":
        threads = os.environ.get("TVM_NUM_THREADS", "").strip()
        count = (int(threads) if threads.isdigit() and int(threads) > 0
                 else len(os.sched_getaffinity(0)))
        return L2_MULTIPLE * _l2_bytes() * count
    try:
        return max(0, int(text))
    except ValueError:
        raise ValueError(f"${ENV} must be a number of bytes, 'auto' or 'off', not "
                         f"{os.environ[ENV]!r}") from None


@functools.lru_cache(maxsize=1)
def _l2_bytes() -> int:
    """The level-2 cache of CPU 0 (Linux sysfs), else 1 MiB."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(root)):
            with open(f"{root}/{index}/level") as fh:
                if fh.read().strip() != "2":
                    continue
            with open(f"{root}/{index}/size") as fh:
                return _size(fh.read())
    except (OSError, ValueError):
        pass
    return _DEFAULT_L2


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def large_enough(nbytes: int) -> bool:
    """Would ``nbytes`` of output stream on this host (``min_bytes``)?"""
    least = min_bytes()
    return least is not None and nbytes >= least


def output_bytes(outputs) -> int:
    """The bytes a kernel writes, from its outputs' metas (None: an output not asked for; a
    list: a list output's tensors): a plan's ``stream_bytes``."""
    return sum(math.prod(m.shape) * m.dtype.numpy.itemsize
               for o in outputs if o is not None for m in (o if isinstance(o, list) else [o]))


def streamed(plan):
    """``plan`` marked to stream its stores when it is a candidate, large enough for this host,
    whose body is memory-bound (``memory_bound``): its own variant (``Plan.stream_variant``; one
    under the stream_stores schedule only where that fits it), else the plan itself under the
    stream_stores schedule. Otherwise ``plan`` itself."""
    if plan.plain is not None or plan.stream_bytes is None or plan.trace is not None:
        return plan
    if not large_enough(plan.stream_bytes) or not memory_bound(plan):
        return plan
    if plan.stream_variant is not None:       # the family's own kernel
        own = plan.stream_variant()
        if own.pattern == PATTERN and not _fits(own):
            return plan
        return dataclasses.replace(own, key=own.key + MARK, symbol=own.symbol + "_stream",
                                   plain=dataclasses.replace(plan, stream_variant=None))
    return dataclasses.replace(plan, key=plan.key + MARK, symbol=plan.symbol + "_stream",
                               pattern=PATTERN, plain=plan)


# calls that cost an instruction or two: a body that makes no other call moves bytes faster than
# it computes. exp, erf, pow and the like are polynomials of tens of operations per element: at
# 2 threads gelu_grad and silu_grad are compute-bound, and their explicitly vectorised streamed
# form measured 0.36x and 0.86x of the ordinary kernel (LLVM's own vectoriser interleaves four
# vectors of such chains)
CHEAP_CALLS = frozenset({
    "tirx.fabs", "tirx.sqrt", "tirx.floor", "tirx.ceil", "tirx.trunc", "tirx.round",
    "tirx.nearbyint", "tirx.copysign", "tirx.isnan", "tirx.isinf", "tirx.isfinite",
    "tirx.if_then_else", "tirx.likely", "tirx.reinterpret"})


def _fits(plan) -> bool:
    """Does the stream_stores schedule fit the plan's kernel? (It is built to see.)"""
    from tvm import s_tir

    from .schedules.cpu.stream_stores import RULE
    return RULE.why_not(s_tir.Schedule(plan.make())) is None


def memory_bound(plan) -> bool:
    """Does the plan's kernel call nothing dearer than ``CHEAP_CALLS``? (It is built to see.)"""
    from tvm import s_tir

    from .schedules.analysis import called_ops, top_blocks
    sch = s_tir.Schedule(plan.make())
    return all(called_ops(sch, block) <= CHEAP_CALLS for block in top_blocks(sch))


class Streaming:
    """A streamed kernel and its ordinary twin behind one call: the streamed one runs when the
    output arguments (``outputs``: their positions) hold at least ``least`` bytes together and
    each is ``align``-byte aligned (TVM's default, which ``build`` keeps on a streamed kernel's
    outputs: its stores are aligned vectors) with its sampled pages all resident, and the
    arguments have the sizes it was built for (``baked``: (position, axis, size) triples,
    ``Plan.baked``); else, or where that cannot be told, the ordinary one. ``last`` says which
    ran ("streamed" / "plain"). The runtime allocates a streamed launch's outputs so aligned."""

    def __init__(self, plain, streamed, outputs, least: int, align: int, baked=()):
        self.plain, self.streamed, self.outputs = plain, streamed, tuple(outputs)
        self.least, self.align, self.baked = least, align, tuple(baked)
        self.last = None

    def __call__(self, *args):
        sizes = [_streamable(args[i], self.align) for i in self.outputs]
        use = (None not in sizes and sum(sizes) >= max(self.least, 1)
               and all(_extent(args[i], axis) == size for i, axis, size in self.baked))
        self.last = "streamed" if use else "plain"
        return (self.streamed if use else self.plain)(*args)


def _streamable(array, align: int) -> int | None:
    """The bytes of ``array`` if it is ``align``-byte aligned with its first, middle and last
    pages in memory, else None."""
    try:
        if isinstance(array, np.ndarray):
            start, size = array.ctypes.data, array.nbytes
        else:
            import tvm_ffi
            from .rt import to_tensor
            t = to_tensor(array)
            dt = tvm_ffi.dtype(str(t.dtype))
            start, size = t.data_ptr(), math.prod(t.shape) * dt.bits * dt.lanes // 8
    except Exception:  # noqa: BLE001 - an argument we cannot look into: the ordinary kernel
        return None
    if size <= 0 or start % align or _MINCORE is None:
        return None
    page = mmap.PAGESIZE
    flag = ctypes.c_ubyte()
    for at in (start, start + size // 2, start + size - 1):
        if _MINCORE(ctypes.c_void_p(at - at % page), ctypes.c_size_t(page), ctypes.byref(flag)) \
                or not flag.value & 1:
            return None
    return size


def _extent(array, axis: int) -> int | None:
    """``array``'s size along ``axis`` (None where it cannot be told)."""
    try:
        return int(array.shape[axis])
    except Exception:  # noqa: BLE001 - an argument we cannot look into: the ordinary kernel
        return None


def _mincore():
    try:
        fn = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
    fn.restype = ctypes.c_int
    return fn


_MINCORE = _mincore()


# -- the LLVM IR pass --------------------------------------------------------------------------

_DEFINE = re.compile(r"^define [^@]*@([\w.$]+)\(")
_VECTOR_STORE = re.compile(
    r"^\s*store <(\d+) x (half|bfloat|float|double)> .*, ptr (%[\w.$]+), align (\d+)\b")
_GEP = re.compile(r"^\s*(%[\w.$]+) = getelementptr (?:inbounds |nuw |nusw )*[^,]+, ptr (%[\w.$]+),")
_BYTES = {"half": 2, "bfloat": 2, "float": 4, "double": 8}
_METADATA_ID = re.compile(r"!(\d+)\b")


def mark_nontemporal(ll: str, pointers=None) -> tuple[str, int]:
    """(``ll`` with ``!nontemporal`` on every floating-point vector store in the kernel's own
    functions that is aligned to its size, the number marked). An under-aligned one would be
    written as 8-byte ``movnti`` pieces, extra instructions in every step, and is left as it is
    (a tail). The packed-call wrappers (``__tvm_ffi_*``) and TVM's helpers
    (``__tvm_set_raised*``) are left alone: what they store is argument bookkeeping.
    ``pointers``: the names of the output buffers (the kernel's parameters): only stores into
    them (through ``getelementptr`` chains from them) are marked, not those into the kernel's
    own scratch (a per-row partial sum, read back at once, must stay in the cache)."""
    ids = [int(m) for m in _METADATA_ID.findall(ll)]
    node = f"!{max(ids, default=0) + 1}"
    out, marked, body = [], 0, False
    lines = ll.split("\n")
    derived = set()
    for at, line in enumerate(lines):
        head = _DEFINE.match(line)
        if head:
            name = head.group(1)
            body = not name.startswith(("__tvm_ffi_", "__tvm_set_raised"))
            if pointers is not None:
                derived = _derived(lines, at, {f"%{p}" for p in pointers})
        elif line.startswith("}"):
            body = False
        elif body and "!nontemporal" not in line and (store := _VECTOR_STORE.match(line)):
            lanes, element, pointer, align = store.groups()
            if int(align) >= int(lanes) * _BYTES[element] and (pointers is None
                                                               or pointer in derived):
                line += f", !nontemporal {node}"
                marked += 1
        out.append(line)
    text = "\n".join(out)
    if marked:
        text += f"\n{node} = !{{i32 1}}\n"
    return text, marked


def _derived(lines, start: int, roots: set) -> set:
    """The values of the function defined at ``lines[start]`` that point into ``roots`` (the
    roots themselves and the ``getelementptr`` results based on one, to a fixed point: a loop's
    body may come before its preheader in the text)."""
    geps = []
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        if (gep := _GEP.match(line)) is not None:
            geps.append(gep.groups())
    derived, grown = set(roots), True
    while grown:
        grown = False
        for value, base in geps:
            if base in derived and value not in derived:
                derived.add(value)
                grown = True
    return derived


def recompile(module, pointers=None):
    """An LLVM module compiled again from its IR with the kernel's vector stores (into
    ``pointers``, its output buffers' names, where given) non-temporal (``mark_nontemporal``);
    ``module`` itself where it has none (LLVM left the body scalar).
    Target, CPU and features travel in the IR (its ``tvm_target`` flag and function
    attributes)."""
    import tvm
    text, marked = mark_nontemporal(module.inspect_source("ll"), pointers)
    if not marked:
        return module
    with tempfile.TemporaryDirectory(prefix="tvmgrad-stream-") as tmp:
        path = os.path.join(tmp, "kernel.ll")
        with open(path, "w") as fh:
            fh.write(text)
        return tvm.runtime.load_module(path)
