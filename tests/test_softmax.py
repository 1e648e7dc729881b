"""Softmax-family grads against Paddle 3.3.1 (te_defs/softmax.py).

Paddle bindings (probed in subprocesses): log_softmax_grad, gumbel_softmax_grad and
cross_entropy_with_softmax_grad take the YAML args and run on CPU (float32/float64);
margin_cross_entropy_grad has no CPU kernel (GPU only), so its oracle is a float64 numpy
transcription of Paddle's CUDA kernel, itself checked against finite differences of the forward.
Paddle's CPU cross-entropy kernel writes out of bounds for a hard label outside [0, C) (no check);
tvmgrad rejects such labels with a ValueError.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, cast, check, rng
from numgrad import central_diff

# shape, axis: last axis, middle axis, first axis, 1-D, size-1 dims, empty, long rows
AXES = [((4, 7), -1), ((3, 5, 4), 1), ((2, 3), 0), ((5,), 0), ((1, 1), -1), ((2, 0, 3), 1),
        ((3, 300), 1), ((2, 3, 1, 4), -2)]


def softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _softmax_inputs(shape, axis, seed=0):
    x = rng(seed).standard_normal(shape) * 2
    return softmax(x, axis) if x.size else x, rng(seed + 1).standard_normal(shape)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,axis", AXES[:3])
def test_log_softmax_grad_dtypes(shape, axis, dtype):
    p, g = _softmax_inputs(shape, axis)
    with np.errstate(divide="ignore"):
        check("log_softmax_grad", {"out": np.log(p), "out_grad": g}, {"axis": axis}, dtype)


@pytest.mark.parametrize("shape,axis", AXES[3:])
def test_log_softmax_grad_shapes(shape, axis):
    p, g = _softmax_inputs(shape, axis)
    out = check("log_softmax_grad", {"out": np.log(p), "out_grad": g}, {"axis": axis}, "float64")
    assert out["x_grad"].shape == shape


def test_log_softmax_grad_zero_probability():
    """out = −inf (a probability that underflowed): exp(out) = 0, the grad is out_grad there."""
    with np.errstate(divide="ignore"):
        out = np.log(np.array([[1.0, 0.0, 0.0], [0.5, 0.25, 0.25]]))
    g = np.array([[1.0, 2.0, 3.0], [1.0, -1.0, 0.5]])
    res = check("log_softmax_grad", {"out": out, "out_grad": g}, {"axis": -1}, "float32")
    np.testing.assert_allclose(res["x_grad"][0], [1 - 6, 2, 3], rtol=1e-6)


def test_log_softmax_grad_half_accumulates_in_float32():
    """A long row of float16 cotangents: the row sum is accumulated in float32 (a float16 sum of
    4096 values would be off by far more than the tolerance)."""
    n = 4096
    p = np.full((1, n), 1.0 / n)
    g = rng(3).uniform(0.5, 1.0, (1, n))
    check("log_softmax_grad", {"out": np.log(p), "out_grad": g}, {"axis": -1}, "float16")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((3, 5, 4), 1)])
def test_gumbel_softmax_grad(shape, axis, dtype):
    p, g = _softmax_inputs(shape, axis, seed=4)
    check("gumbel_softmax_grad", {"out": p, "out_grad": g}, {"axis": axis}, dtype)


@pytest.mark.parametrize("shape,axis", [((5,), 0), ((2, 0, 3), 1), ((1, 1), 0), ((2, 3, 4), 0)])
def test_gumbel_softmax_grad_shapes(shape, axis):
    p, g = _softmax_inputs(shape, axis, seed=5)
    check("gumbel_softmax_grad", {"out": p, "out_grad": g}, {"axis": axis}, "float64")


def test_softmax_bad_axis_and_shapes():
    p, g = _softmax_inputs((3, 4), -1)
    with pytest.raises(ValueError, match=r"log_softmax_grad: .*'axis' = 2 is out of range"):
        tvmgrad.run("log_softmax_grad", {"out": p, "out_grad": g}, {"axis": 2})
    with pytest.raises(ValueError, match=r"gumbel_softmax_grad: .*'out_grad' has shape \[3, 5\]"):
        tvmgrad.run("gumbel_softmax_grad", {"out": p, "out_grad": np.ones((3, 5))}, {"axis": -1})


@pytest.mark.parametrize("op", ["log_softmax_grad", "gumbel_softmax_grad"])
def test_softmax_out_and_out_grad_shapes_must_match(op):
    """out and out_grad must have one shape: a ValueError naming the input, before any build
    (log_softmax_grad's InferMeta sees only out)."""
    p, g = _softmax_inputs((4, 6), -1)
    for out, og in ((p, g[:, :5]), (p[:, :5], g), (p, g[None]), (p[None], g), (p, g.reshape(6, 4)), (p, g[0])):
        with pytest.raises(ValueError, match=rf"{op}: .*'out(_grad)?' has shape"):
            tvmgrad.prepare(op, {"out": out, "out_grad": og}, {"axis": -1})
    with pytest.raises(TypeError, match=rf"{op}: input 'out_grad' has dtype float32 but 'out' has float64"):
        tvmgrad.prepare(op, {"out": p, "out_grad": g.astype(np.float32)}, {"axis": -1})


# ------------------------------------------------------------------------------------------
# cross_entropy_with_softmax

CE = {"soft_label": False, "use_softmax": True, "numeric_stable_mode": True, "ignore_index": -100,
      "axis": -1}


def _ce_inputs(shape, axis, soft=False, ignore=None, label_dtype="int64", seed=0):
    r = rng(seed)
    x = r.standard_normal(shape)
    p = softmax(x, axis)
    ax = axis % len(shape)
    lshape = list(shape)
    lshape[ax] = 1
    if soft:
        label = softmax(r.standard_normal(shape), axis)
    else:
        label = r.integers(0, shape[ax], lshape).astype(label_dtype)
        if ignore is not None:
            label.reshape(-1)[::3] = ignore
    return {"label": label, "softmax": p, "loss_grad": r.standard_normal(lshape)}


CE_CASES = {
    "hard": ((6, 5), -1, {}),
    "hard_ignore": ((6, 5), -1, {"ignore_index": 2}),
    "hard_ignore_negative": ((6, 5), -1, {"ignore_index": -1}),
    "hard_axis1": ((2, 5, 3), 1, {}),
    "hard_axis0": ((4, 3), 0, {}),
    "soft": ((6, 5), -1, {"soft_label": True}),
    "soft_axis1": ((2, 5, 3), 1, {"soft_label": True}),
    "no_softmax_hard": ((6, 5), -1, {"use_softmax": False}),
    "no_softmax_hard_ignore": ((6, 5), -1, {"use_softmax": False, "ignore_index": 1}),
    "no_softmax_soft": ((6, 5), -1, {"use_softmax": False, "soft_label": True}),
}


@pytest.mark.parametrize("case", sorted(CE_CASES))
def test_cross_entropy_with_softmax_grad(case):
    shape, axis, attrs = CE_CASES[case]
    attrs = {**CE, "axis": axis, **attrs}
    ign = attrs["ignore_index"] if attrs["ignore_index"] != -100 else None
    inputs = _ce_inputs(shape, axis, soft=attrs["soft_label"], ignore=ign)
    for dtype in ("float64", "float32"):
        check("cross_entropy_with_softmax_grad", inputs, attrs, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["hard_ignore", "soft"])
def test_cross_entropy_with_softmax_grad_half(case, dtype):
    shape, axis, attrs = CE_CASES[case]
    attrs = {**CE, "axis": axis, **attrs}
    inputs = _ce_inputs(shape, axis, soft=attrs["soft_label"], ignore=attrs["ignore_index"])
    check("cross_entropy_with_softmax_grad", inputs, attrs, dtype)


def test_cross_entropy_with_softmax_grad_int32_labels_and_empty():
    inputs = _ce_inputs((6, 5), -1, label_dtype="int32")
    check("cross_entropy_with_softmax_grad", inputs, CE, "float32")
    empty = {"label": np.zeros((0, 1), "int64"), "softmax": np.zeros((0, 5)),
             "loss_grad": np.zeros((0, 1))}
    assert tvmgrad.run("cross_entropy_with_softmax_grad", empty, CE)["input_grad"].shape == (0, 5)


def test_cross_entropy_with_softmax_grad_bad_input():
    inputs = _ce_inputs((4, 5), -1)
    bad = dict(inputs, label=np.array([[0], [5], [1], [2]]))
    with pytest.raises(ValueError, match=r"cross_entropy_with_softmax_grad: input 'label' holds 5, out of range"):
        tvmgrad.run("cross_entropy_with_softmax_grad", bad, CE)
    bad = dict(inputs, label=np.array([[0], [-3], [1], [2]]))
    with pytest.raises(ValueError, match=r"'label' holds -3"):
        tvmgrad.run("cross_entropy_with_softmax_grad", bad, CE)
    with pytest.raises(ValueError, match=r"cross_entropy_with_softmax_grad: input 'label' has shape \[3, 1\]"):
        tvmgrad.run("cross_entropy_with_softmax_grad", dict(inputs, label=inputs["label"][:3]), CE)
    with pytest.raises(ValueError, match=r"cross_entropy_with_softmax_grad: input 'loss_grad' has shape"):
        tvmgrad.run("cross_entropy_with_softmax_grad", dict(inputs, loss_grad=np.ones((4, 5))), CE)
    with pytest.raises(ValueError, match=r"cross_entropy_with_softmax_grad: attribute 'axis' = 3"):
        tvmgrad.run("cross_entropy_with_softmax_grad", inputs, {**CE, "axis": 3})
    with pytest.raises(ValueError, match=r"'label' has dtype float64; hard labels must be"):
        tvmgrad.run("cross_entropy_with_softmax_grad",
                    dict(inputs, label=inputs["label"].astype("float64")), CE)


# ------------------------------------------------------------------------------------------
# margin_cross_entropy (GPU-only in Paddle: numpy transcription of its CUDA kernel)

MCE = {"return_softmax": False, "ring_id": 0, "rank": 0, "nranks": 1, "margin1": 1.0,
       "margin2": 0.5, "margin3": 0.0, "scale": 64.0}


def mce_forward(logits, label, m1, m2, m3, s):
    """Paddle's margin_cross_entropy forward (ArcFace-style): the label's cosine becomes
    cos(m1·acos(x) + m2) − m3, everything times s, then softmax cross entropy."""
    z = logits.copy()
    rows = np.arange(len(label))
    x = logits[rows, label]
    z[rows, label] = np.cos(m1 * np.arccos(x) + m2) - m3
    z = z * s
    sm = softmax(z, -1)
    return sm, -np.log(sm[rows, label])


def mce_grad_reference(inputs, attrs, rounded=True):
    """Paddle's CalculateGrad kernel in float64 (float attributes rounded to float32 as there;
    ``rounded=False``: as given, to show the rounding matters)."""
    f = (lambda v: float(np.float32(v))) if rounded else float  # noqa: E731
    m1, m2, s = f(attrs["margin1"]), f(attrs["margin2"]), f(attrs["scale"])
    logits = inputs["logits"].astype(np.float64)
    sm = inputs["softmax"].astype(np.float64)
    g = inputs["loss_grad"].astype(np.float64).reshape(-1, 1)
    label = inputs["label"].reshape(-1)
    grad = sm * g
    rows = np.arange(len(label))
    at = (sm[rows, label] - 1) * g[:, 0]
    if abs(m1 - 1) > 1e-8 or abs(m2) > 1e-8:
        x = logits[rows, label]
        at = at * m1 * np.sin(m1 * np.arccos(x) + m2) / np.sqrt(1 - x * x)
    grad[rows, label] = at
    if abs(s - 1) > 1e-8:
        grad = grad * s
    return {"logits_grad": grad.astype(inputs["softmax"].dtype)}


def _mce_inputs(n=5, c=7, attrs=MCE, label_dtype="int64", seed=0):
    r = rng(seed)
    logits = r.uniform(-0.95, 0.95, (n, c))
    label = r.integers(0, c, (n,)).astype(label_dtype)
    sm, _ = mce_forward(logits, label, attrs["margin1"], attrs["margin2"], attrs["margin3"],
                        attrs["scale"])
    return {"logits": logits, "label": label, "softmax": sm, "loss_grad": r.standard_normal((n, 1))}


MCE_ATTRS = {
    "arcface": MCE,
    "cosface": {**MCE, "margin1": 1.0, "margin2": 0.0, "margin3": 0.35, "scale": 30.0},
    "sphereface": {**MCE, "margin1": 1.35, "margin2": 0.0, "margin3": 0.0, "scale": 1.0},
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(MCE_ATTRS))
def test_margin_cross_entropy_grad(name, dtype):
    attrs = MCE_ATTRS[name]
    inputs = _mce_inputs(attrs=attrs, label_dtype="int32" if name == "cosface" else "int64")
    rtol = {"float16": 5e-3, "bfloat16": 3e-2}.get(dtype)
    check("margin_cross_entropy_grad", inputs, attrs, dtype, oracle=mce_grad_reference, rtol=rtol,
          atol=None if rtol is None else 5e-2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_margin_cross_entropy_grad_rounds_float_attributes_like_paddle(dtype):
    """margin1/2/3 and scale are C++ floats in Paddle's kernel: rounded to float32 before the
    (double) math. With margins float32 cannot hold exactly the float64 grad matches the
    kernel's to ~1e-15 and differs from unrounded margins by ~1e-8."""
    attrs = {**MCE, "margin1": 1.1, "margin2": 0.3, "margin3": 0.1, "scale": 30.3}
    inputs = _mce_inputs(attrs=attrs, seed=3)
    got = check("margin_cross_entropy_grad", inputs, attrs, dtype, oracle=mce_grad_reference,
                rtol=1e-13 if dtype == "float64" else None)["logits_grad"]
    if dtype == "float64":
        unrounded = mce_grad_reference(inputs, attrs, rounded=False)["logits_grad"]
        assert np.abs(got - unrounded).max() > 1e-9 * np.abs(unrounded).max()


def test_margin_cross_entropy_grad_attribute_constants_keep_float32_rounding():
    """TVM folds cast(float32, FloatImm) without rounding the value; a baked-in attribute is
    rounded on the host instead."""
    from tvmgrad.lazy import tirx
    from tvmgrad.te_defs._math import float_attr
    v = float_attr(tirx.const(0.3, "float64"))
    assert float(v.value) == float(np.float32(0.3)) != 0.3
    assert str(float_attr(tirx.Var("m", "float64")).ty) == "float64"


def test_margin_cross_entropy_grad_is_the_derivative():
    """The reference (Paddle's kernel) is d loss / d logits of the forward (central differences)."""
    attrs = {**MCE, "scale": 4.0}
    inputs = _mce_inputs(n=3, c=4, attrs=attrs)
    label, logits, g = inputs["label"], inputs["logits"], inputs["loss_grad"][:, 0]
    ours = tvmgrad.run("margin_cross_entropy_grad", inputs, attrs)["logits_grad"]
    num = central_diff(lambda lg: (mce_forward(lg, label, 1.0, 0.5, 0.0, 4.0)[1] * g).sum(), logits)
    np.testing.assert_allclose(ours, num, rtol=1e-5, atol=1e-7)


def test_margin_cross_entropy_grad_bad_input():
    inputs = _mce_inputs()
    with pytest.raises(ValueError, match=r"margin_cross_entropy_grad: input 'label' holds 7, out of range"):
        tvmgrad.run("margin_cross_entropy_grad", dict(inputs, label=np.array([0, 1, 7, 2, 3])), MCE)
    with pytest.raises(ValueError, match=r"margin_cross_entropy_grad: only the single-process case"):
        tvmgrad.run("margin_cross_entropy_grad", inputs, {**MCE, "nranks": 2})
    with pytest.raises(ValueError, match=r"margin_cross_entropy_grad: input 'label' has shape \[4\]"):
        tvmgrad.run("margin_cross_entropy_grad", dict(inputs, label=inputs["label"][:4]), MCE)
    with pytest.raises(ValueError, match=r"margin_cross_entropy_grad: input 'label' has dtype float64"):
        tvmgrad.run("margin_cross_entropy_grad", dict(inputs, label=inputs["label"] * 1.0), MCE)


def test_half_output_dtypes():
    inputs = _ce_inputs((4, 5), -1)
    out = tvmgrad.run("cross_entropy_with_softmax_grad", {k: cast(v, "bfloat16") for k, v in inputs.items()}, CE)
    assert out["input_grad"].dtype == cast(np.zeros(1), "bfloat16").dtype
