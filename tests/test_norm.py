"""Normalisation and norm grads against Paddle 3.3.1 (te_defs/norm.py).

Paddle bindings probed in subprocesses:
* layer_norm_grad, group_norm_grad, p_norm_grad, dist_grad, squared_l2_norm_grad, renorm_grad:
  YAML args, CPU float32/float64; l1_norm_grad: CPU float32 only (float64 is checked against
  numpy).
* instance_norm_grad: the binding takes an extra ``bias`` (x, scale, bias, saved_mean,
  saved_variance, y_grad, epsilon) and returns empty scale/bias grads unless both scale and bias
  are given; instance_norm_double_grad has no binding: the oracle is Paddle's autograd through
  ``_C_ops.instance_norm_grad`` (which runs its instance_norm_double_grad kernel); that segfaults
  when bias is None, so the oracle passes zeros.
* rms_norm_grad: 3.3.1's binding is a different (non-fused) op with no CPU kernel; the oracle is
  numpy float64, itself checked against Paddle autograd through the composite forward.
* Paddle is wrong (tests below show it): group_norm_grad on CPU without scale (it drops the mean
  of the cotangent) and for channels whose scale is 0 (it recovers x̂ from y); spectral_norm_grad
  (its formula is not the derivative of its forward); instance_norm_double_grad without ddx
  (dereferences a null tensor) or with only one of ddscale / ddbias (drops it).
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, cast, check, from_paddle, np_dtype, rng, to_paddle
from numgrad import central_diff

# ------------------------------------------------------------------------------------------
# layer_norm


def _ln_inputs(shape, b, scale=True, bias=True, seed=0):
    r = rng(seed)
    x = r.standard_normal(shape) * 1.5 + 0.3
    rows = int(np.prod(shape[:b]))
    x2 = x.reshape(rows, -1)
    inputs = {"x": x, "mean": x2.mean(1), "variance": x2.var(1), "out_grad": r.standard_normal(shape)}
    if scale:
        inputs["scale"] = r.standard_normal(x2.shape[1])
    if bias:
        inputs["bias"] = r.standard_normal(x2.shape[1])
    return inputs


LN_CASES = {
    "2d": ((6, 8), 1, True, True),
    "3d_axis1": ((2, 3, 5), 1, True, True),
    "3d_axis2": ((2, 3, 5), 2, True, False),
    "axis0": ((2, 3, 5), 0, True, True),
    "no_scale": ((4, 6), 1, False, True),
    "no_scale_no_bias": ((4, 6), 1, False, False),
    "one_column": ((5, 1), 1, True, True),
    "long_row": ((3, 700), 1, True, True),
    # more rows than the CPU kernel's chunks of rows (its scale/bias partial sums), uneven
    "many_rows": ((37, 20), 1, True, True),
}


@pytest.mark.parametrize("case", sorted(LN_CASES))
def test_layer_norm_grad(case):
    shape, b, sc, bi = LN_CASES[case]
    inputs = _ln_inputs(shape, b, sc, bi)
    outs = ["x_grad"] + (["scale_grad"] if sc else []) + (["bias_grad"] if sc and bi else [])
    # one column: x = mean, so x_grad is 0 up to rounding amplified by 1/√ε (FMA contraction
    # of t − mean(t) leaves ~1 ulp of t)
    atol = 1e-4 if case == "one_column" else None
    for dtype in ("float64", "float32"):
        got = check("layer_norm_grad", inputs, {"epsilon": 1e-5, "begin_norm_axis": b}, dtype,
                    outputs=outs, atol=atol)
        assert (got["scale_grad"] is None) == (not sc)
        assert (got["bias_grad"] is None) == (not bi)
    if bi and not sc:   # Paddle computes no bias grad without scale; ours is Σ_rows out_grad
        np.testing.assert_allclose(got["bias_grad"], inputs["out_grad"].reshape(-1, shape[-1]).sum(0),
                                   rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_grad_half(dtype):
    check("layer_norm_grad", _ln_inputs((6, 40), 1), {"epsilon": 1e-5, "begin_norm_axis": 1}, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_grad_half_with_float32_params(dtype):
    """Half x with float32 scale/bias/mean/variance (Paddle's GPU layout): the parameter grads
    stay float32 (LayerNormGradInferMeta gives them the parameters' dtype)."""
    inputs = _ln_inputs((6, 40), 1, seed=2)
    half = {k: cast(v, dtype) if k in ("x", "out_grad") else v.astype(np.float32)
            for k, v in inputs.items()}
    got = tvmgrad.run("layer_norm_grad", half, {"epsilon": 1e-5, "begin_norm_axis": 1})
    assert got["x_grad"].dtype == np_dtype(dtype)
    assert got["scale_grad"].dtype == np.float32 and got["bias_grad"].dtype == np.float32
    f32 = {k: np.asarray(v).astype(np.float32) for k, v in half.items()}
    from harness import c_ops
    want = c_ops("layer_norm_grad", f32, {"epsilon": 1e-5, "begin_norm_axis": 1})
    np.testing.assert_allclose(got["x_grad"].astype(np.float64),
                               want["x_grad"].astype(np_dtype(dtype)).astype(np.float64),
                               rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(got["scale_grad"], want["scale_grad"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["bias_grad"], want["bias_grad"], rtol=1e-4, atol=1e-4)


def test_layer_norm_grad_bad_input():
    inputs = _ln_inputs((4, 6), 1)
    attrs = {"epsilon": 1e-5, "begin_norm_axis": 1}
    with pytest.raises(ValueError, match=r"layer_norm_grad: attribute 'begin_norm_axis' = 2"):
        tvmgrad.run("layer_norm_grad", inputs, {**attrs, "begin_norm_axis": 2})
    with pytest.raises(ValueError, match=r"layer_norm_grad: input 'scale' has shape \[5\]"):
        tvmgrad.run("layer_norm_grad", dict(inputs, scale=np.ones(5)), attrs)
    with pytest.raises(ValueError, match=r"layer_norm_grad: input 'mean' has shape \[3\]"):
        tvmgrad.run("layer_norm_grad", dict(inputs, mean=np.ones(3)), attrs)
    with pytest.raises(ValueError, match=r"layer_norm_grad: input 'out_grad' has shape \[4, 5\]"):
        tvmgrad.run("layer_norm_grad", dict(inputs, out_grad=np.ones((4, 5))), attrs)
    with pytest.raises(TypeError, match=r"layer_norm_grad: input 'scale' has dtype float16"):
        tvmgrad.run("layer_norm_grad", dict(inputs, scale=inputs["scale"].astype(np.float16)), attrs)


# ------------------------------------------------------------------------------------------
# group_norm


def _gn_stats(x, groups, channel_last):
    xs = np.moveaxis(x, -1, 1) if channel_last else x
    g = xs.reshape(x.shape[0], groups, -1)
    return g.mean(2), g.var(2)


def _gn_forward(x, mean, var, scale, bias, groups, channel_last, eps=1e-5):
    xs = np.moveaxis(x, -1, 1) if channel_last else x
    n, c = xs.shape[:2]
    g = xs.reshape(n, groups, -1)
    xh = ((g - mean[..., None]) / np.sqrt(var[..., None] + np.float32(eps))).reshape(xs.shape)
    shp = (1, c) + (1,) * (xs.ndim - 2)
    y = xh * (np.ones(c) if scale is None else scale).reshape(shp) + \
        (np.zeros(c) if bias is None else bias).reshape(shp)
    return np.moveaxis(y, 1, -1) if channel_last else y, xh


def _gn_inputs(shape, groups, fmt, scale=True, bias=True, seed=0):
    r = rng(seed)
    x = r.standard_normal(shape)
    cl = fmt in ("NHWC", "NLC")
    c = shape[-1] if cl else shape[1]
    mean, var = _gn_stats(x, groups, cl)
    inputs = {"x": x, "mean": mean, "variance": var, "y_grad": r.standard_normal(shape)}
    if scale:
        inputs["scale"] = r.standard_normal(c)
    if bias:
        inputs["bias"] = r.standard_normal(c)
    inputs["y"] = _gn_forward(x, mean, var, inputs.get("scale"), inputs.get("bias"), groups, cl)[0]
    return inputs


def gn_oracle(inputs, attrs):
    """Paddle's group_norm_grad with scale/bias always given (ones/zeros when absent: Paddle's
    CPU kernel is wrong without scale) and y recomputed from these (possibly rounded) inputs."""
    import paddle
    cl = attrs["data_format"] in ("NHWC", "NLC")
    x = inputs["x"]
    c = x.shape[-1] if cl else x.shape[1]
    scale = inputs.get("scale", np.ones(c, x.dtype))
    bias = inputs.get("bias", np.zeros(c, x.dtype))
    y = _gn_forward(x.astype(np.float64), inputs["mean"], inputs["variance"], scale, bias,
                    attrs["groups"], cl, attrs["epsilon"])[0].astype(x.dtype)
    res = paddle._C_ops.group_norm_grad(
        to_paddle(x), to_paddle(scale), to_paddle(bias), to_paddle(y), to_paddle(inputs["mean"]),
        to_paddle(inputs["variance"]), to_paddle(inputs["y_grad"]), attrs["epsilon"],
        attrs["groups"], attrs["data_format"])
    out = dict(zip(["x_grad", "scale_grad", "bias_grad"], [from_paddle(t) for t in res]))
    if "scale" not in inputs:
        out["scale_grad"] = None
    if "bias" not in inputs:
        out["bias_grad"] = None
    return out


GN_CASES = {
    "nchw": ((2, 6, 3, 4), 3, "NCHW", True, True),
    "nhwc": ((2, 3, 4, 6), 2, "NHWC", True, True),
    "ncl": ((3, 4, 5), 2, "NCHW", True, False),
    "one_group": ((2, 4, 3), 1, "NCHW", False, True),
    "group_per_channel": ((2, 3, 4), 4, "NHWC", True, True),
    "no_params": ((2, 6, 5), 3, "NCHW", False, False),
    "nc_only": ((3, 4), 2, "NCHW", True, True),
    # HW past the CPU kernel's vector lanes (its per-row scale/bias partials), with a tail
    "nchw_long_rows": ((3, 4, 5, 9), 2, "NCHW", True, True),
}


@pytest.mark.parametrize("case", sorted(GN_CASES))
@pytest.mark.sweep
def test_group_norm_grad(case):
    shape, groups, fmt, sc, bi = GN_CASES[case]
    inputs = _gn_inputs(shape, groups, fmt, sc, bi)
    attrs = {"epsilon": 1e-5, "groups": groups, "data_format": fmt}
    for dtype in ("float64", "float32"):
        check("group_norm_grad", inputs, attrs, dtype, oracle=gn_oracle)


def test_group_norm_grad_scale_and_bias_partials_share_one_pass():
    """The CPU kernel sums scale_grad's and bias_grad's per-lane partials in one loop over a
    row's channels (schedules/cpu/_folded_columns.share_columns: each channel's run read by
    the second partial from L1), and its values stay right where rows are longer than the
    lanes, with a tail."""
    import re
    from tvmgrad.build import lower
    from tvmgrad.planning import plan_call
    shape, groups, fmt, sc, bi = GN_CASES["nchw_long_rows"]
    inputs = _gn_inputs(shape, groups, fmt, sc, bi)
    attrs = {"epsilon": 1e-5, "groups": groups, "data_format": fmt}
    check("group_norm_grad", inputs, attrs, "float32", oracle=gn_oracle)
    f32 = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    planned = plan_call("group_norm_grad", f32, attrs, target="llvm")
    lines = lower(planned.plan, planned.target).script().splitlines()
    at = [i for i, line in enumerate(lines) if re.match(r"\s*for \w+_m in range\(gs\):", line)]
    assert len(at) == 1, "one merged loop over the channels"
    indent = len(lines[at[0]]) - len(lines[at[0]].lstrip())
    body = []
    for line in lines[at[0] + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    blocks = set(re.findall(r'T\.sblock\("(cs_\w+_rf_rf_update)"\)', "\n".join(body)))
    assert blocks == {"cs_scale_grad_rf_rf_update", "cs_bias_grad_rf_rf_update"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_group_norm_grad_half(dtype):
    inputs = _gn_inputs((2, 6, 3, 4), 3, "NCHW")
    check("group_norm_grad", inputs, {"epsilon": 1e-5, "groups": 3, "data_format": "NCHW"}, dtype,
          oracle=gn_oracle)


def test_group_norm_grad_paddle_cpu_wrong_without_scale():
    """Paddle's CPU kernel without scale leaves out Σ out_grad (dp_bias stays 0). Ours is the
    gradient: equal to Paddle's with scale = ones, and to central differences."""
    import paddle
    inputs = _gn_inputs((2, 4, 3), 2, "NCHW", scale=False, bias=False, seed=3)
    attrs = {"epsilon": 1e-5, "groups": 2, "data_format": "NCHW"}
    ours = tvmgrad.run("group_norm_grad", inputs, attrs)["x_grad"]
    wrong = paddle._C_ops.group_norm_grad(
        to_paddle(inputs["x"]), None, None, to_paddle(inputs["y"]), to_paddle(inputs["mean"]),
        to_paddle(inputs["variance"]), to_paddle(inputs["y_grad"]), 1e-5, 2, "NCHW")[0].numpy()
    assert np.abs(ours - wrong).max() > 1e-3
    # central differences of <y_grad, group_norm(x)> with mean/var recomputed from x
    x, g = inputs["x"], inputs["y_grad"]

    def f(xx):
        m, v = _gn_stats(xx, 2, False)
        return (_gn_forward(xx, m, v, None, None, 2, False)[0] * g).sum()
    num = central_diff(f, x)
    np.testing.assert_allclose(ours, num, rtol=1e-4, atol=1e-6)


def test_group_norm_grad_zero_scale_channel():
    """A channel with scale 0: Paddle's CPU kernel cannot recover x̂ from y there (wrong x_grad
    and scale_grad); ours forms x̂ from x: compare with Paddle on the same input where that
    channel's scale is tiny instead of 0 (the gradient is continuous in scale)."""
    inputs = _gn_inputs((2, 4, 3), 2, "NCHW", seed=4)
    inputs["scale"][1] = 0.0
    attrs = {"epsilon": 1e-5, "groups": 2, "data_format": "NCHW"}
    ours = tvmgrad.run("group_norm_grad", inputs, attrs)
    near = dict(inputs, scale=inputs["scale"].copy())
    near["scale"][1] = 1e-9
    want = gn_oracle(near, attrs)
    for k in ("x_grad", "scale_grad", "bias_grad"):
        np.testing.assert_allclose(ours[k], want[k], rtol=1e-6, atol=1e-7)


def test_group_norm_grad_bad_input():
    inputs = _gn_inputs((2, 6, 3), 3, "NCHW")
    attrs = {"epsilon": 1e-5, "groups": 3, "data_format": "NCHW"}
    with pytest.raises(ValueError, match=r"group_norm_grad: attribute 'groups' = 4 must be positive and divide"):
        tvmgrad.run("group_norm_grad", inputs, {**attrs, "groups": 4})
    with pytest.raises(ValueError, match=r"group_norm_grad: attribute 'groups' = -1"):
        tvmgrad.run("group_norm_grad", inputs, {**attrs, "groups": -1})
    with pytest.raises(ValueError, match=r"group_norm_grad: attribute 'data_format' must be"):
        tvmgrad.run("group_norm_grad", inputs, {**attrs, "data_format": "CHWN"})
    with pytest.raises(ValueError, match=r"group_norm_grad: input 'mean' has shape \[2, 2\]"):
        tvmgrad.run("group_norm_grad", dict(inputs, mean=np.zeros((2, 2))), attrs)


# ------------------------------------------------------------------------------------------
# instance_norm


def _in_inputs(shape, scale=True, seed=0):
    r = rng(seed)
    x = r.standard_normal(shape)
    flat = x.reshape(shape[0] * shape[1], -1)
    inputs = {"x": x, "saved_mean": flat.mean(1), "saved_variance": 1 / np.sqrt(flat.var(1) + 1e-5),
              "y_grad": r.standard_normal(shape)}
    if scale:
        inputs["scale"] = r.standard_normal(shape[1])
    return inputs


def in_oracle(inputs, attrs):
    import paddle
    x = inputs["x"]
    res = paddle._C_ops.instance_norm_grad(
        to_paddle(x), to_paddle(inputs.get("scale")), to_paddle(np.zeros(x.shape[1], x.dtype)),
        to_paddle(inputs["saved_mean"]), to_paddle(inputs["saved_variance"]),
        to_paddle(inputs["y_grad"]), attrs.get("epsilon", 1e-5))
    return dict(zip(["x_grad", "scale_grad", "bias_grad"], [from_paddle(t) for t in res]))


@pytest.mark.parametrize("shape,scale", [((2, 3, 4, 5), True), ((2, 3, 7), False),
                                         ((1, 2, 2, 2, 3), True), ((3, 2, 1), True)])
def test_instance_norm_grad(shape, scale):
    """Without scale Paddle computes neither scale_grad nor bias_grad (empty tensors); ours has
    no scale_grad and bias_grad = Σ_{N,HW} y_grad."""
    inputs = _in_inputs(shape, scale)
    for dtype in ("float64", "float32"):
        got = check("instance_norm_grad", inputs, {"epsilon": 1e-5}, dtype, oracle=in_oracle,
                    outputs=None if scale else ["x_grad"])
    if not scale:
        assert got["scale_grad"] is None
        np.testing.assert_allclose(got["bias_grad"], inputs["y_grad"].sum((0,) + tuple(range(2, len(shape)))),
                                   rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_instance_norm_grad_half(dtype):
    inputs = _in_inputs((2, 3, 4, 5))
    got = tvmgrad.run("instance_norm_grad", {k: cast(v, dtype) for k, v in inputs.items()})
    assert got["scale_grad"].dtype == np.float32     # BatchNormParamType of a half input
    f32 = {k: cast(cast(v, dtype), "float32") for k, v in inputs.items()}
    want = in_oracle(f32, {})
    np.testing.assert_allclose(got["x_grad"].astype(np.float64),
                               want["x_grad"].astype(np_dtype(dtype)).astype(np.float64),
                               rtol=2e-2, atol=2e-2)
    for k in ("scale_grad", "bias_grad"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)


def _ind_inputs(shape=(2, 3, 4, 2), seed=0, **present):
    r = rng(seed)
    inputs = _in_inputs(shape, seed=seed)
    c = shape[1]
    out = {"x": inputs["x"], "fwd_scale": inputs["scale"], "saved_mean": inputs["saved_mean"],
           "saved_variance": inputs["saved_variance"], "grad_y": inputs["y_grad"],
           "grad_x_grad": r.standard_normal(shape), "grad_scale_grad": r.standard_normal(c),
           "grad_bias_grad": r.standard_normal(c)}
    return {k: v for k, v in out.items() if present.get(k, True)}


def ind_oracle(inputs, attrs):
    """Paddle's instance_norm_double_grad kernel via autograd of _C_ops.instance_norm_grad; an
    absent ddx/ddscale/ddbias is passed as zeros (Paddle mishandles absent ones)."""
    import paddle
    x = inputs["x"]
    c = x.shape[1]
    xt, st, dyt = (to_paddle(inputs["x"]), to_paddle(inputs.get("fwd_scale", np.ones(c, x.dtype))),
                   to_paddle(inputs["grad_y"]))
    for t in (xt, st, dyt):
        t.stop_gradient = False
    res = paddle._C_ops.instance_norm_grad(xt, st, to_paddle(np.zeros(c, x.dtype)),
                                           to_paddle(inputs["saved_mean"]),
                                           to_paddle(inputs["saved_variance"]), dyt, 1e-5)
    cot = [inputs.get("grad_x_grad", np.zeros_like(x)), inputs.get("grad_scale_grad", np.zeros(c, x.dtype)),
           inputs.get("grad_bias_grad", np.zeros(c, x.dtype))]
    grads = paddle.grad(list(res), [xt, st, dyt], [to_paddle(v) for v in cot], allow_unused=True)
    return dict(zip(["x_grad", "fwd_scale_grad", "grad_y_grad"], [from_paddle(g) for g in grads]))


IND_CASES = {
    "all": {},
    "no_ddx": {"grad_x_grad": False},
    "no_ddscale": {"grad_scale_grad": False},
    "no_ddbias": {"grad_bias_grad": False},
    "ddx_only": {"grad_scale_grad": False, "grad_bias_grad": False},
}


@pytest.mark.parametrize("case", sorted(IND_CASES))
def test_instance_norm_double_grad(case):
    inputs = _ind_inputs(**IND_CASES[case])
    for dtype in ("float64", "float32"):
        check("instance_norm_double_grad", inputs, {"epsilon": 1e-5}, dtype, oracle=ind_oracle)


def test_instance_norm_double_grad_without_scale_and_half():
    inputs = _ind_inputs(fwd_scale=False)
    check("instance_norm_double_grad", inputs, {"epsilon": 1e-5}, "float64", oracle=ind_oracle)
    got = tvmgrad.run("instance_norm_double_grad", {k: cast(v, "float16") for k, v in _ind_inputs().items()},
                      {"epsilon": 1e-5})
    assert got["fwd_scale_grad"].dtype == np.float32 and got["x_grad"].dtype == np.float16


def test_instance_norm_bad_input():
    inputs = _in_inputs((2, 3, 4))
    with pytest.raises(ValueError, match=r"instance_norm_grad: input 'saved_mean' has shape \[5\]"):
        tvmgrad.run("instance_norm_grad", dict(inputs, saved_mean=np.zeros(5)))
    with pytest.raises(ValueError, match=r"instance_norm_grad: input 'x' must have rank 2 to 5"):
        tvmgrad.run("instance_norm_grad", dict(inputs, x=np.zeros(6), y_grad=np.zeros(6)))
    with pytest.raises(ValueError, match=r"instance_norm_grad: input 'y_grad' has shape \[2, 3, 5\]"):
        tvmgrad.run("instance_norm_grad", dict(inputs, y_grad=np.zeros((2, 3, 5))))


# ------------------------------------------------------------------------------------------
# rms_norm


def rms_reference(inputs, attrs):
    b = attrs["begin_norm_axis"]
    x = inputs["x"].astype(np.float64)
    rows = int(np.prod(x.shape[:b]))
    h = x.reshape(rows, -1)
    if inputs.get("bias") is not None:
        h = h + inputs["bias"].reshape(1, -1)
    if inputs.get("residual") is not None:
        h = h + inputs["residual"].reshape(rows, -1)
    r = inputs["inv_var"].astype(np.float64).reshape(rows, 1)
    w = inputs["norm_weight"].astype(np.float64).reshape(1, -1)
    g = inputs["out_grad"].astype(np.float64).reshape(rows, -1)
    gw = g * w
    dx = r * gw - r ** 3 * h * (gw * h).mean(1, keepdims=True)
    dw = (g * h * r).sum(0)
    return {"x_grad": dx.reshape(x.shape).astype(inputs["x"].dtype),
            "norm_weight_grad": dw.reshape(inputs["norm_weight"].shape).astype(inputs["norm_weight"].dtype)}


def _rms_inputs(shape, b, extra=(), seed=0):
    r = rng(seed)
    x = r.standard_normal(shape)
    rows = int(np.prod(shape[:b]))
    cols = x.size // rows
    inputs = {"x": x, "norm_weight": r.standard_normal(cols), "out_grad": r.standard_normal(shape)}
    h = x.reshape(rows, cols).copy()
    if "bias" in extra:
        inputs["bias"] = r.standard_normal(cols)
        h += inputs["bias"]
    if "residual" in extra:
        inputs["residual"] = r.standard_normal(shape)
        h += inputs["residual"].reshape(rows, cols)
    if "norm_bias" in extra:
        inputs["norm_bias"] = r.standard_normal(cols)
    inputs["inv_var"] = 1 / np.sqrt((h ** 2).mean(1) + 1e-6)
    return inputs


RMS = {"epsilon": 1e-6, "begin_norm_axis": 1, "quant_scale": -1.0}


@pytest.mark.parametrize("extra", [(), ("bias", "residual", "norm_bias"), ("residual",)])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_rms_norm_grad(dtype, extra):
    inputs = _rms_inputs((4, 3, 5), 1, extra)
    check("rms_norm_grad", inputs, RMS, dtype, oracle=rms_reference)


def test_rms_norm_grad_reference_is_paddle_autograd():
    """The numpy reference equals Paddle autograd through the forward (with bias + residual +
    norm_bias, inv_var consistent with x)."""
    import paddle
    inputs = _rms_inputs((3, 8), 1, ("bias", "residual", "norm_bias"), seed=5)
    x = to_paddle(inputs["x"])
    w = to_paddle(inputs["norm_weight"])
    x.stop_gradient = w.stop_gradient = False
    h = x + to_paddle(inputs["bias"]) + to_paddle(inputs["residual"])
    out = h * paddle.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * w + to_paddle(inputs["norm_bias"])
    gx, gw = paddle.grad(out, [x, w], to_paddle(inputs["out_grad"]))
    ours = tvmgrad.run("rms_norm_grad", inputs, RMS)
    np.testing.assert_allclose(ours["x_grad"], gx.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours["norm_weight_grad"], gw.numpy(), rtol=1e-9, atol=1e-12)


def test_rms_norm_grad_begin_axis_and_float32_weight():
    inputs = _rms_inputs((2, 3, 4), 2, seed=6)
    check("rms_norm_grad", inputs, {**RMS, "begin_norm_axis": 2}, "float64", oracle=rms_reference)
    half = {k: cast(v, "float16") if k in ("x", "out_grad") else v.astype(np.float32)
            for k, v in inputs.items()}
    got = tvmgrad.run("rms_norm_grad", half, {**RMS, "begin_norm_axis": 2})
    assert got["norm_weight_grad"].dtype == np.float32
    want = rms_reference({k: np.asarray(v).astype(np.float64) for k, v in half.items()},
                         {"begin_norm_axis": 2})
    np.testing.assert_allclose(got["norm_weight_grad"], want["norm_weight_grad"], rtol=1e-4, atol=1e-5)


def test_rms_norm_grad_bad_input():
    inputs = _rms_inputs((4, 6), 1)
    with pytest.raises(NotImplementedError, match=r"rms_norm_grad: quant_scale > 0"):
        tvmgrad.run("rms_norm_grad", inputs, {**RMS, "quant_scale": 2.0})
    with pytest.raises(ValueError, match=r"rms_norm_grad: input 'norm_weight' has shape \[5\]"):
        tvmgrad.run("rms_norm_grad", dict(inputs, norm_weight=np.ones(5)), RMS)
    with pytest.raises(ValueError, match=r"rms_norm_grad: input 'residual' has shape \[4, 5\]"):
        tvmgrad.run("rms_norm_grad", dict(inputs, residual=np.ones((4, 5))), RMS)


# ------------------------------------------------------------------------------------------
# p_norm, dist, l1, squared l2


def _pnorm(x, p, axis, asvector):
    a = np.abs(x).reshape(-1) if asvector else np.abs(x)
    ax = None if asvector else axis
    if p == 0:
        return (a != 0).sum(ax).astype(x.dtype)
    if np.isinf(p):
        return a.max(ax) if p > 0 else a.min(ax)
    return (a ** p).sum(ax) ** (1 / p)


PNORM = [(2.0, -1, False), (1.0, 0, False), (3.0, 1, False), (0.5, -1, False), (0.0, 1, False),
         (np.inf, 1, False), (-np.inf, 1, False), (2.0, 0, True), (np.inf, 0, True)]


@pytest.mark.parametrize("p,axis,asvector", PNORM)
def test_p_norm_grad(p, axis, asvector):
    r = rng(1)
    x = r.standard_normal((3, 4))
    x[0, 1] = -x[0, 2]                    # a tie for the ±inf norms (|x| equal)
    x[1, 0] = 0.0
    for keepdim in (False, True):
        out = _pnorm(x, p, axis, asvector)
        if keepdim and not asvector:
            out = np.expand_dims(out, axis)
        inputs = {"x": x, "out": np.asarray(out), "out_grad": r.standard_normal(np.shape(out))}
        attrs = {"porder": p, "axis": axis, "epsilon": 1e-12, "keepdim": keepdim, "asvector": asvector}
        for dtype in ("float64", "float32"):
            check("p_norm_grad", inputs, attrs, dtype)


def test_p_norm_grad_inf_ties_get_full_grad():
    x = np.array([[3.0, -3.0, 1.0], [2.0, 2.0, 2.0]])
    out = np.abs(x).max(1)
    g = np.array([1.5, -2.0])
    got = tvmgrad.run("p_norm_grad", {"x": x, "out": out, "out_grad": g},
                      {"porder": np.inf, "axis": 1})["x_grad"]
    np.testing.assert_array_equal(got, [[1.5, -1.5, 0.0], [-2.0, -2.0, -2.0]])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_p_norm_grad_half(dtype):
    x = rng(2).standard_normal((4, 6))
    out = np.linalg.norm(x, axis=1)
    check("p_norm_grad", {"x": x, "out": out, "out_grad": rng(3).standard_normal(4)},
          {"porder": 2.0, "axis": 1}, dtype)


DIST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((), (3,)), ((2, 3), (1, 1))]


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 0.0, np.inf, -np.inf, 0.5])
@pytest.mark.parametrize("xs,ys", DIST[:3])
def test_dist_grad(xs, ys, p):
    r = rng(4)
    x, y = r.standard_normal(xs), r.standard_normal(ys)
    d = (x - y).reshape(-1)
    out = np.asarray(_pnorm(d, p, 0, True))
    inputs = {"x": x, "y": y, "out": out, "out_grad": np.asarray(1.7)}
    for dtype in ("float64", "float32"):
        check("dist_grad", inputs, {"p": p}, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xs,ys", DIST[2:])
def test_dist_grad_shapes_dtypes(xs, ys, dtype):
    r = rng(5)
    x, y = r.standard_normal(xs), r.standard_normal(ys)
    out = np.asarray(np.linalg.norm((x - y).reshape(-1)))
    check("dist_grad", {"x": x, "y": y, "out": out, "out_grad": np.asarray(0.8)}, {"p": 2.0}, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_l1_and_squared_l2_norm_grad(dtype):
    x = rng(6).standard_normal((3, 5))
    x[0, 0] = 0.0
    g = np.asarray(1.25)

    def l1_oracle(inputs, attrs):          # Paddle registers l1_norm_grad for float32 only
        return {"x_grad": (np.sign(inputs["x"]) * inputs["out_grad"]).astype(inputs["x"].dtype)}

    check("l1_norm_grad", {"x": x, "out_grad": g}, {}, dtype,
          oracle=l1_oracle if dtype == "float64" else None)
    check("squared_l2_norm_grad", {"x": x, "out_grad": np.array([1.25])}, {}, dtype)


def test_norm_bad_input():
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match=r"p_norm_grad: attribute 'axis' = 2 is out of range"):
        tvmgrad.run("p_norm_grad", {"x": x, "out": np.ones(3), "out_grad": np.ones(3)}, {"axis": 2})
    with pytest.raises(ValueError, match=r"p_norm_grad: input 'out' has shape \[4\]"):
        tvmgrad.run("p_norm_grad", {"x": x, "out": np.ones(4), "out_grad": np.ones(3)}, {"axis": 1})
    with pytest.raises(ValueError, match=r"dist_grad: shapes do not broadcast: x\[3, 4\], y\[3\]"):
        tvmgrad.run("dist_grad", {"x": x, "y": np.ones(3), "out": np.ones(()), "out_grad": np.ones(())},
                    {"p": 2.0})


# ------------------------------------------------------------------------------------------
# renorm


@pytest.mark.parametrize("shape,axis,p,max_norm", [((3, 4, 5), 1, 2.0, 2.0), ((4, 6), 0, 1.0, 3.0),
                                                   ((4, 6), -1, 3.0, 1.0), ((2, 3), 1, 2.0, 100.0),
                                                   ((5,), 0, 2.0, 0.5)])
def test_renorm_grad(shape, axis, p, max_norm):
    r = rng(7)
    inputs = {"x": r.standard_normal(shape), "out_grad": r.standard_normal(shape)}
    attrs = {"p": p, "axis": axis, "max_norm": max_norm}
    for dtype in ("float64", "float32"):
        check("renorm_grad", inputs, attrs, dtype, oracle=renorm_oracle)


def renorm_oracle(inputs, attrs):
    """Paddle's binding with the axis made non-negative: _C_ops.renorm_grad with a negative
    axis aborts the process (std::bad_alloc: it sizes a buffer from the raw axis)."""
    from harness import c_ops
    return c_ops("renorm_grad", inputs, dict(attrs, axis=attrs["axis"] % inputs["x"].ndim))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_renorm_grad_half(dtype):
    r = rng(8)
    check("renorm_grad", {"x": r.standard_normal((3, 4, 5)), "out_grad": r.standard_normal((3, 4, 5))},
          {"p": 2.0, "axis": 1, "max_norm": 2.0}, dtype)


def test_renorm_bad_input():
    with pytest.raises(ValueError, match=r"renorm_grad: attribute 'axis' = 2 is out of range"):
        tvmgrad.run("renorm_grad", {"x": np.ones((2, 3)), "out_grad": np.ones((2, 3))},
                    {"p": 2.0, "axis": 2, "max_norm": 1.0})


# ------------------------------------------------------------------------------------------
# spectral_norm (Paddle's grad is wrong: numpy reference)


def _sn_matrix(w, dim):
    return np.moveaxis(w, dim, 0).reshape(w.shape[dim], -1)


def sn_reference(inputs, attrs):
    """(G − ⟨G, W/σ⟩·u vᵀ)/σ after the power iterations, as the (h, w) matrix, reshaped back."""
    dim, it, eps = attrs["dim"], attrs["power_iters"], float(np.float32(attrs["eps"]))
    w = inputs["weight"].astype(np.float64)
    W, G = _sn_matrix(w, dim), _sn_matrix(inputs["out_grad"].astype(np.float64), dim)
    u, v = inputs["u"].astype(np.float64), inputs["v"].astype(np.float64)
    for _ in range(it):
        v = W.T @ u
        v = v / (np.linalg.norm(v) + eps)
        u = W @ v
        u = u / (np.linalg.norm(u) + eps)
    s = u @ W @ v
    dW = (G - (G * W / s).sum() * np.outer(u, v)) / s
    moved = np.moveaxis(w, dim, 0).shape
    return {"weight_grad": np.moveaxis(dW.reshape(moved), 0, dim).astype(inputs["weight"].dtype)}


def _sn_inputs(shape, dim, seed=0):
    r = rng(seed)
    w = r.standard_normal(shape)
    h = shape[dim]
    return {"weight": w, "u": r.standard_normal(h), "v": r.standard_normal(w.size // h),
            "out_grad": r.standard_normal(shape)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,dim,iters", [((4, 6), 0, 1), ((3, 4, 2), 1, 2), ((5, 2, 2, 2), 0, 0)])
def test_spectral_norm_grad(shape, dim, iters, dtype):
    attrs = {"dim": dim, "power_iters": iters, "eps": 1e-12}
    check("spectral_norm_grad", _sn_inputs(shape, dim), attrs, dtype, oracle=sn_reference,
          rtol={"float16": 1e-2, "bfloat16": 5e-2}.get(dtype),
          atol={"float16": 1e-2, "bfloat16": 5e-2}.get(dtype))


def test_spectral_norm_grad_is_the_derivative_and_paddle_is_not():
    """At a converged power iteration the reference is the derivative of W/σ(W) (central
    differences); Paddle's kernel returns something else. (W's spectrum is well separated,
    σ2/σ1 = 0.2, so that 12 iterations converge: the kernel unrolls them.)"""
    import paddle
    inputs = _sn_inputs((3, 4), 0, seed=9)
    q1, _ = np.linalg.qr(rng(10).standard_normal((3, 3)))
    q2, _ = np.linalg.qr(rng(11).standard_normal((4, 3)))
    inputs["weight"] = q1 @ np.diag([5.0, 1.0, 0.5]) @ q2.T
    attrs = {"dim": 0, "power_iters": 12, "eps": 1e-12}
    ours = tvmgrad.run("spectral_norm_grad", inputs, attrs)["weight_grad"]
    W, G = inputs["weight"], inputs["out_grad"]

    def f(w):
        return (G * w / np.linalg.svd(w, compute_uv=False)[0]).sum()
    num = central_diff(f, W)
    np.testing.assert_allclose(ours, num, rtol=1e-5, atol=1e-7)
    theirs = paddle._C_ops.spectral_norm_grad(*[to_paddle(inputs[k]) for k in ("weight", "u", "v", "out_grad")],
                                              0, 12, 1e-12).numpy()
    assert np.abs(theirs - num).max() > 1e-2


def test_spectral_norm_bad_input():
    inputs = _sn_inputs((4, 6), 0)
    with pytest.raises(ValueError, match=r"spectral_norm_grad: input 'u' has shape \[5\], expected \[4\]"):
        tvmgrad.run("spectral_norm_grad", dict(inputs, u=np.ones(5)), {"dim": 0, "power_iters": 1})
    with pytest.raises(ValueError, match=r"spectral_norm_grad: attribute 'dim' must be 0 or 1"):
        tvmgrad.run("spectral_norm_grad", inputs, {"dim": 2, "power_iters": 1})


def test_instance_norm_double_grad_is_vjp_of_instance_norm_grad():
    """x_grad / fwd_scale_grad / grad_y_grad are the VJP of our instance_norm_grad with the saved
    mean and inverse std recomputed from x (they are functions of x in the forward), checked by
    central differences along a random direction in float64. (tests/test_higher_order.py cannot
    check this link generically: its cotangents all take x's shape and it does not tie the saved
    statistics to x.)"""
    r = rng(11)
    shape = (2, 3, 5)
    x, s, dy = r.standard_normal(shape), r.standard_normal(3), r.standard_normal(shape)
    cx, cs, cb = r.standard_normal(shape), r.standard_normal(3), r.standard_normal(3)
    tx, ts, tdy = r.standard_normal(shape), r.standard_normal(3), r.standard_normal(shape)

    def g(x, s, dy):
        flat = x.reshape(6, -1)
        out = tvmgrad.run("instance_norm_grad", {
            "x": x, "scale": s, "saved_mean": flat.mean(1),
            "saved_variance": 1 / np.sqrt(flat.var(1) + 1e-5), "y_grad": dy}, {"epsilon": 1e-5})
        return (out["x_grad"] * cx).sum() + (out["scale_grad"] * cs).sum() + (out["bias_grad"] * cb).sum()

    e = 1e-6
    rhs = (g(x + e * tx, s + e * ts, dy + e * tdy) - g(x - e * tx, s - e * ts, dy - e * tdy)) / (2 * e)
    flat = x.reshape(6, -1)
    d = tvmgrad.run("instance_norm_double_grad", {
        "x": x, "fwd_scale": s, "saved_mean": flat.mean(1),
        "saved_variance": 1 / np.sqrt(flat.var(1) + 1e-5), "grad_y": dy, "grad_x_grad": cx,
        "grad_scale_grad": cs, "grad_bias_grad": cb}, {"epsilon": 1e-5})
    lhs = (d["x_grad"] * tx).sum() + (d["fwd_scale_grad"] * ts).sum() + (d["grad_y_grad"] * tdy).sum()
    assert abs(lhs - rhs) <= 1e-5 * max(1.0, abs(rhs)), (lhs, rhs)


def test_norm_grads_propagate_nan():
    x = np.array([[np.nan, 0.0, -1.0, 2.0]])
    check("l1_norm_grad", {"x": x, "out_grad": np.asarray(2.0)}, {}, "float32")
    check("p_norm_grad", {"x": x, "out": np.array([3.0]), "out_grad": np.array([1.0])},
          {"porder": 1.0, "axis": 1}, "float32")
