"""Streaming stores: a CPU kernel whose outputs are far larger than the caches may write them
with non-temporal stores. Opt-in (``$TVMGRAD_STREAM_MIN_BYTES``), for the reason below.

An ordinary store to a line that is not in the cache first reads that line from memory (a
read for ownership), so a kernel that reads two arrays and writes a third moves four arrays'
bytes, not three. Non-temporal stores write whole lines through write-combining buffers and
skip that read. Measured on a 2-core Sapphire Rapids class VM (2 threads, relu_grad, float32,
2^24 elements, 2 MiB of L2 per core), in ms:

====================================================  ========  ======
output memory                                         streamed  normal
====================================================  ========  ======
already mapped (``out=`` a reused buffer, or glibc     4.7-4.9   5.4-6.1
keeping freed memory as ``tvmgrad bench`` runs)
freshly mapped (``np.empty`` of 64 MiB: an mmap        12.0      8.3-8.5
whose pages fault in during the kernel)
====================================================  ========  ======

Onto fresh pages streaming loses: the kernel zeroes each page as it faults in, through the
cache, and the non-temporal stores then evict those dirty lines. So it is off unless asked for:
``$TVMGRAD_STREAM_MIN_BYTES`` = a byte count, or ``auto`` (``L2_MULTIPLE`` times the L2 of the
threads that run the kernel: below that the output could have stayed in their caches for its
consumer; under the L2, 3 MiB of data here, streamed stores measured 2x slower, from 6 to 96 MiB
equal). Turning it on by default needs the runtime to stream only onto resident pages
(``mincore``), with both kernels at hand.

TVM has no store hint, so the kernel is compiled as usual and its LLVM IR (already vectorised)
gets ``!nontemporal`` on the vector stores of its body, then is compiled again from that text
(``recompile``). The stores keep their alignment: where LLVM cannot prove a full vector's
alignment (the CPU kernels assume element-aligned buffers), the X86 backend writes them as
8-byte ``movnti``, still non-temporal and never a fault on an unaligned address (aligned
``vmovntps`` measured 3.5 ms above: a further 1.1x, for kernels that could rely on 64-byte
aligned outputs).

A family opts a plan in by setting ``Plan.stream_bytes`` (the output bytes of a kernel that
writes each output element once, by contiguous vector stores, and stores nothing else in its
body); ``planning`` marks it streamed (``streamed``) for an LLVM target when the call is large
enough. The mark is part of the cache key, not of the variant: a prepared launch keeps serving
every size (``Plan.variant_key``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile

__all__ = ["L2_MULTIPLE", "ENV", "min_bytes", "streamed", "mark_nontemporal", "recompile"]

L2_MULTIPLE = 8
ENV = "TVMGRAD_STREAM_MIN_BYTES"       # bytes, "auto" or "off" (the default)
MARK = ("stream",)                     # what a streamed plan's key ends with
_DEFAULT_L2 = 1 << 20                  # where the OS does not say


def min_bytes() -> int | None:
    """The output bytes from which a CPU kernel streams its stores (None: never, the default):
    ``$TVMGRAD_STREAM_MIN_BYTES`` as a byte count, or ``auto``: L2_MULTIPLE x the L2 of one
    core x the kernel threads (``TVM_NUM_THREADS``, else the cores this process may use)."""
    text = os.environ.get(ENV, "").strip().lower()
    if not text or text == "off":
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


def streamed(plan):
    """``plan`` marked to stream its stores when it is a candidate large enough for this host;
    else ``plan`` itself."""
    if plan.stream or plan.stream_bytes is None or plan.trace is not None:
        return plan
    least = min_bytes()
    if least is None or plan.stream_bytes < least:
        return plan
    return dataclasses.replace(plan, key=plan.key + MARK, symbol=plan.symbol + "_stream",
                               stream=True)


# -- the LLVM IR pass --------------------------------------------------------------------------

_DEFINE = re.compile(r"^define [^@]*@([\w.$]+)\(")
_VECTOR_STORE = re.compile(r"^\s*store <\d+ x (?:half|bfloat|float|double)> ")
_METADATA_ID = re.compile(r"!(\d+)\b")


def mark_nontemporal(ll: str) -> tuple[str, int]:
    """(``ll`` with ``!nontemporal`` on every floating-point vector store in the kernel's own
    functions, the number marked). The packed-call wrappers (``__tvm_ffi_*``) and TVM's helpers
    (``__tvm_set_raised*``) are left alone: what they store is argument bookkeeping."""
    ids = [int(m) for m in _METADATA_ID.findall(ll)]
    node = f"!{max(ids, default=0) + 1}"
    out, marked, body = [], 0, False
    for line in ll.split("\n"):
        head = _DEFINE.match(line)
        if head:
            name = head.group(1)
            body = not name.startswith(("__tvm_ffi_", "__tvm_set_raised"))
        elif line.startswith("}"):
            body = False
        elif body and _VECTOR_STORE.match(line) and "!nontemporal" not in line:
            line += f", !nontemporal {node}"
            marked += 1
        out.append(line)
    text = "\n".join(out)
    if marked:
        text += f"\n{node} = !{{i32 1}}\n"
    return text, marked


def recompile(module):
    """An LLVM module compiled again from its IR with the kernel's vector stores non-temporal
    (``mark_nontemporal``); ``module`` itself where it has none (LLVM left the body scalar).
    Target, CPU and features travel in the IR (its ``tvm_target`` flag and function
    attributes)."""
    import tvm
    text, marked = mark_nontemporal(module.inspect_source("ll"))
    if not marked:
        return module
    with tempfile.TemporaryDirectory(prefix="tvmgrad-stream-") as tmp:
        path = os.path.join(tmp, "kernel.ll")
        with open(path, "w") as fh:
            fh.write(text)
        return tvm.runtime.load_module(path)
