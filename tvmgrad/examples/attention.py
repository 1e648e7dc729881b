"""Sample calls of the attention, recurrent, sequence-loss, detection and distributed grads
(te_defs/attention.py, rnn.py, seqloss.py, detection.py, distributed.py) for the generic tests,
and the float64 numpy references their tests share (Paddle's CPU build has no flash attention,
no cuDNN LSTM and does not return yolo_loss's masks)."""

import numpy as np

from . import factory

# ------------------------------------------------------------------------------------------
# references


def attention_ref(q, k, v, do, scale, bias=None, hidden=None, out=None, lse=None):
    """Softmax attention and its grads in float64, FlashAttention's conventions.

    q [B, Sq, H, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv], do [B, Sq, H, Dv]; kv head of query
    head h is h // (H / Hk); ``bias`` (broadcastable to [B, H, Sq, Sk]) is added after scaling;
    ``hidden`` (bool, broadcastable) hides keys. A row that sees nothing has lse = +inf and zero
    probabilities. ``out`` / ``lse`` given: the grads use them as the backward kernel does (the
    stored forward results, e.g. rounded to half / float32) instead of the exact ones. Returns
    out, lse [B, H, Sq], dq, dk, dv, dS [B, H, Sq, Sk]."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    B, Sq, H, D = q.shape
    Hk = k.shape[2]
    G = H // Hk
    kk, vv = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    if bias is not None:
        s = s + bias
    if hidden is not None:
        s = np.where(hidden, -np.inf, s)
    m = s.max(-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,))
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    pos = z > 0
    lse_exact = np.where(pos[..., 0], np.log(np.where(pos, z, 1.0))[..., 0] + m[..., 0], np.inf)
    p = np.where(pos, e / np.where(pos, z, 1.0), 0.0)
    exact_out = np.einsum("bhij,bjhd->bihd", p, vv)
    if lse is not None:
        lse_b = np.asarray(lse, np.float64)[..., :Sq]
        lse_b = np.where(lse_b == -np.inf, 0.0, lse_b)
        p = np.where(np.isfinite(s), np.exp(s - lse_b[..., None]), 0.0)
    else:
        lse_b = None
    out_b = exact_out if out is None else np.asarray(out, np.float64)
    dp = np.einsum("bihd,bjhd->bhij", do, vv)
    delta = np.einsum("bihd,bihd->bhi", do, out_b)[..., None]
    ds = p * (dp - delta)
    dq = np.einsum("bhij,bjhd->bihd", ds, kk) * scale
    dkk = np.einsum("bhij,bihd->bjhd", ds, q) * scale
    dvv = np.einsum("bhij,bihd->bjhd", p, do)
    dk = dkk.reshape(B, -1, Hk, G, D).sum(3)
    dv = dvv.reshape(B, -1, Hk, G, v.shape[-1]).sum(3)
    return exact_out, lse_exact, dq, dk, dv, ds


def causal_hidden(sq, sk):
    """Top-left causal: key j hidden from query i when j > i."""
    return np.arange(sk)[None, :] > np.arange(sq)[:, None]


def sparse_hidden(start, H, sq, causal):
    """flash_attn_with_sparse_mask: start [B, Hm, Sk] row indices -> hidden [B, H, Sq, Sk]."""
    hm = np.arange(H) // (H // start.shape[1])
    st = start[:, hm][:, :, None, :]
    i = np.arange(sq)[:, None]
    j = np.arange(start.shape[-1])[None, :]
    below = i >= st
    if causal:
        return (j > i) | ((j < i) & below)
    return below


def varlen_ref(q, k, v, do, cu_q, cu_k, scale, causal=False, offsets=None, store=None):
    """Per-sequence attention_ref over packed [total, H, D] tensors; returns out, lse3 [B, H,
    max_q] (+inf padded), lse2 [H, total_q], dq, dk, dv (zero on rows of no sequence).
    ``store(out, lse) -> (out, lse)``: how the forward stored them (the grads use the stored
    values)."""
    B = len(cu_q) - 1
    lq, lk = np.diff(cu_q), np.diff(cu_k)
    oq, ok = (cu_q[:-1], cu_k[:-1]) if offsets is None else offsets
    mq = int(lq.max()) if B else 0
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    lse3 = np.full((B, q.shape[1], max(mq, 1)), np.inf)
    lse2 = np.full((q.shape[1], q.shape[0]), np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(B):
        sq = slice(oq[b], oq[b] + lq[b])
        sk = slice(ok[b], ok[b] + lk[b])
        hid = causal_hidden(lq[b], lk[b]) if causal else None
        args = (q[None, sq], k[None, sk], v[None, sk], do[None, sq], scale, None, hid)
        o, lse, a, bb, c, _ = attention_ref(*args)
        if store is not None:
            o, lse = store(o, lse)
            _, _, a, bb, c, _ = attention_ref(*args, out=o, lse=lse)
        out[sq], lse3[b, :, :lq[b]], lse2[:, sq] = o[0], lse[0], lse[0]
        dq[sq], dk[sk], dv[sk] = a[0], bb[0], c[0]
    return out, lse3, lse2, dq, dk, dv


def _sce(x, label):
    return np.maximum(x, 0) - x * label + np.log1p(np.exp(-np.abs(x)))


def sigmoid(x):
    """The logistic function in float64 (yolo_loss's reference, shared with its test)."""
    return 1 / (1 + np.exp(-x))


def _iou(b1, b2):
    def overlap(c1, w1, c2, w2):
        return min(c1 + w1 / 2, c2 + w2 / 2) - max(c1 - w1 / 2, c2 - w2 / 2)
    w, h = overlap(b1[0], b1[2], b2[0], b2[2]), overlap(b1[1], b1[3], b2[1], b2[3])
    inter = 0.0 if (w < 0 or h < 0) else w * h
    return inter / (b1[2] * b1[3] + b2[2] * b2[3] - inter)


def yolo_forward(x, gt_box, gt_label, gt_score, anchors, anchor_mask, class_num, ignore_thresh,
                 downsample_ratio, use_label_smooth, scale_x_y):
    """A float64 port of Paddle 3.3.1's CPU YoloLossKernel: (loss [N], objectness_mask
    [N, M, H, W], gt_match_mask [N, B] int32). Paddle's _C_ops.yolo_loss returns only the loss;
    the tests compare that loss with this one before using the masks."""
    x = np.asarray(x, np.float64)
    N, _, H, W = x.shape
    M, E, B = len(anchor_mask), 5 + class_num, gt_box.shape[1]
    input_size = downsample_ratio * H
    bias = -0.5 * (scale_x_y - 1)
    xr = x.reshape(N, M, E, H, W)
    score = np.ones((N, B)) if gt_score is None else np.asarray(gt_score, np.float64)
    neg = min(1.0 / class_num, 1 / 40) if use_label_smooth else 0.0
    pos = 1 - neg
    loss, obj = np.zeros(N), np.zeros((N, M, H, W))
    match = np.zeros((N, B), np.int32)
    valid = ~((gt_box[..., 2] < 1e-6) | (gt_box[..., 3] < 1e-6))
    for i in range(N):
        for j in range(M):
            an = anchor_mask[j]
            for k in range(H):
                for l in range(W):
                    pb = [(l + sigmoid(xr[i, j, 0, k, l]) * scale_x_y + bias) / H,
                          (k + sigmoid(xr[i, j, 1, k, l]) * scale_x_y + bias) / H,
                          np.exp(xr[i, j, 2, k, l]) * anchors[2 * an] / input_size,
                          np.exp(xr[i, j, 3, k, l]) * anchors[2 * an + 1] / input_size]
                    best = max([_iou(pb, gt_box[i, t]) for t in range(B) if valid[i, t]] + [0.0])
                    if best > ignore_thresh:
                        obj[i, j, k, l] = -1
        for t in range(B):
            if not valid[i, t]:
                match[i, t] = -1
                continue
            g = gt_box[i, t]
            gi, gj = int(g[0] * W), int(g[1] * H)
            best, bn = 0.0, 0
            for a in range(len(anchors) // 2):
                v = _iou([0, 0, anchors[2 * a] / input_size, anchors[2 * a + 1] / input_size],
                         [0, 0, g[2], g[3]])
                if v > best:
                    best, bn = v, a
            mi = anchor_mask.index(bn) if bn in anchor_mask else -1
            match[i, t] = mi
            if mi < 0:
                continue
            s = score[i, t]
            tx, ty = g[0] * H - gi, g[1] * H - gj
            tw = np.log(g[2] * input_size / anchors[2 * bn])
            th = np.log(g[3] * input_size / anchors[2 * bn + 1])
            sc = (2 - g[2] * g[3]) * s
            c = xr[i, mi, :, gj, gi]
            loss[i] += (_sce(c[0], tx) + _sce(c[1], ty) + abs(tw - c[2]) + abs(th - c[3])) * sc
            obj[i, mi, gj, gi] = s
            for cl in range(class_num):
                loss[i] += _sce(c[5 + cl], pos if cl == gt_label[i, t] else neg) * s
    for i in range(N):
        o, xv = obj[i], xr[i, :, 4]
        loss[i] += np.where(o > 1e-5, _sce(xv, 1.0) * o, np.where(o > -0.5, _sce(xv, 0.0), 0)).sum()
    return loss, obj, match


def lstm_weights(rng, input_size, hidden, layers, bidirec, scale=0.3):
    """cudnn_lstm's weight_list: every layer/direction's W_ih [4H, in], W_hh [4H, H], then every
    b_ih [4H], b_hh [4H] (gate order i, f, g, o)."""
    dirs = 2 if bidirec else 1
    ws, bs = [], []
    for layer in range(layers):
        width = input_size if layer == 0 else hidden * dirs
        for _ in range(dirs):
            ws += [rng.uniform(-scale, scale, (4 * hidden, width)),
                   rng.uniform(-scale, scale, (4 * hidden, hidden))]
            bs += [rng.uniform(-scale, scale, (4 * hidden,)), rng.uniform(-scale, scale, (4 * hidden,))]
    return ws + bs


# ------------------------------------------------------------------------------------------
# sample calls

def _g(rng, *shape):
    return rng.standard_normal(shape)


def _flash_inputs(rng, B=2, Sq=9, Sk=11, H=4, Hk=2, D=16, mask=True, causal=False):
    q, k, v, do = _g(rng, B, Sq, H, D), _g(rng, B, Sk, Hk, D), _g(rng, B, Sk, Hk, D), _g(rng, B, Sq, H, D)
    m = 0.5 * _g(rng, B, 1, Sq, Sk) if mask else None
    hid = causal_hidden(Sq, Sk) if causal else None
    out, lse, *_ = attention_ref(q, k, v, do, 1 / np.sqrt(D), m, hid)
    inputs = {"q": q, "k": k, "v": v, "out": out, "softmax_lse": lse,
              "seed_offset": np.zeros(2, np.int64), "out_grad": do}
    if mask:
        inputs["attn_mask"] = m
    return inputs


@factory("flash_attn_grad")
def _flash(rng):
    return _flash_inputs(rng), {}


@factory("flash_attn_qkvpacked_grad")
def _flash_packed(rng):
    B, S, G, Hk, D = 2, 9, 2, 2, 16
    qkv = _g(rng, B, S, G + 2, Hk, D)
    q = qkv[:, :, :G].reshape(B, S, G * Hk, D)
    do = _g(rng, B, S, G * Hk, D)
    out, lse, *_ = attention_ref(q, qkv[:, :, G], qkv[:, :, G + 1], do, 1 / np.sqrt(D),
                                 hidden=causal_hidden(S, S))
    return {"qkv": qkv, "out": out, "softmax_lse": lse, "seed_offset": np.zeros(2, np.int64),
            "out_grad": do}, {"causal": True}


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


@factory("flash_attn_unpadded_grad")
def _flash_unpadded(rng):
    H, Hk, D = 4, 2, 16
    cq, ck = _cu([5, 3, 7]), _cu([4, 6, 7])
    q, k, v = _g(rng, 15, H, D), _g(rng, 17, Hk, D), _g(rng, 17, Hk, D)
    do = _g(rng, 15, H, D)
    out, lse3, _, *_ = varlen_ref(q, k, v, do, cq, ck, 0.25, causal=True)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck, "out": out,
            "softmax_lse": lse3, "seed_offset": np.zeros(2, np.int64), "out_grad": do}, \
        {"max_seqlen_q": 7, "max_seqlen_k": 7, "scale": 0.25, "causal": True}


@factory("flash_attn_varlen_qkvpacked_grad")
def _flash_varlen_packed(rng):
    G, Hk, D = 2, 2, 16
    cu = _cu([5, 3, 7])
    qkv = _g(rng, 15, G + 2, Hk, D)
    q = qkv[:, :G].reshape(15, G * Hk, D)
    do = _g(rng, 15, G * Hk, D)
    out, _, lse2, *_ = varlen_ref(q, qkv[:, G], qkv[:, G + 1], do, cu, cu, 0.25)
    return {"qkv": qkv, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "out": out, "softmax_lse": lse2,
            "seed_offset": np.zeros(2, np.int64), "out_grad": do}, \
        {"max_seqlen_q": 7, "max_seqlen_k": 7, "scale": 0.25, "varlen_padded": False}


@factory("flash_attn_with_sparse_mask_grad")
def _flash_sparse(rng):
    B, S, H, Hk, D = 2, 9, 4, 2, 16
    q, k, v, do = _g(rng, B, S, H, D), _g(rng, B, S, Hk, D), _g(rng, B, S, Hk, D), _g(rng, B, S, H, D)
    start = rng.integers(2, S + 1, (B, 1, S)).astype(np.int32)
    out, lse, *_ = attention_ref(q, k, v, do, 1 / np.sqrt(D),
                                 hidden=sparse_hidden(start, H, S, True))
    return {"q": q, "k": k, "v": v, "attn_mask_start_row_indices": start, "out": out,
            "softmax_lse": lse, "seed_offset": np.zeros(2, np.int64), "out_grad": do}, \
        {"causal": True, "attn_mask_start_row": 2}


@factory("memory_efficient_attention_grad")
def _mea(rng):
    B, Mq, Mk, H, K, Kv = 2, 9, 7, 3, 16, 8
    q, k, v, do = _g(rng, B, Mq, H, K), _g(rng, B, Mk, H, K), _g(rng, B, Mk, H, Kv), _g(rng, B, Mq, H, Kv)
    bias = 0.5 * _g(rng, 1, H, Mq, Mk)
    out, lse, *_ = attention_ref(q, k, v, do, 1 / np.sqrt(K), bias)
    return {"query": q, "key": k, "value": v, "bias": bias, "output": out, "logsumexp": lse,
            "seed_and_offset": np.zeros(2, np.int64), "output_grad": do}, \
        {"max_seqlen_q": Mq, "max_seqlen_k": Mk, "causal": False, "dropout_p": 0.0, "scale": -1.0}


@factory("warpctc_grad")
def _warpctc(rng):
    T, B, C = 6, 3, 5
    return {"logits": _g(rng, T, B, C), "logits_length": np.array([6, 4, 5], np.int64),
            "warpctcgrad": _g(rng, T, B, C), "loss_grad": _g(rng, B, 1)}, {"norm_by_times": True}


@factory("warprnnt_grad")
def _warprnnt(rng):
    B, T, U, C = 2, 4, 3, 5
    return {"input": _g(rng, B, T, U, C), "input_lengths": np.array([4, 3], np.int32),
            "warprnntgrad": _g(rng, B, T, U, C), "loss_grad": _g(rng, B)}, {}


YOLO_ATTRS = {"anchors": [10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119],
              "anchor_mask": [1, 3, 4, 5], "class_num": 4, "ignore_thresh": 0.5,
              "downsample_ratio": 32, "use_label_smooth": True, "scale_x_y": 1.0}


def yolo_inputs(rng, n=2, h=5, w=5, b=4, attrs=YOLO_ATTRS, score=True):
    M, C = len(attrs["anchor_mask"]), attrs["class_num"]
    x = _g(rng, n, M * (5 + C), h, w)
    box = np.concatenate([rng.random((n, b, 2)) * 0.9 + 0.05, rng.random((n, b, 2)) * 0.6 + 0.1], -1)
    box[-1, -1] = 0                                  # an invalid (empty) box
    label = rng.integers(0, C, (n, b)).astype(np.int32)
    sc = rng.random((n, b)) if score else None
    _, obj, match = yolo_forward(x, box, label, sc, **attrs)
    inputs = {"x": x, "gt_box": box, "gt_label": label, "objectness_mask": obj,
              "gt_match_mask": match, "loss_grad": _g(rng, n)}
    if score:
        inputs["gt_score"] = sc
    return inputs


@factory("yolo_loss_grad")
def _yolo(rng):
    return yolo_inputs(rng), dict(YOLO_ATTRS)


@factory("global_gather_grad")
def _global_gather(rng):
    c = np.array([3, 0, 4], np.int64)
    return {"out_grad": _g(rng, 7, 5), "local_count": c, "global_count": c.copy()}, {}


@factory("global_scatter_grad")
def _global_scatter(rng):
    c = np.array([2, 5], np.int64)
    return {"out_grad": _g(rng, 7, 5), "local_count": c, "global_count": c.copy()}, {}


@factory("pull_sparse_v2_grad")
def _pull_sparse_v2(rng):
    ids = [np.array([[3], [1], [3], [0]], np.int64), np.array([[1], [7], [0], [3]], np.int64)]
    return {"ids": ids, "w": [_g(rng, 8, 11)], "out_grad": [_g(rng, 4, 11), _g(rng, 4, 11)]}, \
        {"padding_id": 0}


@factory("push_gpups_sparse")
def _push_gpups(rng):
    ids = [np.array([[3], [1], [3], [9]], np.int64), np.array([[1], [7], [2], [3]], np.int64)]
    return {"ids": ids, "out_grad": [_g(rng, 4, 6), _g(rng, 4, 6)]}, {"size": [6, 6]}


@factory("cudnn_lstm_grad")
def _cudnn_lstm(rng):
    T, B, I, Hs, L = 5, 3, 4, 6, 2
    w = lstm_weights(rng, I, Hs, L, True)
    return {"x": _g(rng, T, B, I), "init_h": _g(rng, 2 * L, B, Hs), "init_c": _g(rng, 2 * L, B, Hs),
            "weight_list": w, "sequence_length": np.array([5, 3, 4], np.int32),
            "out": np.zeros((T, B, 2 * Hs)), "reserve": np.zeros(1, np.uint8),
            "state_out": np.zeros(1, np.uint8), "out_grad": _g(rng, T, B, 2 * Hs),
            "last_h_grad": _g(rng, 2 * L, B, Hs), "last_c_grad": _g(rng, 2 * L, B, Hs)}, \
        {"is_bidirec": True, "hidden_size": Hs, "num_layers": L}
