"""InferMetas of the attention, recurrent, sequence-loss, detection and distributed grads.

Paddle's versions mostly copy input metas to the grads; the op planners (te_defs/attention.py,
rnn.py, detection.py, distributed.py) check what needs the attributes or several inputs at once.
"""

from __future__ import annotations

from . import MetaError, register
from ._common import need as _need


# ------------------------------------------------------------------------------------------
# attention

@register
def FlashAttnGradInferMeta(q, k, v):
    """q_grad = q, k_grad = k, v_grad = v (padded [B, S, H, D] or unpadded [total, H, D])."""
    q, k, v = _need(q, "q"), _need(k, "k"), _need(v, "v")
    if q.ndim not in (3, 4):
        raise MetaError(f"q must be [batch, seqlen, num_heads, head_dim] or [total, num_heads, "
                        f"head_dim], got {list(q.shape)}")
    for name, m in (("k", k), ("v", v)):
        if m.ndim != q.ndim:
            raise MetaError(f"{name} must have q's rank {q.ndim}, got {list(m.shape)}")
    return q, k, v


@register
def FlashAttnQKVPackedGradInferMeta(qkv):
    """qkv_grad = qkv ([B, S, H/Hk + 2, Hk, D] or [total, H/Hk + 2, Hk, D])."""
    qkv = _need(qkv, "qkv")
    if qkv.ndim not in (4, 5):
        raise MetaError(f"qkv must be [batch, seqlen, num_heads/num_heads_k + 2, num_heads_k, "
                        f"head_dim] or [total, num_heads/num_heads_k + 2, num_heads_k, head_dim], "
                        f"got {list(qkv.shape)}")
    if isinstance(qkv.shape[-3], int) and qkv.shape[-3] < 3:
        raise MetaError(f"qkv's group dim (num_heads/num_heads_k + 2) must be at least 3, got "
                        f"{qkv.shape[-3]}")
    return (qkv,)


@register
def MemoryEfficientAttentionGradInferMeta(query, key, value, bias, cu_seqlens_q, cu_seqlens_k,
                                          output, logsumexp, seed_and_offset, output_grad,
                                          max_seqlen_q, max_seqlen_k, causal, dropout_p, scale):
    """query/key/value grads have their inputs' metas; bias_grad has bias's (when given)."""
    query, key, value = _need(query, "query"), _need(key, "key"), _need(value, "value")
    for name, m in (("query", query), ("key", key), ("value", value)):
        if m.ndim != 4:
            raise MetaError(f"{name} must be 4-D [batch, seqlen, num_heads, head_dim], got "
                            f"{list(m.shape)}")
    return query, key, value, bias


# ------------------------------------------------------------------------------------------
# recurrent

@register
def CudnnLSTMGradInferMeta(x, init_h, init_c, weight_list):
    """x_grad = x, init_h_grad = init_h, init_c_grad = init_c, weight_list_grad[i] = weight_list[i]."""
    x, init_h, init_c = _need(x, "x"), _need(init_h, "init_h"), _need(init_c, "init_c")
    if x.ndim != 3:
        raise MetaError(f"x must be 3-D [seq_len, batch, input_size], got {list(x.shape)}")
    for name, m in (("init_h", init_h), ("init_c", init_c)):
        if m.ndim != 3:
            raise MetaError(f"{name} must be 3-D [num_layers * directions, batch, hidden_size], "
                            f"got {list(m.shape)}")
    return x, init_h, init_c, (None if weight_list is None else list(weight_list))


# ------------------------------------------------------------------------------------------
# detection

@register
def YoloLossGradInferMeta(x, gt_box, gt_label, gt_score, objectness_mask, gt_match_mask,
                          loss_grad, anchors, anchor_mask, class_num, ignore_thresh,
                          downsample_ratio, use_label_smooth, scale_x_y):
    """x_grad = x. Paddle's kernel never produces gt_box_grad, gt_label_grad or gt_score_grad
    (the ground truth is data, not a parameter): they are not produced here either."""
    x = _need(x, "x")
    if x.ndim != 4:
        raise MetaError(f"x must be 4-D [N, C, H, W], got {list(x.shape)}")
    for name, m in (("gt_box", gt_box), ("gt_label", gt_label), ("gt_score", gt_score),
                    ("objectness_mask", objectness_mask), ("gt_match_mask", gt_match_mask),
                    ("loss_grad", loss_grad)):
        if m is not None and (m.ndim == 0 or m.shape[0] != x.shape[0]):
            raise MetaError(f"input {name!r} has shape {list(m.shape)}: its first dim must be the "
                            f"batch {x.shape[0]} of 'x'")
    return x, None, None, None


# ------------------------------------------------------------------------------------------
# distributed / parameter server

def _slot_grads(ids, out_grad):
    """The per-slot grads of a sparse push: one ``out_grad`` tensor per ``ids`` slot, each keeping
    its meta."""
    if not out_grad:
        raise MetaError("out_grad must hold at least one tensor")
    if ids is None or len(ids) != len(out_grad):
        raise MetaError(f"ids and out_grad must have as many tensors (slots), got "
                        f"{0 if ids is None else len(ids)} and {len(out_grad)}")
    return [_need(m, f"out_grad[{i}]") for i, m in enumerate(out_grad)]


def _token_rows(x):
    """x of a global scatter/gather: 2-D [tokens, features], unchanged with world size 1."""
    x = _need(x, "x")
    if x.ndim != 2:
        raise MetaError(f"x must be 2-D [tokens, features], got {list(x.shape)}")
    return x


@register
def PushGpupsSparseInferMeta(ids, out, size, is_sparse, is_distributed):
    """out_grad_grad[i] has out_grad[i]'s meta (the per-key merged gradient of each slot row)."""
    return (_slot_grads(ids, out),)


@register
def PushSparseV2InferMeta(ids, w, out_grad, embedding_dim, table_id, accessor_class,
                          ctrlabel_name, padding_id, scale_sparse_grad, input_names,
                          is_distributed):
    """out_grad_out[i] has out_grad[i]'s meta (the per-key merged gradient of each slot row)."""
    return (_slot_grads(ids, out_grad),)


@register
def GlobalScatterInferMeta(x, local_count, global_count):
    """out = x with world size 1 (every row is sent to and received from this rank)."""
    return (_token_rows(x),)


@register
def GlobalGatherInferMeta(x, local_count, global_count):
    """out = x with world size 1 (every row is sent to and received from this rank)."""
    return (_token_rows(x),)
