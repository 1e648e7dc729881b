"""PyTorch references for the attention and sequence-loss grads, with realistic benchmark inputs.

* flash_attn_grad: ``torch.nn.functional.scaled_dot_product_attention`` and autograd (the way a
  torch user gets attention grads; on the CPU it runs the math / flash CPU kernel). Bench shape
  B = 2, S = 1024, H = 16 query heads, 8 kv heads (grouped), D = 64; FLOPs of the backward
  ≈ 2.5 · 4·B·S²·H·D. Paddle's CPU build has no flash-attention kernel (no Paddle reference).
* warpctc_grad / warprnnt_grad: the backward ops only scale the forward's stored gradient by the
  loss cotangent (the alpha-beta recursions run in the forward), so the torch reference is that
  broadcast multiply; Paddle's ``_C_ops.warpctc_grad`` / ``warprnnt_grad`` run on the CPU.
"""

from __future__ import annotations

import numpy as np

from . import uniform


# ------------------------------------------------------------------------------------------
# flash attention

FLASH_SHAPE = dict(B=2, S=1024, H=16, Hk=8, D=64)


def flash_flops(B, S, H, D, **_):
    """The conventional FLOP count of a FlashAttention backward (2.5 x the forward's 4·B·S²·H·D)."""
    return 2.5 * 4 * B * S * S * H * D


def _flash_inputs(size, dtype):
    B, S, H, Hk, D = (FLASH_SHAPE[k] for k in ("B", "S", "H", "Hk", "D"))
    q, k, v = (uniform(s, dtype, i, 0.5) for i, s in
               enumerate([(B, S, H, D), (B, S, Hk, D), (B, S, Hk, D)]))
    do = uniform((B, S, H, D), dtype, 3)
    # the forward's out and float32 softmax_lse, computed per head in float32
    qf, kf, vf = (np.asarray(a, np.float32) for a in (q, k, v))
    G = H // Hk
    out = np.empty((B, S, H, D), np.float32)
    lse = np.empty((B, H, S), np.float32)
    scale = np.float32(1 / np.sqrt(D))
    for b in range(B):
        for h in range(H):
            s = qf[b, :, h] @ kf[b, :, h // G].T * scale
            m = s.max(-1, keepdims=True)
            e = np.exp(s - m)
            z = e.sum(-1, keepdims=True)
            out[b, :, h] = (e / z) @ vf[b, :, h // G]
            lse[b, h] = (np.log(z) + m)[:, 0]
    return ({"q": q, "k": k, "v": v, "out": out.astype(q.dtype), "softmax_lse": lse,
             "seed_offset": np.zeros(2, np.int64), "out_grad": do},
            {"dropout": 0.0, "causal": False})


def _flash_torch(t, a):
    import torch
    import torch.nn.functional as F

    q, k, v = (t[n].transpose(1, 2).detach().requires_grad_() for n in ("q", "k", "v"))
    G = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(G, dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=bool(a.get("causal")))
    do = t["out_grad"].transpose(1, 2)
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


# ------------------------------------------------------------------------------------------
# sequence losses

def _warpctc_inputs(size, dtype):
    T, B, C = 256, 32, 1024                       # ~8M logits: an ASR batch over a 1k vocabulary
    lengths = np.random.default_rng(5).integers(T // 2, T + 1, B).astype(np.int64)
    return ({"logits": uniform((T, B, C), dtype), "logits_length": lengths,
             "warpctcgrad": uniform((T, B, C), dtype, 1), "loss_grad": uniform((B, 1), dtype, 2)},
            {"blank": 0, "norm_by_times": True})


def _warpctc_torch(t, a):
    wg, lg = t["warpctcgrad"], t["loss_grad"].reshape(1, -1, 1)
    if a.get("norm_by_times"):
        lg = lg / t["logits_length"].to(wg.dtype).reshape(1, -1, 1)
    return lambda: wg * lg


def _warprnnt_inputs(size, dtype):
    B, T, U, C = 8, 128, 32, 512
    return ({"input": uniform((B, T, U, C), dtype),
             "input_lengths": np.full(B, T, np.int32),
             "warprnntgrad": uniform((B, T, U, C), dtype, 1), "loss_grad": uniform((B,), dtype, 2)},
            {"blank": 0, "fastemit_lambda": 0.0})


def _warprnnt_torch(t, a):
    wg, lg = t["warprnntgrad"], t["loss_grad"].reshape(-1, 1, 1, 1)
    return lambda: wg * lg


TORCH = {
    "flash_attn_grad": _flash_torch,
    "warpctc_grad": _warpctc_torch,
    "warprnnt_grad": _warprnnt_torch,
}

# Paddle's CPU build has no flash-attention kernel: no reference (None skips it).
PADDLE = {"flash_attn_grad": lambda t, a: None}

INPUTS = {
    "flash_attn_grad": _flash_inputs,
    "warpctc_grad": _warpctc_inputs,
    "warprnnt_grad": _warprnnt_inputs,
}


FLOPS = {"flash_attn_grad": lambda inputs, attrs: flash_flops(
    B=inputs["q"].shape[0], S=inputs["q"].shape[1], H=inputs["q"].shape[2], D=inputs["q"].shape[3])}
