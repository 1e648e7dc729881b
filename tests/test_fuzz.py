"""Fuzzing every op with bad calls derived from its example (``tvmgrad.examples.sample``).

For each op, mutated calls of every class below are run in child processes (one child per batch of
ops; a crash or a hang is caught by the parent and names the op and the mutation). Each outcome
must be the correct result or a ``ValueError``/``TypeError`` whose message names the op and the
mutated argument, raised before any kernel is built:

==============  ===============================================================  ==================
class           mutation                                                         expected
==============  ===============================================================  ==================
drop            leave out one tensor (or element 0 of a Tensor[])                error (optional:
                                                                                 result or error)
extra           add an unknown tensor                                            error
dtype           a float tensor in float32 among float64 ones, a float tensor as  error
                int64, an index tensor as float64
rank            one tensor with an extra leading dim / without its last dim      error
size            one tensor's last dim one larger                                 error
zero            one tensor's first dim 0 (error); that size 0 in every tensor    error / result
                (a consistent size-0 call: a result or an error, never a crash)
layout          strided, Fortran-order, misaligned, read-only, mmap'ed inputs    = contiguous call
nonfinite       NaN/±Inf in one float tensor                                     no crash
index           1e6, -1e6 (error) or -1 (either) in an integer tensor            error / either
attr            ±1e6 in an int attribute (axis-like ones: error), NaN in a float  no crash / error
==============  ===============================================================  ==================

Where an accepted call is nonetheless valid (a broadcasting input, a value tensor that holds any
integer), ``ACCEPTS`` says so, with the reason. Failures in code this suite does not own are
listed in ``KNOWN`` exactly (op, mutation) -> outcome; an entry that starts passing fails the test
so that the list stays honest.

The default run sweeps a deterministic sample (a few ops per family, every mutation class);
``pytest -m slow`` sweeps every op. ``python tests/test_fuzz.py [--all | OP ...]`` prints a report.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = 10 ** 6

# attributes whose every value has a documented range (an axis, a size, a count, ...): a value of
# ±1e6 must be refused. Others (ignore_index, seed, offsets, ...) may take any integer.
RANGED_ATTR = re.compile(
    r"^(axis|axes|axis1|axis2|dim|dims|dim1|dim2|begin_norm_axis|k|kernel_size|kernel_sizes|ksize|"
    r"strides?|dilations|groups|upscale_factor|downscale_factor|pooled_height|pooled_width|"
    r"sampling_ratio|num_layers|hidden_size|frame_length|hop_length|group_size|out_[dhw]|"
    r"output_channels|seg_num|reduction|index|last_dim_size|stride1|stride2|max_displacement|"
    r"kernel_size|pad_size|class_num|downsample_ratio|embedding_dim|nranks|n|rank|power_iters|"
    r"max_seqlen_q|max_seqlen_k|size|step|length|start_index|attn_mask_start_row|arch|blank|"
    r"align_mode)$")

# integer tensors that hold values, not indices or lengths: any integer is a valid value
VALUE_TENSORS = {"seed_offset", "seed_and_offset", "reserve", "state_out", "weight"}

# (op, mutation id) or (op, "class:argument") -> why the accepted call is valid
ACCEPTS: dict[tuple[str, str], str] = {
    **{(op, "dtype:softmax_lse"): "softmax_lse may be float32 (as Paddle stores it) for any q dtype"
       for op in ("flash_attn_grad", "flash_attn_qkvpacked_grad", "flash_attn_unpadded_grad",
                  "flash_attn_varlen_qkvpacked_grad", "flash_attn_with_sparse_mask_grad")},
    **{(op, "size:softmax_lse"): "softmax_lse's last dim may exceed seqlen_q (Paddle rounds it up)"
       for op in ("flash_attn_grad", "flash_attn_qkvpacked_grad", "flash_attn_unpadded_grad",
                  "flash_attn_with_sparse_mask_grad")},
    ("memory_efficient_attention_grad", "dtype:logsumexp"): "logsumexp may be float32 for any dtype",
    ("memory_efficient_attention_grad", "size:logsumexp"): "logsumexp's last dim may exceed seqlen",
    **{(op, f"index:ids"): "ids are table keys (feature signs): any int64 value"
       for op in ("pull_sparse_v2_grad", "push_gpups_sparse")},
    ("pull_sparse_v2_grad", "zero:w"): "w is the embedding table: any number of rows",
    **{(op, m): "the mask routes the gradient: any x plane that holds its indices, any stride"
       for op in ("max_pool2d_with_index_grad", "max_pool3d_with_index_grad")
       for m in ("size:x", "attr-big:strides")},
    **{(op, "size:x"): "output_size fixes the output: any larger input plane is valid"
       for op in ("fractional_max_pool2d_grad", "fractional_max_pool3d_grad")},
    **{(op, "size:x"): "out_h/out_w/... fix the output size: x's spatial size is free"
       for op in ("bilinear_interp_grad", "bicubic_interp_grad", "nearest_interp_grad",
                  "linear_interp_grad", "trilinear_interp_grad")},
    **{(op, f"attr-{t}:{a}"): "an output size of a dim the interpolation does not have is unused "
       "(as in Paddle)" for t in ("big", "neg")
       for op, attrs in (("bilinear_interp_grad", ("out_d",)), ("bicubic_interp_grad", ("out_d",)),
                         ("nearest_interp_grad", ("out_d",)),
                         ("linear_interp_grad", ("out_d", "out_h"))) for a in attrs},
    **{(op, "size:x"): "boxes are in x's pixel coordinates: any spatial size of x is valid"
       for op in ("roi_align_grad", "roi_pool_grad", "psroi_pool_grad")},
    ("roi_align_grad", "attr-neg:sampling_ratio"): "sampling_ratio <= 0: adaptive (Paddle)",
    **{("cudnn_lstm_grad", f"{cls}:{n}"): "cuDNN's opaque workspace / dropout state: any shape"
       for cls in ("rank", "size", "zero") for n in ("reserve", "state_out")},
    **{(op, "size:x"): "x's size along the axis only bounds the indices (checked)"
       for op in ("kthvalue_grad", "mode_grad", "nanmedian_grad", "topk_grad")},
    **{(op, "rank:x"): "x with one more leading dim is still expanded to the attribute's shape"
       for op in ("expand_grad", "expand_as_grad")},
    **{(op, f"{cls}:x"): "x only gives x_grad its shape: out_grad is one value"
       for op in ("mean_all_grad", "identity_loss_grad", "l1_norm_grad", "squared_l2_norm_grad")
       for cls in ("rank", "size", "zero")},
    ("squared_l2_norm_grad", "rank:out_grad"): "one value as [1] or []",
    **{("reduce_as_grad", f"{cls}:x"): "target still broadcasts to x"
       for cls in ("rank", "zero")},
    **{("dist_grad", m): "x and y broadcast" for m in ("rank:x", "rank:y", "zero:x")},
    ("trace_grad", "size:x"): "a longer last dim of x keeps the diagonal and out_grad's shape",
    ("p_norm_grad", "size:x"): "the reduced axis may have any size",
    ("segment_pool_grad", "rank:summed_ids"): "summed_ids may be [S, 1] or [S]",
    ("warpctc_grad", "rank:loss_grad"): "loss_grad may be [B, 1] or [B]",
    **{("crop_grad", m): "any crop that fits x at the offsets is valid"
       for m in ("size:out_grad", "size:x", "zero:out_grad")},
    ("cross_entropy_with_softmax_grad", "size:softmax"): "more classes: the hard labels still fit",
    ("margin_cross_entropy_grad", "rank:loss_grad"): "loss_grad may be [N, 1] or [N]",
    ("yolo_loss_grad", "attr-big:downsample_ratio"): "any positive downsample ratio",
    # (ops in files this suite does not own, judged valid calls)
    **{("as_strided_grad", f"{cls}:input"): "any input large enough for the strided view"
       for cls in ("rank", "size")},
    ("diagonal_grad", "size:x"): "a longer dim outside the diagonal's axes",
    ("fft_r2c_grad", "size:x"): "n = 8 and 9 have the same onesided length 5",
    ("frame_grad", "size:x"): "one more sample makes no new frame",
    ("gather_grad", "size:x"): "a longer gathered axis: the indices stay in range",
    ("index_add_grad", "size:out_grad"): "a longer indexed axis: the indices stay in range",
    ("index_sample_grad", "size:x"): "a longer sampled axis: the indices stay in range",
    ("take_along_axis_grad", "size:arr"): "a longer axis: the indices stay in range",
    ("tensor_unfold_grad", "size:input"): "one more element makes no new window",
    **{("index_put_grad", m): "index tensors and value broadcast against each other"
       for m in ("drop:indices[0]", "rank:indices", "rank:value")},
    **{("matrix_power_grad", f"attr-{t}:n"): "any integer exponent" for t in ("big", "neg")},
    ("multiplex_grad", "rank:index"): "index may be [N, 1] or [N]",
    ("send_ue_recv_grad", "rank:y"): "edge features broadcast against node features",
    **{("send_uv_grad", f"rank:{n}"): "x and y features broadcast" for n in ("x", "y")},
    ("view_dtype_grad", "dtype:input"): "view_dtype reinterprets an input of any dtype",
    ("view_dtype_grad", "dtype:out_grad"): "out_grad of another dtype of the same element size is "
    "a valid view (Paddle's kernel ignores the dtype attribute, as test_shape checks)",
    ("partial_sum_grad", "drop:x[0]"): "a partial sum of fewer tensors has the same shape",
    ("scatter_nd_add_grad", "size:out_grad"): "out_grad gives x's shape: the index addresses only "
    "its leading dims, so a wider last dim is a valid call",
    ("broadcast_tensors_grad", "rank:input"): "a leading dim every input broadcasts to",
    ("grid_sample_grad", "size:x"): "grid decides the output: x's spatial size is free",
    **{("unpool3d_grad", m): "output_size fixes the output; ksize/strides only shaped the "
       "forward's windows" for m in ("attr-big:ksize", "attr-big:strides")},
    **{(op, "rank:ids"): "a slot's ids may be [rows] or [rows, 1]"
       for op in ("pull_sparse_v2_grad", "push_gpups_sparse")},
    **{(op, f"{cls}:out_grad"): "global scatter/gather move rows of any width"
       for op in ("global_gather_grad", "global_scatter_grad") for cls in ("size",)},
}

# (op, mutation) -> outcome, for failures in code outside this suite's files (te_defs/indexing.py,
# te_defs/shape.py, te_defs/linalg.py, te_defs/softmax.py, te_defs/detection.py, te_defs/fft.py,
# tvmgrad/infer_meta/{linalg,indexing}.py, tvmgrad/examples/). Exact: an entry that passes fails.
KNOWN: dict[tuple[str, str], str] = {}


# ------------------------------------------------------------------------------------------
# mutations (built in the child: only ids cross processes)

def _targets(inputs):
    """(label, name, index) of every present tensor: index is the Tensor[] element or None."""
    out = []
    for name, value in inputs.items():
        if value is None:
            continue
        if isinstance(value, list):
            if value:
                out.append((f"{name}[0]", name, 0))
        else:
            out.append((name, name, None))
    return out


def _get(inputs, name, index):
    value = inputs[name]
    return np.asarray(value[index] if index is not None else value)


def _put(inputs, name, index, array):
    new = dict(inputs)
    if index is None:
        new[name] = array
    else:
        new[name] = list(new[name])
        new[name][index] = array
    return new


def _is_float(a) -> bool:
    return a.dtype.kind in "fc" or a.dtype.name == "bfloat16"


def _aligned(array, offset=0):
    """A C-contiguous copy whose data starts ``offset`` bytes past a 64-byte boundary."""
    array = np.asarray(array)
    raw = np.empty(array.nbytes + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _contig(a):
    """A C-contiguous copy that keeps a 0-D array 0-D (np.ascontiguousarray makes it 1-D)."""
    return np.array(a, order="C", copy=True)


def _strided(a):
    if a.ndim == 0:
        return a
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _readonly(a):
    out = _aligned(a)
    out.setflags(write=False)
    return out


def _map_all(inputs, fn):
    return {k: (None if v is None else [fn(np.asarray(x)) for x in v] if isinstance(v, list)
                else fn(np.asarray(v))) for k, v in inputs.items()}


def _mmap_all(inputs, tmpdir):
    def fn(a, counter=[0]):
        counter[0] += 1
        path = os.path.join(tmpdir, f"m{counter[0]}.npy")
        np.save(path, a)
        return np.load(path, mmap_mode="r")
    return _map_all(inputs, fn)


def mutations(op: str, inputs: dict, attrs: dict):
    """[(id, class, argument named in an error, expect, make)]: ``expect`` is "error" (must be
    refused), "any" (a result or an error) or "same" (the result of the unmutated call);
    ``make()`` gives the mutated (inputs, attrs)."""
    from tvmgrad import registry
    spec = registry.get(op).spec
    out = []
    targets = _targets(inputs)
    floats = [t for t in targets if _is_float(_get(inputs, t[1], t[2]))]

    def add(mid, cls, arg, expect, fn):
        out.append((mid, cls, arg, expect, fn))

    for name in [p.name for p in spec.tensor_args]:
        if inputs.get(name) is None:
            continue
        expect = "any" if name in spec.optional else "error"
        add(f"drop:{name}", "drop", name, expect,
            lambda n=name: ({k: v for k, v in inputs.items() if k != n}, attrs))
        if isinstance(inputs[name], list) and len(inputs[name]) > 1:
            alone = len(targets) == 1          # the list is the only tensor: fewer is valid
            add(f"drop:{name}[0]", "drop", name, "any" if alone else "error",
                lambda n=name: ({**inputs, n: list(inputs[n][1:])}, attrs))
    add("extra:bogus", "extra", "bogus", "error", lambda: ({**inputs, "bogus": next(
        (_get(inputs, n, i) for _, n, i in targets), np.zeros(3))}, attrs))

    # with one tensor there is nothing its shape must agree with: any shape is a valid call
    shaped = "any" if len(targets) == 1 and not any(
        isinstance(v, list) and len(v) > 1 for v in inputs.values()) else "error"
    for label, name, index in targets:
        a = _get(inputs, name, index)
        if _is_float(a):
            if len(floats) > 1 and a.dtype != np.float32:
                add(f"dtype-f32:{label}", "dtype", name, "error",
                    lambda n=name, i=index, a=a: (_put(inputs, n, i, a.astype(np.float32)), attrs))
            # an int64 tensor is a valid call of an op with int kernels and no other float input
            int_ok = "int64" in registry.get(op).implementation.dtypes and len(floats) == 1
            add(f"dtype-int:{label}", "dtype", name, "any" if int_ok else "error",
                lambda n=name, i=index, a=a: (_put(inputs, n, i, np.ones(a.shape, np.int64)), attrs))
        elif floats:
            add(f"dtype-float:{label}", "dtype", name, "error",
                lambda n=name, i=index, a=a: (_put(inputs, n, i, a.astype(np.float64)), attrs))
        add(f"rank+:{label}", "rank", name, shaped,
            lambda n=name, i=index, a=a: (_put(inputs, n, i, np.stack([a, a])), attrs))
        if a.ndim >= 1:
            add(f"rank-:{label}", "rank", name, shaped,
                lambda n=name, i=index, a=a: (_put(inputs, n, i, _contig(a[..., 0])), attrs))
            add(f"size:{label}", "size", name, shaped,
                lambda n=name, i=index, a=a: (_put(inputs, n, i, np.concatenate([a, a[..., :1]], -1)), attrs))
            if a.shape[0] != 0:
                add(f"zero:{label}", "zero", name, shaped,
                    lambda n=name, i=index, a=a: (_put(inputs, n, i, _contig(a[:0])), attrs))
        if _is_float(a) and a.size:
            def nonfinite(n=name, i=index, a=a):
                b = a.copy().reshape(-1)
                b[0], b[-1], b[b.size // 2] = np.nan, np.inf, -np.inf
                return _put(inputs, n, i, b.reshape(a.shape)), attrs
            add(f"nonfinite:{label}", "nonfinite", name, "any", nonfinite)
        if a.dtype.kind in "iu" and a.size:
            info = np.iinfo(a.dtype)
            value_like = name in VALUE_TENSORS
            for tag, v, expect in (("big", min(BIG, info.max), "error"),
                                   ("neg", max(-BIG, info.min), "error"), ("m1", -1, "any")):
                if v == -1 and info.min == 0:
                    continue
                def index_value(n=name, i=index, a=a, v=v):
                    b = a.copy().reshape(-1)
                    b[0] = v
                    return _put(inputs, n, i, b.reshape(a.shape)), attrs
                add(f"index-{tag}:{label}", "index", name, "any" if value_like else expect,
                    index_value)

    # consistent size-0 calls: each distinct dim size (> 1) becomes 0 wherever it occurs (a
    # batch, channel, column or head count of 0: a size-0 inner extent once divided by zero
    # sizing a kernel's buffers, SIGFPE)
    sizes = sorted({d for _, n, i in targets for d in _get(inputs, n, i).shape if d > 1})
    for s in sizes:
        def zero_all(s=s):
            def fn(a):
                if a.ndim == 0 or s not in a.shape:
                    return a
                idx = tuple(slice(0, 0) if d == s else slice(None) for d in a.shape)
                return _contig(a[idx])
            return _map_all(inputs, fn), attrs
        add(f"zero-all:{s}", "zero", None, "any", zero_all)

    add("layout-strided", "layout", None, "same", lambda: (_map_all(inputs, _strided), attrs))
    add("layout-fortran", "layout", None, "same", lambda: (_map_all(inputs, np.asfortranarray), attrs))
    add("layout-misaligned", "layout", None, "same",
        lambda: (_map_all(inputs, lambda a: _aligned(a, a.itemsize if a.size else 0)), attrs))
    add("layout-readonly", "layout", None, "same", lambda: (_map_all(inputs, _readonly), attrs))
    add("layout-mmap", "layout", None, "same", "mmap")

    full = {**spec.defaults, **attrs}
    for p in spec.attrs:
        base, value = p.base_type, full.get(p.name)
        if base in ("int", "int64_t"):
            expect = "error" if RANGED_ATTR.match(p.name) else "any"
            for tag, v in (("big", BIG), ("neg", -BIG)):
                add(f"attr-{tag}:{p.name}", "attr", p.name, expect,
                    lambda n=p.name, v=v: (inputs, {**attrs, n: v}))
        elif base in ("int[]", "int64_t[]", "IntArray") and isinstance(value, (list, tuple)) and value:
            expect = "error" if RANGED_ATTR.match(p.name) else "any"
            for tag, v in (("big", BIG), ("neg", -BIG)):
                add(f"attr-{tag}:{p.name}", "attr", p.name, expect,
                    lambda n=p.name, v=v, value=value: (inputs, {**attrs, n: [v] + list(value[1:])}))
        elif base in ("float", "double"):
            add(f"attr-nan:{p.name}", "attr", p.name, "any",
                lambda n=p.name: (inputs, {**attrs, n: float("nan")}))
    return out


# ------------------------------------------------------------------------------------------
# judging one call (in the child)

def _names(message: str, op: str, arg: str | None) -> bool:
    if op not in message:
        return False
    return arg is None or re.search(rf"(?<![\w]){re.escape(arg)}(?![\w])", message) is not None


def _same(a, b) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return np.array_equal(a, b, equal_nan=True)
    return np.array_equal(a.view(np.uint8), b.view(np.uint8)) if a.dtype.kind == "V" else \
        np.array_equal(a.astype(np.float64) if a.dtype.name == "bfloat16" else a,
                       b.astype(np.float64) if b.dtype.name == "bfloat16" else b, equal_nan=True)


def _snapshot(inputs):
    return {k: (None if v is None else [np.array(x, copy=True) for x in v] if isinstance(v, list)
                else np.array(v, copy=True)) for k, v in inputs.items()}


class _BuildWatch:
    """Counts kernel fetches (cache lookups/builds) so that an error after one is seen."""

    def __init__(self):
        from tvmgrad import cache
        self.count = 0
        original = cache.KernelCache.get

        def get(cache_self, *args, **kwargs):
            self.count += 1
            return original(cache_self, *args, **kwargs)

        cache.KernelCache.get = get


def judge(op, mid, cls, arg, expect, make, base, watch, tmpdir):
    import tvmgrad
    try:
        if make == "mmap":
            inputs, attrs = _mmap_all(base["inputs"], tmpdir), base["attrs"]
        else:
            inputs, attrs = make()
    except Exception as exc:  # noqa: BLE001 - a mutation the example cannot take
        return "skip", f"mutation not applicable: {exc}"
    before = _snapshot(inputs)
    fetched = watch.count
    try:
        result = tvmgrad.run(op, inputs, attrs)
    except (ValueError, TypeError) as exc:
        msg = f"{type(exc).__name__}: {exc}"
        if type(exc).__module__.split(".")[0] in ("tvm", "tvm_ffi"):
            return "leak", f"TVM's error: {msg}"
        if not _names(str(exc), op, arg if cls not in ("layout", "nonfinite") and arg else None):
            return "leak", f"does not name {op!r} and {arg!r}: {msg}"
        if watch.count != fetched:
            return "leak", f"raised after a kernel was fetched: {msg}"
        if expect == "same":
            return "silent", f"a valid layout was refused: {msg}"
        return "ok", msg
    except Exception as exc:  # noqa: BLE001 - anything else leaked
        return "leak", f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:500]}"
    for k, v in before.items():
        now = inputs[k]
        if not _same(v, [np.asarray(x) for x in now] if isinstance(now, list) else np.asarray(now)):
            return "silent", f"input {k!r} was written"
    if expect == "error":
        why = ACCEPTS.get((op, mid)) or ACCEPTS.get((op, f"{cls}:{arg}"))
        if why:
            return "ok", f"accepted: {why}"
        shapes = {k: (None if v is None else [list(np.shape(x)) for x in v] if isinstance(v, list)
                      else list(np.shape(v))) for k, v in result.items()}
        return "silent", f"accepted, outputs {shapes}"
    if expect == "same" and base.get("result") is not None:
        for k, v in base["result"].items():
            if not _same(v, result.get(k)):
                return "silent", f"output {k!r} differs from the contiguous call"
    return "ok", "accepted"


def worker(ops: list[str], out_path: str, skip: set) -> None:
    """Run every mutation of ``ops`` (skipping ``skip`` = already done), one JSON line each:
    a "start" line before the call and the outcome after it."""
    import warnings
    warnings.filterwarnings("ignore")
    import tvmgrad
    from tvmgrad import examples
    watch = _BuildWatch()
    tmpdir = tempfile.mkdtemp(prefix="tvmgrad-fuzz-")
    with open(out_path, "a") as out:
        def emit(**rec):
            out.write(json.dumps(rec) + "\n")
            out.flush()

        for op in ops:
            if (op, "<example>") in skip:
                continue
            emit(op=op, mut="<example>", status="start")
            try:
                inputs, attrs = examples.sample(op)
                result = tvmgrad.run(op, inputs, attrs)
                base = {"inputs": inputs, "attrs": attrs, "result": result}
                emit(op=op, mut="<example>", status="done", outcome="ok", detail="")
            except Exception as exc:  # noqa: BLE001
                emit(op=op, mut="<example>", status="done", outcome="leak",
                     detail=f"the example fails: {type(exc).__name__}: {exc}")
                continue
            for mid, cls, arg, expect, make in mutations(op, inputs, attrs):
                if (op, mid) in skip:
                    continue
                emit(op=op, mut=mid, status="start", cls=cls)
                t0 = time.monotonic()
                outcome, detail = judge(op, mid, cls, arg, expect, make, base, watch, tmpdir)
                emit(op=op, mut=mid, status="done", cls=cls, outcome=outcome, detail=detail[:600],
                     t=round(time.monotonic() - t0, 3))


# ------------------------------------------------------------------------------------------
# the parent: batches of ops in children, crashes and hangs caught

HANG_S = float(os.environ.get("TVMGRAD_FUZZ_HANG_S", "120"))   # no progress for this long: a hang


def _run_batch(ops: list[str]) -> list[dict]:
    fd, path = tempfile.mkstemp(prefix="tvmgrad-fuzz-", suffix=".jsonl")
    os.close(fd)
    records: list[dict] = []
    done: set = set()
    try:
        while True:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", path, json.dumps(ops),
                 json.dumps(sorted(done))],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            last_size, last_change = -1, time.monotonic()
            while proc.poll() is None:
                size = os.path.getsize(path)
                if size != last_size:
                    last_size, last_change = size, time.monotonic()
                elif time.monotonic() - last_change > HANG_S:
                    proc.kill()
                    break
                time.sleep(0.1)
            proc.wait()
            stderr = proc.stderr.read().decode(errors="replace")[-800:]
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            started = None
            records = []
            for rec in lines:
                if rec["status"] == "start":
                    started = rec
                else:
                    records.append(rec)
                    done.add((rec["op"], rec["mut"]))
                    started = None
            if proc.returncode == 0:
                return records
            if started is None:          # died between calls (at start-up or exit)
                raise RuntimeError(f"fuzz worker for {ops} died (rc {proc.returncode}): {stderr}")
            hang = proc.returncode == -9
            rec = dict(started, status="done", outcome="hang" if hang else "crash",
                       detail=(f"no progress for {HANG_S:.0f} s" if hang else
                               f"the child died (rc {proc.returncode}): {stderr}"))
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            done.add((rec["op"], rec["mut"]))
    finally:
        os.unlink(path)


def sweep(ops: list[str], jobs: int | None = None, batch: int = 12) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor
    jobs = jobs or int(os.environ.get("TVMGRAD_FUZZ_JOBS", "0")) or min(2, os.cpu_count() or 1)
    batches = [ops[i:i + batch] for i in range(0, len(ops), batch)]
    with ThreadPoolExecutor(jobs) as pool:
        return [r for rs in pool.map(_run_batch, batches) for r in rs]


def all_ops() -> list[str]:
    from tvmgrad import examples
    return sorted(examples.implemented_ops())


def sampled_ops(per_family: int = 1) -> list[str]:
    """A deterministic sample: ``per_family`` ops of every family (by a hash of the name), plus
    the ops whose mutations are the issue's own examples."""
    from tvmgrad import registry
    by_family = defaultdict(list)
    for op in all_ops():
        fam = registry.get(op).family.split(":")[0]
        by_family[fam].append(op)
    chosen = set()
    for fam, names in by_family.items():
        chosen.update(sorted(names, key=lambda n: zlib.crc32(n.encode()))[:per_family])
    chosen.update(ISSUE_OPS)
    return sorted(chosen)


ISSUE_OPS = ("expand_grad", "expand_as_grad", "complex_grad", "mean_all_grad", "segment_pool_grad",
             "sign_grad", "unbind_grad", "cumprod_grad", "warpctc_grad", "squeeze_grad",
             "roi_pool_grad", "identity_loss_grad")

FAILING = ("crash", "hang", "leak", "silent")


def summarize(records: list[dict]) -> dict:
    counts = Counter(r["outcome"] for r in records if r["mut"] != "<example>")
    return {"calls": sum(counts.values()), **{k: counts.get(k, 0) for k in ("ok", "skip", *FAILING)}}


def failures(records: list[dict]) -> dict:
    return {(r["op"], r["mut"]): r["outcome"] for r in records if r["outcome"] in FAILING}


def check(records: list[dict], ops: list[str]) -> None:
    counts = summarize(records)
    print(f"fuzz: {len(ops)} ops, {counts['calls']} calls: {counts['ok']} passed, "
          f"{counts['crash']} crashes, {counts['hang']} hangs, {counts['leak']} leaked or misnamed "
          f"errors, {counts['silent']} silent acceptances ({len(failures(records))} failures, "
          f"all listed in KNOWN: {set(failures(records).items()) <= set(KNOWN.items())})")
    found = failures(records)
    details = {(r["op"], r["mut"]): r["detail"] for r in records}
    new = {k: v for k, v in found.items() if KNOWN.get(k) != v}
    swept = set(ops)
    fixed = {k: v for k, v in KNOWN.items() if k[0] in swept and found.get(k) != v}
    lines = [f"{op} {mid}: {outcome}: {details.get((op, mid), '')}" for (op, mid), outcome in sorted(new.items())]
    lines += [f"{op} {mid}: listed in KNOWN as {v!r} but now {found.get((op, mid), 'passes')}: "
              f"update KNOWN" for (op, mid), v in sorted(fixed.items())]
    assert not lines, f"{len(lines)} fuzz failures ({summarize(records)}):\n" + "\n".join(lines)


@pytest.mark.slow      # CI runs it by name (.ci/run): the default run's time budget
def test_fuzz_sample():
    ops = sampled_ops()
    check(sweep(ops), ops)


@pytest.mark.slow
def test_fuzz_every_op():
    ops = all_ops()
    check(sweep(ops), ops)


def test_mutations_cover_every_class():
    """The sampled ops between them exercise every mutation class."""
    from tvmgrad import examples
    seen = set()
    for op in sampled_ops():
        inputs, attrs = examples.sample(op)
        seen.update(m[1] for m in mutations(op, inputs, attrs))
    assert seen >= {"drop", "extra", "dtype", "rank", "size", "zero", "layout", "nonfinite",
                    "index", "attr"}


def test_accepts_and_known_name_real_mutations():
    """Every ACCEPTS and KNOWN entry names an op and one of its mutations (a renamed op or a
    changed example must not leave entries that silently match nothing)."""
    from tvmgrad import examples
    ops = set(all_ops())
    stale = []
    for table in (ACCEPTS, KNOWN):
        for op, key in table:
            if op not in ops:
                stale.append((op, key))
                continue
            inputs, attrs = examples.sample(op)
            keys = set()
            for mid, cls, arg, _, _ in mutations(op, inputs, attrs):
                keys |= {mid, f"{cls}:{arg}"}
            if key not in keys:
                stale.append((op, key))
    assert not stale, f"entries naming no mutation: {stale}"


def _main(argv: list[str]) -> None:
    if argv[:1] == ["--worker"]:
        worker(json.loads(argv[2]), argv[1], {tuple(x) for x in json.loads(argv[3])})
        return
    report = None
    if "--report" in argv:
        i = argv.index("--report")
        report = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    ops = all_ops() if argv[:1] == ["--all"] else sampled_ops() if not argv else argv
    t0 = time.time()
    records = sweep(ops)
    for r in sorted(records, key=lambda r: (r["op"], r["mut"])):
        if r["outcome"] in FAILING:
            print(f"{r['outcome']:6} {r['op']} {r['mut']}: {r['detail']}")
    print(summarize(records), f"{time.time() - t0:.0f} s, {len(ops)} ops")
    if report:
        with open(report, "w") as f:
            json.dump(records, f, indent=0)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TVMGRAD_CACHE_DIR", os.path.join(ROOT, ".cache", "test-kernels"))
    _main(sys.argv[1:])
