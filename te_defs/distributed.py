"""Distributed and parameter-server grads, computed for one process (world size 1).

tvmgrad has no communicator: every op here implements the *local* computation of one rank and
checks that the call is a world-size-1 call. What a multi-rank deployment must add is described
per op below; the plug-in point is ``set_communicator`` (a function ``world_size(ring_id) -> int``
that a deployment registers). With a world size above 1 the ops raise NotImplementedError naming
the collective that must run, rather than compute something silently wrong.

* global_scatter (the forward that global_gather_grad invokes) and global_gather (invoked by
  global_scatter_grad): the MoE token exchange. ``local_count[e + r·E]`` rows of x go from this
  rank to expert e on rank r, ``global_count[e + r·E]`` rows arrive from rank r for local expert e
  (E = len(local_count) / world_size). Paddle's kernel loops ``for e: for r: send x rows
  [cumsum(local_count)[idx] ...] to r; recv global_count[idx] rows from r`` (NCCL send/recv in a
  group), appending received rows in (e, r) order; global_gather is the mirror image. With world
  size 1 the only peer is this rank: what is sent is what is received, so global_count must equal
  local_count, the rows keep their (expert-major) order and out = x (checked: counts equal,
  non-negative, summing to x's rows). Multi-rank: the copy kernel below is the pack/unpack stage;
  between them an all-to-all-v (per (e, r) send of local_count[idx] rows, receive of
  global_count[idx] rows) must run on ring ``ring_id``.
* pull_sparse_v2_grad (YAML: invoke push_sparse_v2, which has no signature in backward.yaml, so
  the grad is defined directly): the push of embedding gradients to a parameter-server table.
  Paddle's kernel (FleetWrapper::PushSparseFromTensorWithLabelAsync) builds one push value per
  (slot, row) — skipping rows whose id is ``padding_id`` and multiplying the gradient by the
  batch size (rows of the first slot; every slot must have as many) when ``scale_sparse_grad`` —
  and the server merges (sums) the values of equal keys before the optimizer applies them. The
  local computation here is that merge: out_grad_out[s][r] = (ids[s][r] == padding_id ? 0 :
  scale · Σ out_grad[s'][r'] over every (s', r') with ids[s'][r'] == ids[s][r] and id !=
  padding_id), i.e. the gradient the table row of that key receives, gathered back to every
  position that holds the key. Multi-rank / real PS: the merged (key, gradient) pairs must be sent
  to the server shard owning each key (and show/click statistics of the accessor added) instead of
  being returned.
* push_gpups_sparse (backward of pull_gpups_sparse; YAML: in place on out_grad): the push of slot
  gradients to the GPU parameter server (PSGPUWrapper::PushSparseGrad: every slot must have the
  same batch size; keys are deduplicated and their gradients summed before the table update).
  Local computation: out_grad_grad[s][r] = Σ out_grad[s'][r'] over every (s', r') with equal id
  (and equal embedding width, slots of another width live in other values). Multi-rank: the merged
  gradients are partitioned by key over the GPUs/nodes (HeterComm all-to-all) before the update.

The merges compare every row with every other (O(N² · D) for N rows in total): deterministic,
without sorting or atomics; fine for the batch sizes of one step. They are scheduled stage by
stage (pattern separate_stages): the generic rules' epilogue fusion fails on the stacked-slot stages.
"""

from __future__ import annotations

import numpy as np

from tvmgrad.dtypes import FLOATS, INTS
from tvmgrad.families import tensor_op

__all__ = ["global_scatter", "global_gather", "pull_sparse_v2_grad", "push_gpups_sparse",
           "set_communicator", "world_size"]

_COMMUNICATOR = None


def set_communicator(fn) -> None:
    """Register ``fn(ring_id) -> world size`` (None to unregister). tvmgrad computes only the
    local part of a collective: with a world size above 1 the ops refuse (NotImplementedError)."""
    global _COMMUNICATOR
    _COMMUNICATOR = fn


def world_size(ring_id: int = 0) -> int:
    return 1 if _COMMUNICATOR is None else int(_COMMUNICATOR(ring_id))


def _single_rank(op: str, ring_id: int, collective: str) -> None:
    n = world_size(ring_id)
    if n != 1:
        raise NotImplementedError(
            f"{op}: ring {ring_id} has world size {n}; tvmgrad computes the world-size-1 local "
            f"part only — a multi-rank run needs {collective} between the local kernels")


# ------------------------------------------------------------------------------------------
# MoE token exchange

def _exchange_check(call, outs):
    op = call.op
    _single_rank(op, call.attrs["ring_id"], "an all-to-all-v over the (expert, rank) counts")
    x = call.meta("x")
    counts = {}
    for name in ("local_count", "global_count"):
        m = call.meta(name)
        if m.ndim != 1:
            raise ValueError(f"{op}: input {name!r} must be 1-D [n_expert * world_size], got "
                             f"{list(m.shape)}")
        counts[name] = np.asarray(call.tensors[name]).astype(np.int64)
    lc, gc = counts["local_count"], counts["global_count"]
    if lc.shape != gc.shape:
        raise ValueError(f"{op}: inputs 'local_count' and 'global_count' must have the same length, "
                         f"got {lc.shape[0]} and {gc.shape[0]}")
    if (lc < 0).any() or (gc < 0).any():
        raise ValueError(f"{op}: inputs 'local_count' and 'global_count' must be non-negative")
    if not np.array_equal(lc, gc):
        raise ValueError(f"{op}: with world size 1 every row is sent to this rank, so "
                         f"'global_count' must equal 'local_count'; got {gc.tolist()} and "
                         f"{lc.tolist()}")
    if int(lc.sum()) != x.shape[0]:
        raise ValueError(f"{op}: the counts sum to {int(lc.sum())} rows but input 'x' has "
                         f"{x.shape[0]}")


def _copy(x):
    from tvm import te

    return te.compute(x.shape, lambda *i: x(*i), name="out")


@tensor_op(dtypes=FLOATS + INTS, float_inputs=("x",), index_dtypes=("int64", "int32"),
           validate=_exchange_check, infer_meta="GlobalScatterInferMeta")
def global_scatter(x, local_count, global_count, ring_id, use_calc_stream):
    """out = x rows exchanged by (expert, rank) counts; world size 1: out = x (the local pack; the
    all-to-all-v of a multi-rank run goes between pack and unpack, see the module docstring)"""
    return _copy(x)


@tensor_op(dtypes=FLOATS + INTS, float_inputs=("x",), index_dtypes=("int64", "int32"),
           validate=_exchange_check, infer_meta="GlobalGatherInferMeta")
def global_gather(x, local_count, global_count, ring_id, use_calc_stream):
    """out = x rows returned by (expert, rank) counts (global_scatter's inverse); world size 1:
    out = x"""
    return _copy(x)


# ------------------------------------------------------------------------------------------
# parameter-server pushes

def _slots_check(call, ids_name, grad_name, widths=None, width_attr="size"):
    op = call.op
    ids, grads = call.meta(ids_name), call.meta(grad_name)
    rows = None
    for s, (im, gm) in enumerate(zip(ids, grads)):
        if gm.ndim != 2:
            raise ValueError(f"{op}: input '{grad_name}[{s}]' must be 2-D [rows, embedding_dim], "
                             f"got {list(gm.shape)}")
        n = int(np.prod(im.shape, dtype=np.int64))
        if im.ndim not in (1, 2) or (im.ndim == 2 and im.shape[1] != 1) or n != gm.shape[0]:
            raise ValueError(f"{op}: input '{ids_name}[{s}]' must be [rows] or [rows, 1] with "
                             f"{grad_name}[{s}]'s {gm.shape[0]} rows, got {list(im.shape)}")
        if widths is not None and gm.shape[1] != widths[s]:
            raise ValueError(f"{op}: input '{grad_name}[{s}]' must have {widths[s]} columns (the "
                             f"width attribute {width_attr!r} gives), got {gm.shape[1]}")
        if rows is None:
            rows = n
        elif n != rows:
            raise ValueError(f"{op}: every slot must have the same batch size; {ids_name}[0] has "
                             f"{rows} rows, {ids_name}[{s}] has {n}")


def _merged(ids, grads, name, groups, skip=None, scale=None):
    """out[s][r, d] = Σ_{s' with groups[s'] == groups[s]} Σ_r' [ids[s'][r'] == ids[s][r]] ·
    grads[s'][r', d] (every slot has the same rows; the slots of a group have equal widths; rows
    whose id equals ``skip`` neither give nor get anything), times ``scale``.

    Per group: the slots' ids and gradients are stacked ([K, N] and [K, N, D], compute dtype),
    one reduction over (slot, row) merges them, and each slot's output is a row of the result."""
    from tvm import te, tirx

    from tvmgrad.dtypes import dtype as as_dtype, to_compute

    dt = as_dtype(str(grads[0].dtype))
    cdt = dt.compute
    zero = tirx.const(0, cdt)
    i64 = lambda v: tirx.const(v, "int64")  # noqa: E731

    def key(t, r):
        return (t[r] if len(t.shape) == 1 else t[r, i64(0)]).astype("int64")

    def pick(items, k, value):
        """items[k] for a (small, static) slot index expression k."""
        v = value(items[-1])
        for j in range(len(items) - 2, -1, -1):
            v = tirx.Select(k == i64(j), value(items[j]), v)
        return v

    outs = [None] * len(grads)
    for group in dict.fromkeys(groups):
        members = [s for s, gr in enumerate(groups) if gr == group]
        gi = [ids[s] for s in members]
        gg = [grads[s] for s in members]
        n, width, k = gg[0].shape[0], gg[0].shape[1], i64(len(members))
        key_st = te.compute((k, n), lambda q, r: pick(gi, q, lambda t: key(t, r)),
                            name=f"{name}_keys{group}")
        grad_st = te.compute((k, n, width), lambda q, r, d: pick(
            gg, q, lambda t: to_compute(t[r, d], dt)), name=f"{name}_grads{group}")
        kk = te.reduce_axis((i64(0), k), name=f"{name}_q{group}")
        rr = te.reduce_axis((i64(0), n), name=f"{name}_r{group}")

        def merge(q, r, d):
            hit = key_st[kk, rr] == key_st[q, r]
            if skip is not None:
                hit = tirx.all(hit, key_st[kk, rr] != skip)
            return te.sum(tirx.Select(hit, grad_st[kk, rr, d], zero), axis=[kk, rr])

        merged = te.compute((k, n, width), merge, name=f"{name}_merged{group}")
        for j, s in enumerate(members):
            outs[s] = te.compute(grads[s].shape, _slot_out(merged, j, key_st, skip, scale, cdt,
                                                           dt.storage), name=f"{name}_{s}")
    return outs


def _slot_out(merged, j, key_st, skip, scale, cdt, storage):
    from tvm import tirx

    def out(r, d):
        q = tirx.const(j, "int64")
        v = merged[q, r, d]
        if scale is not None:
            v = v * scale.astype(cdt)
        if skip is not None:
            v = tirx.Select(key_st[q, r] == skip, tirx.const(0, cdt), v)
        return v.astype(storage)
    return out


def _pull_sparse_v2_check(call, outs):
    op = call.op
    _single_rank(op, 0, "the push of the merged (key, gradient) pairs to the PS table shards")
    ids, w, grads = call.meta("ids"), call.meta("w"), call.meta("out_grad")
    if len(ids) != len(grads):
        raise ValueError(f"{op}: inputs 'ids' and 'out_grad' must have as many tensors, got "
                         f"{len(ids)} and {len(grads)}")
    dim = call.attrs["embedding_dim"]
    if dim <= 0:
        raise ValueError(f"{op}: attribute 'embedding_dim' must be positive, got {dim}")
    _slots_check(call, "ids", "out_grad", [dim] * len(grads), "embedding_dim")
    for i, m in enumerate(w):
        if m.ndim != 2 or m.shape[1] != dim:
            raise ValueError(f"{op}: input 'w[{i}]' (the embedding table) must be 2-D [rows, "
                             f"embedding_dim = {dim}], got {list(m.shape)}")
        if m.dtype != grads[0].dtype:
            raise TypeError(f"{op}: input 'w[{i}]' has dtype {m.dtype.name} but 'out_grad[0]' has "
                            f"{grads[0].dtype.name}; they must match")


@tensor_op(float_inputs=("w", "out_grad"), index_dtypes=("int64",),
           pattern="separate_stages", validate=_pull_sparse_v2_check,
           infer_meta="PushSparseV2InferMeta")
def pull_sparse_v2_grad(ids, w, out_grad, embedding_dim, table_id, accessor_class, ctrlabel_name,
                        padding_id, scale_sparse_grad, input_names, is_distributed):
    """out_grad_out[s][r] = 0 if ids[s][r] == padding_id, else (batch size if scale_sparse_grad,
    else 1) · Σ out_grad[s'][r'] over the rows with the same id (the merged gradient that the
    key's table row receives; see the module docstring)"""
    from tvm import tirx

    scale = ids[0].shape[0] if scale_sparse_grad else None
    return _merged(ids, out_grad, "out_grad_out", [0] * len(out_grad),
                   skip=tirx.const(padding_id, "int64"), scale=scale)


def _push_gpups_check(call, outs):
    op = call.op
    _single_rank(op, 0, "the key-partitioned all-to-all of the merged gradients (HeterComm)")
    size = call.attrs["size"]
    n = len(call.meta("out_grad"))
    if size and len(size) != n:
        raise ValueError(f"{op}: attribute 'size' must give one embedding width per slot ({n}), "
                         f"got {list(size)}")
    if any(w <= 0 for w in size):
        raise ValueError(f"{op}: attribute 'size' must hold positive widths, got {list(size)}")
    _slots_check(call, "ids", "out_grad", list(size) if size else None)
    widths = {m.shape[1] for m in call.meta("out_grad")}
    if not size and len(widths) > 1:
        raise ValueError(f"{op}: the out_grad slots have different widths {sorted(widths)}: "
                         f"attribute 'size' must give each slot's width (slots of equal width "
                         f"share keys)")


@tensor_op(float_inputs=("out_grad",), index_dtypes=("int64",), validate=_push_gpups_check,
           pattern="separate_stages")
def push_gpups_sparse(ids, out_grad, size, is_sparse, is_distributed):
    """out_grad_grad[s][r] = Σ out_grad[s'][r'] over the rows (of slots of the same width) with
    ids[s'][r'] == ids[s][r] (the merged gradient pushed for that key; module docstring)"""
    groups = list(size) if size else [0] * len(out_grad)
    return _merged(ids, out_grad, "out_grad_grad", groups)
