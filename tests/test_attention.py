"""Attention grads (te_defs/attention.py) against a float64 reference.

Paddle 3.3.1's CPU build has no FlashAttention / cutlass memory-efficient attention kernels
(GPU-only; its _C_ops raise), so the oracle is ``samples_attention.attention_ref``: softmax
attention and its grads in float64 written from the kernels' conventions (scale, additive mask
after scaling, top-left causal, kv head h // (H/Hk), +inf lse of fully hidden rows). The
reference itself is checked against Paddle's autograd of the same math once (below). Half-type
inputs are rounded first and the reference runs on the rounded values (what the GPU kernels see;
they accumulate in float32), the forward's out and lse are computed from them in float64 and
stored as the forward stores them (out in the input dtype, lse in float32).
"""

import math

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from harness import TOL, assert_close, np_dtype
from tvmgrad.examples.attention import (attention_ref, causal_hidden, sparse_hidden, varlen_ref)

F64 = (1e-9, 1e-11)
F32 = (2e-4, 2e-5)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _round(x, dtype):
    return np.asarray(x, np.float64).astype(np_dtype(dtype)).astype(np.float64)


def _as(x, dtype):
    return np.asarray(x).astype(np_dtype(dtype))


def _lse(lse, dtype):
    return lse if dtype == "float64" else lse.astype(np.float32)


def _close(name, got, want, dtype):
    rtol, atol = {"float64": F64, "float32": F32}.get(dtype, TOL[dtype])
    scale = max(1.0, float(np.abs(want).max())) if np.size(want) else 1.0
    assert_close(name, got, _as(want, dtype), dtype, rtol=rtol, atol=atol * scale)


def _stored(q, k, v, do, scale, bias, hidden, dtype):
    """The forward's stored out (input dtype) and lse (float32; float64 for float64 data) and
    the reference grads computed from them, as the backward kernel sees them."""
    out, lse, *_ = attention_ref(q, k, v, do, scale, bias, hidden)
    out, lse = _round(out, dtype), _lse(lse, dtype).astype(np.float64)
    _, _, dq, dk, dv, ds = attention_ref(q, k, v, do, scale, bias, hidden, out=out, lse=lse)
    return out, lse, dq, dk, dv


def _flash_case(dtype, B, Sq, Sk, H, Hk, D, mask=None, causal=False, seed=0):
    rng = _rng(seed)
    q, k, v, do = (_round(rng.standard_normal(s), dtype) for s in
                   ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D), (B, Sq, H, D)))
    m = None if mask is None else _round(mask, dtype)
    scale = float(np.float32(1 / math.sqrt(D)))
    hid = causal_hidden(Sq, Sk) if causal else None
    out, lse, dq, dk, dv = _stored(q, k, v, do, scale, m, hid, dtype)
    inputs = {"q": _as(q, dtype), "k": _as(k, dtype), "v": _as(v, dtype), "out": _as(out, dtype),
              "softmax_lse": _lse(lse, dtype), "seed_offset": np.zeros(2, np.int64),
              "out_grad": _as(do, dtype)}
    if m is not None:
        inputs["attn_mask"] = _as(m, dtype)
    return inputs, (dq, dk, dv)


# ------------------------------------------------------------------------------------------
# flash_attn_grad

@pytest.mark.sweep
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_flash_attn_gqa_mask_causal(dtype):
    """GQA (H = 2·Hk), Sq != Sk, sequence lengths crossing the 64-row tiles, an additive mask
    broadcast over heads with a fully hidden row, and causal."""
    rng = _rng(1)
    B, Sq, Sk, H, Hk, D = 2, 70, 67, 4, 2, 16
    mask = 0.5 * rng.standard_normal((B, 1, Sq, Sk))
    mask[:, :, 5, :] = -np.inf                          # a row that sees nothing: lse = +inf
    mask[:, :, :, 3] = -np.inf
    inputs, (dq, dk, dv) = _flash_case(dtype, B, Sq, Sk, H, Hk, D, mask, causal=True, seed=2)
    r = tvmgrad.run("flash_attn_grad", inputs, {"causal": True})
    _close("q_grad", r["q_grad"], dq, dtype)
    _close("k_grad", r["k_grad"], dk, dtype)
    _close("v_grad", r["v_grad"], dv, dtype)
    assert np.all(r["q_grad"][:, 5] == 0)


def test_flash_attn_mha_odd_shapes_and_broadcast_masks():
    """MHA without causal; masks of every broadcast pattern share a kernel per pattern."""
    rng = _rng(3)
    B, Sq, Sk, H, D = 3, 5, 9, 2, 8
    for shape in [(B, H, Sq, Sk), (1, 1, 1, Sk)]:
        mask = rng.standard_normal(shape)
        inputs, want = _flash_case("float64", B, Sq, Sk, H, H, D, mask)
        r = tvmgrad.run("flash_attn_grad", inputs)
        for name, w in zip(("q_grad", "k_grad", "v_grad"), want):
            _close(name, r[name], w, "float64")


@pytest.mark.parametrize("one_pass", [True, False])
def test_flash_attn_cpu_forms(one_pass, monkeypatch, tmp_path):
    """The CPU's one-pass form (te_defs/attention.one_pass) and the two-pass form (what a
    function made outside it, e.g. a tuning trace's, keeps) both match the reference: 5 key
    tiles, the last one partly past the keys, 2 query heads per kv head, and causal. The
    one-pass kernel has one set of S/dP tile products (5 tile products), the two-pass kernel
    two (7)."""
    import contextlib

    import tvmgrad.te_defs.attention as attention
    from tvmgrad.cache import KernelCache
    if not one_pass:
        monkeypatch.setattr(attention, "one_pass", contextlib.nullcontext)
    B, Sq, Sk, H, Hk, D = 2, 20, 300, 16, 8, 8
    inputs, want = _flash_case("float32", B, Sq, Sk, H, Hk, D, causal=True, seed=6)
    launch = tvmgrad.prepare("flash_attn_grad", inputs, {"causal": True},
                             cache=KernelCache(tmp_path))
    r = launch()
    for name, w in zip(("q_grad", "k_grad", "v_grad"), want):
        _close(name, r[name], w, "float32")
    from tvmgrad import build
    script = build.lower(launch.plan, launch.target).script()
    assert 'T.sblock("attn_dP_kv_update")' in script
    assert ('T.sblock("attn_dP_q_update")' in script) != one_pass


def test_flash_attn_mask_rank5_flattens_into_batch():
    rng = _rng(4)
    B, Sq, Sk, H, D = 2, 4, 6, 2, 8
    mask = rng.standard_normal((B, 1, H, Sq, Sk))     # leading dims flattened: [2, 2? no: 2·1]
    inputs, want = _flash_case("float64", B, Sq, Sk, H, H, D, mask.reshape(B, H, Sq, Sk))
    inputs["attn_mask"] = mask
    r = tvmgrad.run("flash_attn_grad", inputs)
    _close("q_grad", r["q_grad"], want[0], "float64")


def test_flash_attn_empty_sequences():
    for Sq, Sk in ((0, 5), (4, 0), (0, 0)):
        inputs, (dq, dk, dv) = _flash_case("float64", 2, Sq, Sk, 2, 2, 8)
        r = tvmgrad.run("flash_attn_grad", inputs)
        assert r["q_grad"].shape == (2, Sq, 2, 8) and r["k_grad"].shape == (2, Sk, 2, 8)
        np.testing.assert_array_equal(r["q_grad"], 0)
        np.testing.assert_array_equal(r["k_grad"], 0)
        np.testing.assert_array_equal(r["v_grad"], 0)


def test_flash_attn_lse_conventions():
    """A lse row of −inf counts as 0 (the fork's rule for a −inf max); a longer (rounded)
    lse last dim is accepted and only its first Sq entries are read."""
    inputs, want = _flash_case("float64", 1, 3, 4, 1, 1, 8, seed=5)
    lse = inputs["softmax_lse"]
    padded = np.concatenate([lse, np.full((1, 1, 125), 7.0)], -1)
    r = tvmgrad.run("flash_attn_grad", {**inputs, "softmax_lse": padded})
    _close("q_grad", r["q_grad"], want[0], "float64")
    zero = lse.copy()
    zero[0, 0, 1] = 0.0
    minf = lse.copy()
    minf[0, 0, 1] = -np.inf
    a = tvmgrad.run("flash_attn_grad", {**inputs, "softmax_lse": zero})
    b = tvmgrad.run("flash_attn_grad", {**inputs, "softmax_lse": minf})
    np.testing.assert_array_equal(a["q_grad"], b["q_grad"])


def test_reference_matches_paddle_autograd():
    """The float64 reference agrees with Paddle's autograd of the same attention math."""
    import paddle
    paddle.set_device("cpu")
    rng = _rng(6)
    B, Sq, Sk, H, D = 2, 5, 7, 2, 8
    q, k, v, do = (rng.standard_normal(s) for s in ((B, Sq, H, D), (B, Sk, H, D), (B, Sk, H, D),
                                                   (B, Sq, H, D)))
    mask = rng.standard_normal((B, 1, Sq, Sk))
    _, _, dq, dk, dv, _ = attention_ref(q, k, v, do, 0.3, mask, causal_hidden(Sq, Sk))
    tq, tk, tv = (paddle.to_tensor(x.transpose(0, 2, 1, 3), stop_gradient=False) for x in (q, k, v))
    s = paddle.matmul(tq, tk, transpose_y=True) * 0.3 + paddle.to_tensor(mask)
    s = s + paddle.to_tensor(np.where(causal_hidden(Sq, Sk), -np.inf, 0.0))
    o = paddle.matmul(paddle.nn.functional.softmax(s, -1), tv)
    g = paddle.grad(o, [tq, tk, tv], paddle.to_tensor(do.transpose(0, 2, 1, 3)))
    for got, want in zip(g, (dq, dk, dv)):
        np.testing.assert_allclose(got.numpy().transpose(0, 2, 1, 3), want, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------
# qkvpacked

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flash_attn_qkvpacked(dtype):
    """qkv [B, S, H/Hk + 2, Hk, D]: query head h = group·Hk + slot uses kv head h // (H/Hk)."""
    rng = _rng(7)
    B, S, G, Hk, D = 2, 66, 2, 2, 16
    qkv = _round(rng.standard_normal((B, S, G + 2, Hk, D)), dtype)
    q = qkv[:, :, :G].reshape(B, S, G * Hk, D)
    do = _round(rng.standard_normal((B, S, G * Hk, D)), dtype)
    out, lse, dq, dk, dv = _stored(q, qkv[:, :, G], qkv[:, :, G + 1], do,
                                   float(np.float32(1 / math.sqrt(D))), None,
                                   causal_hidden(S, S), dtype)
    r = tvmgrad.run("flash_attn_qkvpacked_grad", {
        "qkv": _as(qkv, dtype), "out": _as(out, dtype), "softmax_lse": lse.astype(np.float32),
        "seed_offset": np.zeros(2, np.int64), "out_grad": _as(do, dtype)}, {"causal": True})
    want = np.concatenate([dq.reshape(B, S, G, Hk, D), dk[:, :, None], dv[:, :, None]], 2)
    _close("qkv_grad", r["qkv_grad"], want, dtype)


# ------------------------------------------------------------------------------------------
# varlen

def _packed(rng, dtype, lens_q, lens_k, H, Hk, D, extra=(2, 1)):
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    Tq, Tk = cq[-1] + extra[0], ck[-1] + extra[1]
    q, do = (_round(rng.standard_normal((Tq, H, D)), dtype) for _ in range(2))
    k, v = (_round(rng.standard_normal((Tk, Hk, D)), dtype) for _ in range(2))
    return q, k, v, do, cq, ck


@pytest.mark.sweep
@pytest.mark.parametrize("dtype,lse_rank", [("float32", 3), ("float16", 2)])
def test_flash_attn_unpadded(dtype, lse_rank):
    """Sequences by cu_seqlens (an empty one, rows past the last sequence), GQA, causal,
    lse [B, H, max_q] or [H, total_q]."""
    rng = _rng(8)
    H, Hk, D, scale = 4, 2, 16, 0.3
    q, k, v, do, cq, ck = _packed(rng, dtype, [5, 0, 70, 3], [4, 6, 66, 2], H, Hk, D)
    out, lse3, lse2, dq, dk, dv = varlen_ref(
        q, k, v, do, cq, ck, scale, causal=True,
        store=lambda o, l: (_round(o, dtype), l.astype(np.float32).astype(np.float64)))
    r = tvmgrad.run("flash_attn_unpadded_grad", {
        "q": _as(q, dtype), "k": _as(k, dtype), "v": _as(v, dtype), "cu_seqlens_q": cq,
        "cu_seqlens_k": ck, "out": _as(out, dtype),
        "softmax_lse": (lse3 if lse_rank == 3 else lse2).astype(np.float32),
        "seed_offset": np.zeros(2, np.int64), "out_grad": _as(do, dtype)},
        {"max_seqlen_q": 70, "max_seqlen_k": 66, "scale": scale, "causal": True})
    _close("q_grad", r["q_grad"], dq, dtype)
    _close("k_grad", r["k_grad"], dk, dtype)
    _close("v_grad", r["v_grad"], dv, dtype)
    assert not r["q_grad"][cq[-1]:].any() and not r["k_grad"][ck[-1]:].any()


def test_flash_attn_unpadded_mask():
    rng = _rng(9)
    H, D, scale = 2, 8, 0.4
    q, k, v, do, cq, ck = _packed(rng, "float64", [3, 5], [4, 2], H, H, D, extra=(0, 0))
    mq, mk = 5, 4
    mask = rng.standard_normal((2, H, mq, mk))
    out, lse, dq, dk, dv = np.zeros(q.shape), np.full((2, H, mq), np.inf), *(np.zeros(x.shape) for x in (q, k, v))
    for b in range(2):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        o, l, a, kk, vv, _ = attention_ref(q[None, sq], k[None, sk], v[None, sk], do[None, sq],
                                           scale, mask[b:b + 1, :, :lq, :lk])
        out[sq], lse[b, :, :lq], dq[sq], dk[sk], dv[sk] = o[0], l[0], a[0], kk[0], vv[0]
    r = tvmgrad.run("flash_attn_unpadded_grad", {
        "q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck, "out": out,
        "softmax_lse": lse, "seed_offset": np.zeros(2, np.int64), "attn_mask": mask,
        "out_grad": do}, {"max_seqlen_q": mq, "max_seqlen_k": mk, "scale": scale})
    for name, w in zip(("q_grad", "k_grad", "v_grad"), (dq, dk, dv)):
        _close(name, r[name], w, "float64")


@pytest.mark.parametrize("varlen_padded", [False, True])
def test_flash_attn_varlen_qkvpacked(varlen_padded):
    rng = _rng(10)
    G, Hk, D, scale, mx = 2, 2, 8, 0.35, 6
    lens = np.array([4, 6, 0, 3])
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = len(lens) * mx if varlen_padded else cu[-1] + 1
    qkv = rng.standard_normal((T, G + 2, Hk, D))
    q = qkv[:, :G].reshape(T, G * Hk, D)
    do = rng.standard_normal((T, G * Hk, D))
    offs = (np.arange(len(lens)) * mx,) * 2 if varlen_padded else None
    out, lse3, _, dq, dk, dv = varlen_ref(q, qkv[:, G], qkv[:, G + 1], do, cu, cu, scale,
                                          offsets=offs)
    r = tvmgrad.run("flash_attn_varlen_qkvpacked_grad", {
        "qkv": qkv, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "out": out, "softmax_lse": lse3,
        "seed_offset": np.zeros(2, np.int64), "out_grad": do},
        {"max_seqlen_q": mx, "max_seqlen_k": mx, "scale": scale, "varlen_padded": varlen_padded})
    want = np.concatenate([dq.reshape(T, G, Hk, D), dk[:, None], dv[:, None]], 1)
    _close("qkv_grad", r["qkv_grad"], want, "float64")


# ------------------------------------------------------------------------------------------
# sparse mask

@pytest.mark.parametrize("dtype,causal,heads", [("float32", True, 1), ("float16", False, 4)])
def test_flash_attn_with_sparse_mask(dtype, causal, heads):
    rng = _rng(11)
    B, S, H, D = 2, 67, 4, 16
    q, k, v, do = (_round(rng.standard_normal(s), dtype) for s in
                   ((B, S, H, D), (B, S, H, D), (B, S, H, D), (B, S, H, D)))
    start = rng.integers(3, S + 1, (B, heads, S)).astype(np.int32)
    hidden = sparse_hidden(start, H, S, causal)
    out, lse, dq, dk, dv = _stored(q, k, v, do, float(np.float32(1 / math.sqrt(D))), None,
                                   hidden, dtype)
    r = tvmgrad.run("flash_attn_with_sparse_mask_grad", {
        "q": _as(q, dtype), "k": _as(k, dtype), "v": _as(v, dtype),
        "attn_mask_start_row_indices": start, "out": _as(out, dtype),
        "softmax_lse": lse.astype(np.float32), "seed_offset": np.zeros(2, np.int64),
        "out_grad": _as(do, dtype)}, {"causal": causal, "attn_mask_start_row": 3})
    for name, w in zip(("q_grad", "k_grad", "v_grad"), (dq, dk, dv)):
        _close(name, r[name], w, dtype)


# ------------------------------------------------------------------------------------------
# memory_efficient_attention_grad

def _mea(rng, dtype, B, Mq, Mk, H, K, Kv, bias_shape=None, causal=False, scale=-1.0):
    q, k, v, do = (_round(rng.standard_normal(s), dtype) for s in
                   ((B, Mq, H, K), (B, Mk, H, K), (B, Mk, H, Kv), (B, Mq, H, Kv)))
    bias = None if bias_shape is None else _round(rng.standard_normal(bias_shape), dtype)
    s = 1 / math.sqrt(K) if scale < 0 else scale
    badd = None if bias is None else (bias if bias.ndim == 4 else bias[None, None])
    hid = causal_hidden(Mq, Mk) if causal else None
    out, lse, *_ = attention_ref(q, k, v, do, s, badd, hid)
    out, lse = _round(out, dtype), _lse(lse, dtype).astype(np.float64)
    _, _, dq, dk, dv, ds = attention_ref(q, k, v, do, s, badd, hid, out=out, lse=lse)
    inputs = {"query": _as(q, dtype), "key": _as(k, dtype), "value": _as(v, dtype),
              "output": _as(out, dtype), "logsumexp": _lse(lse, dtype),
              "seed_and_offset": np.zeros(2, np.int64), "output_grad": _as(do, dtype)}
    if bias is not None:
        inputs["bias"] = _as(bias, dtype)
        if bias.ndim == 2:
            ds = ds.sum((0, 1))
        else:
            ds = ds.sum(tuple(a for a in (0, 1) if bias.shape[a] == 1), keepdims=True)
    attrs = {"max_seqlen_q": Mq, "max_seqlen_k": Mk, "causal": causal, "dropout_p": 0.0,
             "scale": scale}
    return inputs, attrs, (dq, dk, dv, ds if bias is not None else None)


@pytest.mark.sweep
@pytest.mark.parametrize("dtype,bias_shape,causal,scale", [
    ("float32", (1, 3, 9, 70), False, -1.0),
    ("float64", (9, 70), True, 0.2),
    ("bfloat16", None, True, -1.0),
])
def test_memory_efficient_attention(dtype, bias_shape, causal, scale):
    """Value head dim != query head dim, a broadcast bias (its grad summed over the broadcast
    dims), causal, explicit or default (< 0) scale."""
    inputs, attrs, want = _mea(_rng(12), dtype, 2, 9, 70, 3, 16, 8, bias_shape, causal, scale)
    r = tvmgrad.run("memory_efficient_attention_grad", inputs, attrs)
    for name, w in zip(("query_grad", "key_grad", "value_grad", "bias_grad"), want):
        if w is None:
            assert r[name] is None
        else:
            _close(name, r[name], w, dtype)


def test_memory_efficient_attention_bias_patterns():
    rng = _rng(13)
    for shape in [(2, 3, 4, 5), (2, 1, 4, 5), (1, 1, 4, 5)]:
        inputs, attrs, want = _mea(rng, "float64", 2, 4, 5, 3, 8, 8, shape)
        r = tvmgrad.run("memory_efficient_attention_grad", inputs, attrs)
        _close("bias_grad", r["bias_grad"], want[3], "float64")
        _close("query_grad", r["query_grad"], want[0], "float64")


def test_memory_efficient_attention_varlen():
    rng = _rng(14)
    H, K, Kv, scale = 2, 8, 8, 0.3
    lq, lk = [3, 5, 2], [4, 4, 6]
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q, do = rng.standard_normal((cq[-1], H, K)), rng.standard_normal((cq[-1], H, Kv))
    k, v = rng.standard_normal((ck[-1], H, K)), rng.standard_normal((ck[-1], H, Kv))
    out, lse3, _, dq, dk, dv = varlen_ref(q, k, v, do, cq, ck, scale, causal=True)
    r = tvmgrad.run("memory_efficient_attention_grad", {
        "query": q[None], "key": k[None], "value": v[None], "cu_seqlens_q": cq,
        "cu_seqlens_k": ck, "output": out[None], "logsumexp": lse3,
        "seed_and_offset": np.zeros(2, np.int64), "output_grad": do[None]},
        {"max_seqlen_q": 5, "max_seqlen_k": 6, "causal": True, "dropout_p": 0.0, "scale": scale})
    _close("query_grad", r["query_grad"], dq[None], "float64")
    _close("key_grad", r["key_grad"], dk[None], "float64")
    _close("value_grad", r["value_grad"], dv[None], "float64")
    assert r["bias_grad"] is None


# ------------------------------------------------------------------------------------------
# bad input

def test_errors():
    inputs, _ = _flash_case("float32", 1, 4, 4, 2, 2, 8)
    with pytest.raises(ValueError, match="flash_attn_grad: attribute 'dropout'"):
        tvmgrad.run("flash_attn_grad", inputs, {"dropout": 0.1})
    with pytest.raises(ValueError, match="flash_attn_grad: q's num_heads 2 must be a positive "
                                         "multiple of k's num_heads 3"):
        tvmgrad.run("flash_attn_grad", {**inputs, "k": np.zeros((1, 4, 3, 8), np.float32),
                                        "v": np.zeros((1, 4, 3, 8), np.float32)})
    # no query heads for k's two (G = 0 divided by zero sizing the call)
    no_heads = {n: np.zeros((1, 4, 0, 8), np.float32) for n in ("q", "out", "out_grad")}
    with pytest.raises(ValueError, match="flash_attn_grad: q's num_heads 0 must be a positive "
                                         "multiple of k's num_heads 2"):
        tvmgrad.run("flash_attn_grad", {**inputs, **no_heads,
                                        "softmax_lse": np.zeros((1, 0, 4), np.float32)})
    with pytest.raises(ValueError, match="flash_attn_grad: input 'softmax_lse'"):
        tvmgrad.run("flash_attn_grad", {**inputs, "softmax_lse": np.zeros((1, 2, 3), np.float32)})
    with pytest.raises(ValueError, match="flash_attn_grad: input 'attn_mask'"):
        tvmgrad.run("flash_attn_grad", {**inputs, "attn_mask": np.zeros((1, 1, 4, 5), np.float32)})
    with pytest.raises(TypeError, match="flash_attn_grad: input 'attn_mask' has dtype float64"):
        tvmgrad.run("flash_attn_grad", {**inputs, "attn_mask": np.zeros((1, 1, 4, 4))})
    with pytest.raises(ValueError, match="flash_attn_grad: input 'out_grad'"):
        tvmgrad.run("flash_attn_grad", {**inputs, "out_grad": np.zeros((1, 4, 2, 4), np.float32)})
    with pytest.raises(ValueError, match="flash_attn_grad: input 'q' has head_dim 300"):
        big = {n: np.zeros((1, 2, 1, 300), np.float32) for n in ("q", "k", "v", "out", "out_grad")}
        tvmgrad.run("flash_attn_grad", {**big, "softmax_lse": np.zeros((1, 1, 2), np.float32),
                                        "seed_offset": np.zeros(2, np.int64)})
    un, attrs = _unpadded_inputs()
    with pytest.raises(ValueError, match="flash_attn_unpadded_grad: input 'cu_seqlens_q' must be non-decreasing"):
        tvmgrad.run("flash_attn_unpadded_grad", {**un, "cu_seqlens_q": np.array([0, 3, 2], np.int32)}, attrs)
    with pytest.raises(ValueError, match="flash_attn_unpadded_grad: input 'cu_seqlens_q' has a sequence of 3 rows, more than max_seqlen_q"):
        tvmgrad.run("flash_attn_unpadded_grad", un, {**attrs, "max_seqlen_q": 2})
    with pytest.raises(TypeError, match="flash_attn_unpadded_grad: input 'cu_seqlens_k' has dtype int64"):
        tvmgrad.run("flash_attn_unpadded_grad", {**un, "cu_seqlens_k": un["cu_seqlens_k"].astype(np.int64)}, attrs)
    sp = {**{n: inputs[n] for n in ("q", "k", "v", "out", "softmax_lse", "seed_offset", "out_grad")},
          "attn_mask_start_row_indices": np.full((1, 1, 4), 1, np.int32)}
    with pytest.raises(ValueError, match="flash_attn_with_sparse_mask_grad: attribute 'attn_mask_start_row' = 2"):
        tvmgrad.run("flash_attn_with_sparse_mask_grad", sp, {"attn_mask_start_row": 2})
    mea, mattrs, _ = _mea(_rng(), "float32", 1, 3, 4, 2, 8, 8, (3, 4))
    with pytest.raises(ValueError, match="memory_efficient_attention_grad: attribute 'dropout_p'"):
        tvmgrad.run("memory_efficient_attention_grad", mea, {**mattrs, "dropout_p": 0.5})
    with pytest.raises(ValueError, match="memory_efficient_attention_grad: input 'bias' cannot be combined"):
        cu = np.array([0, 3], np.int32)
        tvmgrad.run("memory_efficient_attention_grad", {**mea, "cu_seqlens_q": cu, "cu_seqlens_k": np.array([0, 4], np.int32)}, mattrs)
    with pytest.raises(ValueError, match="memory_efficient_attention_grad: input 'bias'"):
        tvmgrad.run("memory_efficient_attention_grad", {**mea, "bias": np.zeros((2, 2, 3, 4), np.float32)}, mattrs)


def _unpadded_inputs():
    rng = _rng(15)
    q, k, v, do, cq, ck = _packed(rng, "float32", [3, 2], [2, 3], 2, 2, 8)
    out, lse3, *_ = varlen_ref(q, k, v, do, cq, ck, 0.3)
    return ({"q": _as(q, "float32"), "k": _as(k, "float32"), "v": _as(v, "float32"),
             "cu_seqlens_q": cq, "cu_seqlens_k": ck, "out": _as(out, "float32"),
             "softmax_lse": lse3.astype(np.float32), "seed_offset": np.zeros(2, np.int64),
             "out_grad": _as(do, "float32")},
            {"max_seqlen_q": 3, "max_seqlen_k": 3, "scale": 0.3})


def test_half_inputs_keep_dtypes():
    inputs, _ = _flash_case("bfloat16", 1, 3, 3, 1, 1, 8)
    r = tvmgrad.run("flash_attn_grad", inputs)
    assert r["q_grad"].dtype == np.dtype(ml_dtypes.bfloat16)
