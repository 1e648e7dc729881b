"""Matrix-product grads against Paddle 3.3.1 (te_defs/matmul.py): bmm, addmm, dot, mv, cross,
trace, kron, bilinear, multi_dot, weight_only_linear.

Every op runs in every float dtype on odd and size-1 shapes (and empty ones where the op allows
them); linear grads are checked against their forward with the adjoint identity in float64.
Where Paddle has no CPU kernel or crashes the oracle is numpy, noted at the test:
* multi_dot_grad: the _C_ops binding rejects its own YAML signature ("Outputs(X@GRAD) size = 0"):
  the oracle is paddle.grad through paddle.linalg.multi_dot;
* weight_only_linear_grad: GPU-only in Paddle; the oracle dequantises with numpy from weights
  quantised by Paddle's CPU weight_quantize (the arch-80 layout);
* cross_grad with a broadcast y: Paddle 3.3.1 returns a y_grad of the wrong shape and then
  aborts (free(): invalid next size); tvmgrad rejects it.
"""

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from harness import (FLOATS, TOL, assert_close, check, from_paddle, leaf, pgrad, rng, scheduled,
                     to_paddle)

FAST = ("float64", "float32")


def N(*shape, seed=0):
    return rng(seed + sum(shape) * 7 + len(shape)).standard_normal(shape)


# ------------------------------------------------------------------------------------------
# bmm

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B,M,K,Nn", [(2, 3, 4, 5), (1, 1, 1, 1), (3, 17, 9, 70)])
def test_bmm_grad(dtype, B, M, K, Nn):
    check("bmm_grad", {"x": N(B, M, K), "y": N(B, K, Nn), "out_grad": N(B, M, Nn)}, {}, dtype)


@pytest.mark.parametrize("shape", [(2, 0, 3, 4), (2, 3, 0, 4), (0, 2, 3, 4)])
def test_bmm_grad_empty(shape):
    B, M, K, Nn = shape
    out = tvmgrad.run("bmm_grad", {"x": N(B, M, K), "y": N(B, K, Nn), "out_grad": N(B, M, Nn)})
    assert out["x_grad"].shape == (B, M, K) and out["y_grad"].shape == (B, K, Nn)
    np.testing.assert_array_equal(out["x_grad"], 0)      # an empty contraction is 0
    np.testing.assert_array_equal(out["y_grad"], 0)


def test_bmm_grad_adjoint():
    """⟨dX·y + x·dY, G⟩ = ⟨dX, x_grad⟩ + ⟨dY, y_grad⟩ (float64)."""
    x, y, g, dx, dy = N(3, 5, 6), N(3, 6, 4), N(3, 5, 4), N(3, 5, 6, seed=1), N(3, 6, 4, seed=1)
    out = tvmgrad.run("bmm_grad", {"x": x, "y": y, "out_grad": g})
    lhs = np.sum((dx @ y + x @ dy) * g)
    rhs = np.sum(dx * out["x_grad"]) + np.sum(dy * out["y_grad"])
    assert abs(lhs - rhs) < 1e-10 * abs(lhs)


def test_bmm_grad_large_tiles():
    """Several CPU tiles and tails in every dim (64-wide panels, the micro-kernel's row tiles)."""
    check("bmm_grad", {"x": N(2, 130, 67), "y": N(2, 67, 129), "out_grad": N(2, 130, 129)}, {},
          "float32", rtol=1e-4, atol=1e-4)


def test_bmm_grad_packed_copies_partition_their_crop():
    """The operand copies packed for the CPU micro-kernel (schedules/cpu/gemm_dense._source) run
    their whole row groups without the crop's test: each loop the test reads carries TVM's
    loop-partition hint (the tails keep it; test_bmm_grad_large_tiles checks their values)."""
    import re

    _, text = scheduled("bmm_grad", {"x": N(2, 130, 67), "y": N(2, 67, 129),
                                     "out_grad": N(2, 130, 129)})
    for copy in ("bmm_dx_a", "bmm_dy_a"):
        nest = re.search(rf"((?:\n *for [^\n]*)+)\n *with T\.sblock\(\"{copy}\"\)", text).group(1)
        loops = nest.strip().splitlines()
        assert len(loops) == 3 and all("pragma_loop_partition_hint" in lp for lp in loops), nest


@pytest.mark.parametrize("cpu,lanes,blocked", [("x86-64-v3", 8, []),
                                                ("x86-64-v4", 16, ["bmm_dx_b"])])
@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="x86-64 CPU names")
def test_bmm_grad_transposed_panel_copies_in_blocks(cpu, lanes, blocked):
    """AVX-512: x_grad's panel of y^T (its 64 lanes walk y across 64 rows) is copied a block of
    lanes x lanes at a time, each block's lanes unrolled around a vector run along y's rows
    (schedules/cpu/gemm_dense._transpose_in_blocks); y_grad's panel (rows of out_grad) is not,
    nor is AVX2's 16-lane panel (2 vectors: not worth it, measured). Odd shapes: the tails of
    both blocks' loops; the grads are the products'."""
    import re

    x, y, g = (N(2, 13, 37), N(2, 37, 21), N(2, 13, 21))
    inputs = {k: v.astype("float32") for k, v in zip(("x", "y", "out_grad"), (x, y, g))}
    planned, text = scheduled("bmm_grad", inputs, cpu=cpu)
    copies = re.findall(rf"T\.unroll\({lanes}\):\s*for \w+ in T\.vectorized\({lanes}\):\s*"
                        r"with T\.sblock\(\"(\w+)\"\)", text)
    assert copies == blocked, text
    if not planned.target.missing_on_host:          # this host runs the kernel
        out = tvmgrad.run("bmm_grad", inputs, target=f"llvm:{cpu}")
        np.testing.assert_allclose(out["x_grad"], g @ y.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["y_grad"], x.transpose(0, 2, 1) @ g, rtol=1e-4, atol=1e-4)


def test_bmm_grad_errors():
    with pytest.raises(ValueError, match=r"bmm_grad: .*contracted dim.*y.shape\[1\]"):
        tvmgrad.run("bmm_grad", {"x": N(2, 3, 4), "y": N(2, 5, 5), "out_grad": N(2, 3, 5)})
    with pytest.raises(ValueError, match=r"bmm_grad: input 'x' must have rank 3"):
        tvmgrad.run("bmm_grad", {"x": N(3, 4), "y": N(4, 5), "out_grad": N(3, 5)})
    with pytest.raises(TypeError, match=r"bmm_grad: input 'y' has dtype float32"):
        tvmgrad.run("bmm_grad", {"x": N(2, 3, 4), "y": N(2, 4, 5).astype("float32"),
                                 "out_grad": N(2, 3, 5)})


# ------------------------------------------------------------------------------------------
# addmm

ADDMM = {"alpha": 0.7, "beta": 1.3}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("input_shape", [(3, 5), (5,), (1, 5), (3, 1), (1, 1)])
@pytest.mark.sweep
def test_addmm_grad(dtype, input_shape):
    check("addmm_grad", {"input": N(*input_shape), "x": N(3, 4), "y": N(4, 5),
                         "out_grad": N(3, 5)}, ADDMM, dtype)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 0.1, "beta": 0.0}, {"alpha": -2.5, "beta": 1e-3}])
def test_addmm_grad_scalars(attrs):
    """alpha/beta are C++ floats in Paddle (0.1 is rounded to float32 even for float64 data)."""
    check("addmm_grad", {"input": N(3, 5), "x": N(3, 4), "y": N(4, 5), "out_grad": N(3, 5)},
          attrs, "float64")


def test_addmm_grad_errors():
    with pytest.raises(ValueError, match=r"addmm_grad: input 'input' of shape \[4\] does not broadcast"):
        tvmgrad.run("addmm_grad", {"input": N(4), "x": N(3, 4), "y": N(4, 5), "out_grad": N(3, 5)})
    with pytest.raises(ValueError, match=r"addmm_grad: columns: out_grad.shape\[1\] = 6"):
        tvmgrad.run("addmm_grad", {"input": N(5), "x": N(3, 4), "y": N(4, 5), "out_grad": N(3, 6)})


# ------------------------------------------------------------------------------------------
# dot, mv

@pytest.mark.parametrize("dtype", FLOATS)
def test_dot_grad(dtype):
    check("dot_grad", {"x": N(7), "y": N(7, seed=1), "out_grad": N()}, {}, dtype)
    check("dot_grad", {"x": N(3, 6), "y": N(3, 6, seed=1), "out_grad": N(3)}, {}, dtype)


def test_dot_grad_keepdim_cotangent():
    check("dot_grad", {"x": N(3, 6), "y": N(3, 6, seed=1), "out_grad": N(3, 1)}, {}, "float64")


def test_dot_grad_errors():
    with pytest.raises(ValueError, match=r"dot_grad: inputs 'x' \[3\] and 'y' \[4\]"):
        tvmgrad.run("dot_grad", {"x": N(3), "y": N(4), "out_grad": N()})
    with pytest.raises(ValueError, match=r"dot_grad: input 'out_grad' has shape \[2\]"):
        tvmgrad.run("dot_grad", {"x": N(3, 4), "y": N(3, 4), "out_grad": N(2)})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,K", [(3, 6), (1, 1), (0, 4)])
def test_mv_grad(dtype, M, K):
    if M == 0:   # Paddle fails on the empty case: the grad of an empty mv is zeros
        out = tvmgrad.run("mv_grad", {"x": N(0, K), "vec": N(K), "out_grad": N(0)})
        np.testing.assert_array_equal(out["vec_grad"], 0)
        assert out["x_grad"].shape == (0, K)
        return
    check("mv_grad", {"x": N(M, K), "vec": N(K), "out_grad": N(M)}, {}, dtype)


# ------------------------------------------------------------------------------------------
# cross

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,axis", [((3, 4), 9), ((4, 3), 9), ((2, 5, 3), -1), ((3, 3), 1),
                                        ((2, 3, 1, 2), 1)])
def test_cross_grad(dtype, shape, axis):
    check("cross_grad", {"x": N(*shape), "y": N(*shape, seed=1), "out_grad": N(*shape, seed=2)},
          {"axis": axis}, dtype)


def test_cross_grad_errors():
    with pytest.raises(ValueError, match=r"cross_grad: no dimension of x \[2, 4\] has size 3"):
        tvmgrad.run("cross_grad", {"x": N(2, 4), "y": N(2, 4), "out_grad": N(2, 4)})
    with pytest.raises(ValueError, match=r"cross_grad: x.shape\[1\] must be 3"):
        tvmgrad.run("cross_grad", {"x": N(3, 4), "y": N(3, 4), "out_grad": N(3, 4)}, {"axis": 1})
    with pytest.raises(ValueError, match=r"cross_grad: .*must have the same shape"):
        tvmgrad.run("cross_grad", {"x": N(3, 4), "y": N(1, 4), "out_grad": N(3, 4)})
    with pytest.raises(ValueError, match=r"cross_grad: attribute 'axis' = 5 is out of range"):
        tvmgrad.run("cross_grad", {"x": N(3, 4), "y": N(3, 4), "out_grad": N(3, 4)}, {"axis": 5})


# ------------------------------------------------------------------------------------------
# trace

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,offset,a1,a2", [((3, 4), 0, 0, 1), ((3, 4), 2, 0, 1),
                                                ((3, 4), -2, 0, 1), ((2, 3, 4), 1, -3, -1),
                                                ((2, 3, 4, 2), -1, 3, 1), ((3, 4), 7, 0, 1)])
def test_trace_grad(dtype, shape, offset, a1, a2):
    rest = [d for i, d in enumerate(shape) if i not in (a1 % len(shape), a2 % len(shape))]
    check("trace_grad", {"x": N(*shape), "out_grad": N(*rest)},
          {"offset": offset, "axis1": a1, "axis2": a2}, dtype)


def test_trace_grad_errors():
    with pytest.raises(ValueError, match=r"trace_grad: attributes 'axis1' and 'axis2' must differ"):
        tvmgrad.run("trace_grad", {"x": N(3, 4), "out_grad": N()}, {"offset": 0, "axis1": 1, "axis2": -1})
    with pytest.raises(ValueError, match=r"trace_grad: input 'out_grad' has shape \[3\]"):
        tvmgrad.run("trace_grad", {"x": N(2, 3, 4), "out_grad": N(3)}, {"offset": 0, "axis1": 1, "axis2": 2})


# ------------------------------------------------------------------------------------------
# kron

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xs,ys", [((2, 3), (4, 5)), ((2, 3), (4,)), ((3,), (2, 4)), ((1, 2, 1), (3, 1, 2))])
def test_kron_grad(dtype, xs, ys):
    r = max(len(xs), len(ys))
    xp, yp = (1,) * (r - len(xs)) + xs, (1,) * (r - len(ys)) + ys
    check("kron_grad", {"x": N(*xs), "y": N(*ys, seed=1),
                        "out_grad": N(*[a * b for a, b in zip(xp, yp)], seed=2)}, {}, dtype)


def test_kron_grad_adjoint():
    x, y = N(2, 3), N(3, 2, seed=1)
    dx, dy, g = N(2, 3, seed=2), N(3, 2, seed=3), N(6, 6, seed=4)
    out = tvmgrad.run("kron_grad", {"x": x, "y": y, "out_grad": g})
    lhs = np.sum((np.kron(dx, y) + np.kron(x, dy)) * g)
    rhs = np.sum(dx * out["x_grad"]) + np.sum(dy * out["y_grad"])
    assert abs(lhs - rhs) < 1e-10 * abs(lhs)


def test_kron_grad_errors():
    with pytest.raises(ValueError, match=r"kron_grad: input 'out_grad' has shape \[8, 14\]"):
        tvmgrad.run("kron_grad", {"x": N(2, 3), "y": N(4, 5), "out_grad": N(8, 14)})


# ------------------------------------------------------------------------------------------
# bilinear

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B,I,J,O", [(3, 4, 5, 6), (1, 1, 1, 1), (5, 7, 3, 70)])
@pytest.mark.sweep
def test_bilinear_grad(dtype, B, I, J, O):
    check("bilinear_grad", {"x": N(B, I), "y": N(B, J), "weight": N(O, I, J),
                            "out_grad": N(B, O)}, {}, dtype, rtol=5e-5 if dtype == "float32" else None)


def test_bilinear_grad_errors():
    with pytest.raises(ValueError, match=r"bilinear_grad: y features: weight.shape\[2\] = 6"):
        tvmgrad.run("bilinear_grad", {"x": N(3, 4), "y": N(3, 5), "weight": N(2, 4, 6), "out_grad": N(3, 2)})


# ------------------------------------------------------------------------------------------
# multi_dot

def multi_dot_oracle(inputs, attrs):
    xs = [leaf(a) for a in inputs["x"]]
    import paddle
    out = paddle.linalg.multi_dot(xs)
    return {"x_grad": from_paddle(pgrad(out, xs, to_paddle(inputs["out_grad"])))}


MULTI_DOT = [
    ([(3, 4), (4, 5), (5, 2)], (3, 2)),
    ([(4,), (4, 5), (5, 2), (2, 7)], (7,)),
    ([(3, 4), (4,)], (3,)),
    ([(4,), (4,)], ()),
    ([(10, 2), (2, 30), (30, 3), (3, 40)], (10, 40)),     # the cheap order is not left-to-right
    ([(1, 1), (1, 1), (1, 1)], (1, 1)),
]


@pytest.mark.parametrize("shapes,g", MULTI_DOT)
@pytest.mark.sweep
def test_multi_dot_grad(shapes, g):
    check("multi_dot_grad", {"x": [N(*s, seed=i) for i, s in enumerate(shapes)],
                             "out_grad": N(*g, seed=9)}, {}, "float64", oracle=multi_dot_oracle)


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_multi_dot_grad_dtypes(dtype):
    shapes, g = MULTI_DOT[0]
    check("multi_dot_grad", {"x": [N(*s, seed=i) for i, s in enumerate(shapes)],
                             "out_grad": N(*g, seed=9)}, {}, dtype, oracle=multi_dot_oracle)


def test_multi_dot_order():
    from tvmgrad.te_defs.matmul import chain_order
    # A1·A2 (180), then ·A3 (240), then A0· (800): 1220 multiply-adds, left to right 3000
    assert chain_order([10, 2, 30, 3, 40]) == (0, ((1, 2), 3))
    assert chain_order([3, 4, 5, 2]) == (0, (1, 2))                 # 4·5·2 + 3·4·2 < 3·4·5 + 3·5·2


def test_multi_dot_grad_errors():
    with pytest.raises(ValueError, match=r"multi_dot_grad: x\[0\] \[3, 4\] and x\[1\] \[5, 2\] cannot be multiplied"):
        tvmgrad.run("multi_dot_grad", {"x": [N(3, 4), N(5, 2)], "out_grad": N(3, 2)})
    with pytest.raises(ValueError, match=r"multi_dot_grad: input 'x\[1\]' must be 2-D"):
        tvmgrad.run("multi_dot_grad", {"x": [N(3, 4), N(4), N(4, 2)], "out_grad": N(3, 2)})
    with pytest.raises(ValueError, match=r"multi_dot_grad: input 'x' must hold at least 2 tensors"):
        tvmgrad.run("multi_dot_grad", {"x": [N(3, 4)], "out_grad": N(3, 4)})


# ------------------------------------------------------------------------------------------
# weight_only_linear

def _quantized(k, n, wd, seed=0):
    """(paddle-layout weights, scales (float32), exact dequantised W [k, n]) for random int
    weights whose per-channel max is the bound (so Paddle's scale is exact)."""
    import paddle
    from paddle.nn.quant import weight_quantize
    bound = 127 if wd == "int8" else 7
    r = rng(seed)
    q = r.integers(-bound, bound + 1, size=(k, n))
    q[0] = bound
    scale = (r.integers(1, 9, size=n) / 8.0).astype(np.float16)       # q·scale exact in fp16
    w = (q * scale.astype(np.float32)).astype(np.float16)            # exact: |q| < 2^11
    wq, s = weight_quantize(paddle.to_tensor(w), algo=f"weight_only_{wd}", arch=80)
    s = s.numpy().astype(np.float32)
    np.testing.assert_array_equal(s, scale.astype(np.float32))
    return wq.numpy(), s, q * s


@pytest.mark.parametrize("wd", ["int8", "int4"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_weight_only_linear_grad(wd, dtype):
    k, n = 128, 48
    wq, s, w = _quantized(k, n, wd)
    npd = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    g = N(2, 3, n).astype(npd)
    out = tvmgrad.run("weight_only_linear_grad",
                      {"x": np.zeros((2, 3, k), npd), "weight": wq, "weight_scale": s.astype(npd),
                       "out_grad": g}, {"weight_dtype": wd, "arch": 80, "group_size": -1})
    want = (g.astype(np.float64) @ w.T).astype(npd)
    # sums of 48 products of magnitude up to 127: the error bound scales with Σ|g||w|
    scale = (np.abs(g.astype(np.float64)) @ np.abs(w.T)).max()
    assert_close("x_grad", out["x_grad"], want, dtype, atol=4 * TOL[dtype][0] * scale)


def test_weight_only_linear_grad_errors():
    wq, s, _ = _quantized(64, 16, "int8")
    inputs = {"x": np.zeros((3, 64), np.float16), "weight": wq, "weight_scale": s.astype(np.float16),
              "out_grad": N(3, 16).astype(np.float16)}
    with pytest.raises(ValueError, match=r"weight_only_linear_grad: attribute 'arch' must be 80 or 86"):
        tvmgrad.run("weight_only_linear_grad", inputs, {"weight_dtype": "int8", "arch": 70, "group_size": -1})
    with pytest.raises(ValueError, match=r"weight_only_linear_grad: attribute 'group_size' must be -1"):
        tvmgrad.run("weight_only_linear_grad", inputs, {"weight_dtype": "int8", "arch": 80, "group_size": 64})
    with pytest.raises(ValueError, match=r"weight_only_linear_grad: attribute 'weight_dtype' must be"):
        tvmgrad.run("weight_only_linear_grad", inputs, {"weight_dtype": "int2", "arch": 80, "group_size": -1})
    with pytest.raises(ValueError, match=r"weight_only_linear_grad: input 'weight' has shape \[16, 64\], expected \[8, 64\]"):
        tvmgrad.run("weight_only_linear_grad", inputs, {"weight_dtype": "int4", "arch": 80, "group_size": -1})
    with pytest.raises(ValueError, match=r"weight_only_linear_grad: input 'x' has shape \[3, 32\]"):
        tvmgrad.run("weight_only_linear_grad", dict(inputs, x=np.zeros((3, 32), np.float16)),
                    {"weight_dtype": "int8", "arch": 80, "group_size": -1})
    with pytest.raises(TypeError, match=r"weight_only_linear_grad: input 'weight' has dtype int32"):
        tvmgrad.run("weight_only_linear_grad", dict(inputs, weight=wq.astype(np.int32)),
                    {"weight_dtype": "int8", "arch": 80, "group_size": -1})
