"""overlap_add_grad against Paddle 3.3.1 and correlation_grad against a float64 reference
(te_defs/signal.py).

Paddle 3.3.1 has no CPU correlation kernel ("Correlation only supports GPU now"): the oracle is a
numpy transcription of its CUDA backward (phi/kernels/gpu/correlation_grad_kernel.cu), which is
the exact gradient for stride1 = 1. With stride1 > 1 that kernel finds the windows with
truncating division and adds gradient from windows that do not contain the pixel: there the
tests check the adjoint identity with a numpy transcription of Paddle's CUDA forward instead,
and that Paddle's formula differs.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, TOL, cast, check, from_paddle, rng, to_paddle

# ------------------------------------------------------------------------------------------
# overlap_add

OLA = [((3, 5, 4), 2, -1), ((4, 5, 3), 2, 0), ((5, 4), 3, -1), ((4, 5), 1, 0),
       ((2, 3, 5, 4), 5, -1), ((4, 5, 2, 3), 4, 0), ((3, 2, 4), 3, -1), ((1, 6, 1), 2, -1),
       ((2, 0, 3), 1, -1)]


def ola_case(xs, hop, axis, seed=0):
    r = rng(seed)
    F, L = (xs[-1], xs[-2]) if axis == -1 else (xs[0], xs[1])
    seq = (F - 1) * hop + L if F else 0
    gs = xs[:-2] + (seq,) if axis == -1 else (seq,) + xs[2:]
    return {"x": r.standard_normal(xs), "out_grad": r.standard_normal(gs)}, \
        dict(hop_length=hop, axis=axis)


@pytest.mark.parametrize("xs,hop,axis", OLA)
@pytest.mark.parametrize("dtype", FLOATS)
def test_overlap_add(xs, hop, axis, dtype):
    inputs, attrs = ola_case(xs, hop, axis)
    if 0 in xs:
        out = tvmgrad.run("overlap_add_grad", {k: cast(v, dtype) for k, v in inputs.items()},
                          attrs)["x_grad"]
        assert out.shape == xs and out.dtype == cast(inputs["x"], dtype).dtype
        return
    check("overlap_add_grad", inputs, attrs, dtype)


def test_overlap_add_adjoint_with_paddle_forward():
    import paddle
    for xs, hop, axis in [((3, 5, 4), 2, -1), ((4, 5, 2, 3), 4, 0)]:
        inputs, attrs = ola_case(xs, hop, axis, seed=1)
        y = paddle._C_ops.overlap_add(to_paddle(inputs["x"]), hop, axis)
        lhs = float((from_paddle(y) * inputs["out_grad"]).sum())
        rhs = float((tvmgrad.run("overlap_add_grad", inputs, attrs)["x_grad"] * inputs["x"]).sum())
        assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))


def test_overlap_add_bad_input():
    inputs, attrs = ola_case((3, 5, 4), 2, -1)
    for change, match in [(dict(axis=1), "attribute 'axis' must be 0 or -1"),
                          (dict(hop_length=0), "attribute 'hop_length' must be > 0"),
                          (dict(hop_length=3), "input 'out_grad' has shape \\[3, 11\\]; x \\[3, 5, 4\\] "
                                               "with hop_length 3")]:
        with pytest.raises(ValueError, match=f"overlap_add_grad: {match}"):
            tvmgrad.run("overlap_add_grad", inputs, dict(attrs, **change))
    with pytest.raises(ValueError, match="input 'x' must be at least 2-D"):
        tvmgrad.run("overlap_add_grad", {"x": inputs["x"][0, 0], "out_grad": inputs["out_grad"][0]},
                    attrs)


# ------------------------------------------------------------------------------------------
# correlation: numpy transcriptions of Paddle's CUDA kernels

def corr_sizes(H, W, pad, ks, md, s1, s2):
    k = (ks - 1) // 2
    border = k + md
    return ((md // s2) * 2 + 1) ** 2, int(np.ceil((H + 2 * pad - 2 * border) / s1)), \
        int(np.ceil((W + 2 * pad - 2 * border) / s1))


def _padded(x, pad, extra):
    N, C, H, W = x.shape
    p = np.zeros((N, C, H + 2 * (pad + extra), W + 2 * (pad + extra)))
    p[:, :, extra + pad:extra + pad + H, extra + pad:extra + pad + W] = x
    return p


def corr_forward(x1, x2, pad, ks, md, s1, s2):
    """correlation_forward (zero outside the padded map)."""
    N, C, H, W = x1.shape
    k, dr = (ks - 1) // 2, md // s2
    D = 2 * dr + 1
    OC, OH, OW = corr_sizes(H, W, pad, ks, md, s1, s2)
    E = k + md + 2
    p1, p2 = _padded(x1, pad, E), _padded(x2, pad, E)
    out = np.zeros((N, OC, OH, OW))
    for j in range(OH):
        for i in range(OW):
            h1, w1 = j * s1 + md + E, i * s1 + md + E
            for tj in range(-dr, dr + 1):
                for ti in range(-dr, dr + 1):
                    acc = 0
                    for a in range(-k, k + 1):
                        for b in range(-k, k + 1):
                            acc = acc + (p1[:, :, h1 + a, w1 + b]
                                         * p2[:, :, h1 + a + tj * s2, w1 + b + ti * s2]).sum(1)
                    out[:, (tj + dr) * D + ti + dr, j, i] = acc / (ks * ks * C)
    return out


def corr_backward_paddle(x1, x2, g, pad, ks, md, s1, s2):
    """correlation_backward_input1/2, with C's truncating integer division."""
    N, C, H, W = x1.shape
    k, dr = (ks - 1) // 2, md // s2
    D = 2 * dr + 1
    OC, OH, OW = g.shape[1:]
    E = k + md + 2
    p1, p2 = _padded(x1, pad, E), _padded(x2, pad, E)
    tdiv = lambda a, b: int(a / b)  # noqa: E731
    g1, g2 = np.zeros_like(x1), np.zeros_like(x2)

    def window(hh, ww):
        xmin, ymin = tdiv(ww - k - md, s1), tdiv(hh - k - md, s1)
        xmax, ymax = tdiv(ww + k - md, s1), tdiv(hh + k - md, s1)
        if xmax < 0 or ymax < 0 or xmin >= OW or ymin >= OH or xmin > xmax or ymin > ymax:
            return None
        return max(0, ymin), min(OH - 1, ymax), max(0, xmin), min(OW - 1, xmax)

    for n in range(N):
        for y in range(H):
            for x in range(W):
                h, w = y + pad, x + pad
                s = np.zeros(C)
                win = window(h, w)
                if win:
                    y0, y1, x0, x1_ = win
                    for tc in range(OC):
                        i2, j2 = (tc % D - dr) * s2, (tc // D - dr) * s2
                        s += g[n, tc, y0:y1 + 1, x0:x1_ + 1].sum() * p2[n, :, h + j2 + E, w + i2 + E]
                g1[n, :, y, x] = s / (ks * ks * C)
                s = np.zeros(C)
                for tc in range(OC):
                    i2, j2 = (tc % D - dr) * s2, (tc // D - dr) * s2
                    win = window(h - j2, w - i2)
                    if win:
                        y0, y1, x0, x1_ = win
                        s += g[n, tc, y0:y1 + 1, x0:x1_ + 1].sum() * p1[n, :, h - j2 + E, w - i2 + E]
                g2[n, :, y, x] = s / (ks * ks * C)
    return g1, g2


def corr_case(N, C, H, W, pad, ks, md, s1, s2, seed=0):
    r = rng(seed)
    OC, OH, OW = corr_sizes(H, W, pad, ks, md, s1, s2)
    return {"input1": r.standard_normal((N, C, H, W)), "input2": r.standard_normal((N, C, H, W)),
            "out_grad": r.standard_normal((N, OC, OH, OW))}, \
        dict(pad_size=pad, kernel_size=ks, max_displacement=md, stride1=s1, stride2=s2)


def corr_oracle(inputs, attrs):
    a = {k: attrs[k] for k in ("pad_size", "kernel_size", "max_displacement", "stride1", "stride2")}
    g1, g2 = corr_backward_paddle(inputs["input1"].astype(np.float64),
                                  inputs["input2"].astype(np.float64),
                                  inputs["out_grad"].astype(np.float64), *a.values())
    return {"input1_grad": g1, "input2_grad": g2}


STRIDE1 = [(2, 3, 7, 8, 2, 1, 2, 1, 1), (1, 2, 9, 9, 3, 1, 3, 1, 2), (1, 2, 8, 7, 2, 3, 2, 1, 1),
           (2, 1, 5, 6, 0, 1, 1, 1, 1), (1, 2, 6, 6, 4, 1, 4, 1, 3)]


@pytest.mark.parametrize("case", STRIDE1)
def test_correlation_against_paddle_cuda_formula(case):
    inputs, attrs = corr_case(*case)
    check("correlation_grad", inputs, attrs, "float64", oracle=corr_oracle)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_correlation_dtypes(dtype):
    inputs, attrs = corr_case(*STRIDE1[0], seed=1)
    cast_in = {k: cast(v, dtype) for k, v in inputs.items()}
    ours = tvmgrad.run("correlation_grad", cast_in, attrs)
    want = corr_oracle(cast_in, attrs)
    rtol, atol = TOL[dtype]
    for name in ("input1_grad", "input2_grad"):
        assert ours[name].dtype == cast_in["input1"].dtype
        np.testing.assert_allclose(ours[name].astype(np.float64), want[name], rtol=rtol,
                                   atol=atol * 4, err_msg=name)


@pytest.mark.parametrize("case", [(2, 2, 9, 10, 1, 1, 2, 2, 1), (1, 3, 11, 9, 4, 3, 3, 2, 2),
                                  (1, 2, 8, 8, 2, 3, 2, 1, 1), (2, 2, 7, 9, 3, 1, 3, 3, 1)])
def test_correlation_adjoint(case):
    """⟨corr(x1, x2), g⟩ = ⟨x1, input1_grad⟩ = ⟨x2, input2_grad⟩ (bilinear), every stride."""
    inputs, attrs = corr_case(*case, seed=2)
    a = list(attrs.values())
    lhs = float((corr_forward(inputs["input1"], inputs["input2"], *a) * inputs["out_grad"]).sum())
    ours = tvmgrad.run("correlation_grad", inputs, attrs)
    for name, x in (("input1_grad", "input1"), ("input2_grad", "input2")):
        rhs = float((ours[name] * inputs[x]).sum())
        assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), (name, lhs, rhs)
    if attrs["stride1"] > 1:
        g1, _ = corr_backward_paddle(inputs["input1"], inputs["input2"], inputs["out_grad"], *a)
        assert not np.allclose(g1, ours["input1_grad"])      # Paddle's CUDA formula is off here


def test_correlation_bad_input():
    inputs, attrs = corr_case(*STRIDE1[0])
    with pytest.raises(ValueError, match="correlation_grad: input 'out_grad' must have shape "
                                         "\\[2, 25, 7, 8\\]"):
        tvmgrad.run("correlation_grad", dict(inputs, out_grad=inputs["out_grad"][:, :9]), attrs)
    with pytest.raises(ValueError, match="input 'input2' has shape \\[2, 3, 7, 7\\] but 'input1'"):
        tvmgrad.run("correlation_grad", dict(inputs, input2=inputs["input2"][..., :7]), attrs)
    with pytest.raises(ValueError, match="attribute 'stride1' must be > 0"):
        tvmgrad.run("correlation_grad", inputs, dict(attrs, stride1=0))
    with pytest.raises(ValueError, match="smaller than the window border"):
        tvmgrad.run("correlation_grad", inputs, dict(attrs, pad_size=0, max_displacement=5))
