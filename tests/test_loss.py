"""Loss and whole-tensor reduction grads against Paddle 3.3.1 (te_defs/loss.py).

Paddle bindings probed in subprocesses: every op here takes the YAML args. log_loss_grad is
registered for float32 only on CPU (float64 is checked against numpy). Paddle's CPU nll_loss_grad
and cross-entropy kernels index with the label unchecked (a label outside [0, C) writes out of
bounds); tvmgrad rejects such labels. sigmoid_cross_entropy_with_logits with normalize and every
label ignored divides by a zero count in Paddle (NaN/inf); tvmgrad does the same.
Linear grads (label_smooth, mean_all, identity_loss, reduce_as, segment_pool SUM/MEAN) are also
checked by the adjoint identity <A x, y> = <x, Aᵀ y> against Paddle's forward in float64.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, cast, check, rng, to_paddle

SPECIAL_G = (np.inf, -np.inf, np.nan)


def _with_specials(g, values=SPECIAL_G, seed=50):
    g = g.copy()
    flat = g.reshape(-1)
    if flat.size >= len(values):
        flat[rng(seed).permutation(flat.size)[:len(values)]] = values
    return g


# ------------------------------------------------------------------------------------------
# elementwise losses


@pytest.mark.parametrize("dtype", FLOATS)
def test_bce_loss_grad(dtype):
    r = rng(0)
    x = r.uniform(0.02, 0.98, (5, 6))
    x[0, :2] = [0.0, 1.0]                          # (1 − x)·x = 0: clamped to 1e-12
    label = r.uniform(0, 1, (5, 6))
    label[1, :3] = [0.0, 1.0, 0.5]
    check("bce_loss_grad", {"input": x, "label": label, "out_grad": r.standard_normal((5, 6))}, {},
          dtype, rtol=1e-4 if dtype == "float32" else None)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_huber_loss_grad(delta, dtype):
    r = rng(1)
    res = r.standard_normal((4, 5)) * 2
    res[0, :3] = [delta, -delta, 0.0]              # the kinks at |r| = δ
    check("huber_loss_grad", {"residual": res, "out_grad": _with_specials(r.standard_normal((4, 5)))},
          {"delta": delta}, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_log_loss_grad(dtype):
    r = rng(2)
    inputs = {"input": r.uniform(0.05, 0.95, (6, 1)), "label": r.uniform(0, 1, (6, 1)),
              "out_grad": r.standard_normal((6, 1))}

    def f64(inputs, attrs):                   # Paddle registers log_loss_grad for float32 only
        x, y, g, e = inputs["input"], inputs["label"], inputs["out_grad"], np.float32(attrs["epsilon"])
        return {"input_grad": g * (-(y / (x + e)) + (1 - y) / (1 - x + e))}

    check("log_loss_grad", inputs, {"epsilon": 1e-4}, dtype, oracle=f64 if dtype == "float64" else None)


@pytest.mark.parametrize("dtype", FLOATS)
def test_label_smooth_grad(dtype):
    g = _with_specials(rng(3).standard_normal((3, 7)))
    check("label_smooth_grad", {"out_grad": g}, {"epsilon": 0.1}, dtype)


def test_label_smooth_grad_adjoint():
    """label_smooth(label) = (1 − ε)·label + ε·prior: linear in label."""
    import paddle
    r = rng(4)
    x, y = r.standard_normal((4, 5)), r.standard_normal((4, 5))
    fwd = paddle.nn.functional.label_smooth(to_paddle(x), epsilon=0.2).numpy() - \
        paddle.nn.functional.label_smooth(to_paddle(np.zeros_like(x)), epsilon=0.2).numpy()
    back = tvmgrad.run("label_smooth_grad", {"out_grad": y}, {"epsilon": 0.2})["label_grad"]
    np.testing.assert_allclose((fwd * y).sum(), (x * back).sum(), rtol=1e-12)


# ------------------------------------------------------------------------------------------
# kldiv


KL = [("none", False), ("mean", False), ("sum", False), ("batchmean", False), ("none", True),
      ("mean", True), ("batchmean", True)]


@pytest.mark.parametrize("reduction,log_target", KL)
def test_kldiv_loss_grad(reduction, log_target):
    r = rng(5)
    shape = (4, 3, 2)
    label = r.standard_normal(shape) if log_target else r.uniform(0.05, 1, shape)
    if not log_target:
        label.reshape(-1)[:3] = [0.0, -0.5, 2.0]   # label ≤ 0 contributes nothing
    g = r.standard_normal(shape) if reduction == "none" else np.asarray(1.3)
    inputs = {"x": r.standard_normal(shape), "label": label, "out_grad": g}
    for dtype in ("float64", "float32"):
        check("kldiv_loss_grad", inputs, {"reduction": reduction, "log_target": log_target}, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kldiv_loss_grad_half(dtype):
    r = rng(6)
    inputs = {"x": r.standard_normal((3, 4)), "label": r.uniform(0.05, 1, (3, 4)), "out_grad": np.asarray(2.0)}
    check("kldiv_loss_grad", inputs, {"reduction": "batchmean", "log_target": False}, dtype)


# ------------------------------------------------------------------------------------------
# sigmoid_cross_entropy_with_logits

SCE = [(False, -100, False), (True, -100, False), (False, -1, True), (True, -1, True),
       (True, 0, False)]


@pytest.mark.parametrize("normalize,ignore,pos_weight", SCE)
def test_sigmoid_cross_entropy_with_logits_grad(normalize, ignore, pos_weight):
    r = rng(7)
    shape = (4, 6)
    x = r.standard_normal(shape) * 3
    x[0, :3] = [0.0, 40.0, -40.0]
    label = r.uniform(0, 1, shape)
    label.reshape(-1)[5::4] = ignore
    inputs = {"x": x, "label": label, "out_grad": r.standard_normal(shape)}
    if pos_weight:
        inputs["pos_weight"] = r.uniform(0.5, 3, shape)
    attrs = {"normalize": normalize, "ignore_index": ignore}
    for dtype in FLOATS:
        check("sigmoid_cross_entropy_with_logits_grad", inputs, attrs, dtype)


def test_sigmoid_cross_entropy_all_ignored_divides_by_zero_like_paddle():
    inputs = {"x": np.array([0.5, -1.0]), "label": np.array([-100.0, -100.0]),
              "out_grad": np.array([1.0, 2.0])}
    out = check("sigmoid_cross_entropy_with_logits_grad", inputs,
                {"normalize": True, "ignore_index": -100}, "float64")
    assert np.isnan(out["x_grad"]).all()


# ------------------------------------------------------------------------------------------
# identity_loss / mean_all / reduce_as


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_identity_loss_grad(reduction, dtype):
    r = rng(8)
    x = r.standard_normal((3, 4))
    g = x * 0 + r.standard_normal((3, 4)) if reduction == 2 else np.asarray(1.75)
    check("identity_loss_grad", {"x": x, "out_grad": g}, {"reduction": reduction}, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(3, 4), (), (2, 0, 3), (7,)])
def test_mean_all_grad(shape, dtype):
    x = rng(9).standard_normal(shape)
    check("mean_all_grad", {"x": x, "out_grad": np.asarray(0.9)}, {}, dtype)


REDUCE_AS = [((3, 4), (1, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)), ((2, 3), (2, 3)),
             ((2, 3, 4), (1, 1, 1)), ((5,), ())]


@pytest.mark.parametrize("xs,ts", REDUCE_AS)
def test_reduce_as_grad(xs, ts):
    r = rng(10)
    inputs = {"x": r.standard_normal(xs), "target": r.standard_normal(ts), "out_grad": r.standard_normal(ts)}
    for dtype in ("float64", "float32", "bfloat16"):
        check("reduce_as_grad", inputs, {}, dtype)


def test_linear_reduction_adjoints():
    """<f(x), y> = <x, grad(y)> against Paddle's forward ops (float64)."""
    import paddle
    r = rng(11)
    x = r.standard_normal((3, 4))
    # mean_all
    y = r.standard_normal(())
    back = tvmgrad.run("mean_all_grad", {"x": x, "out_grad": np.asarray(y)})["x_grad"]
    np.testing.assert_allclose(paddle.mean(to_paddle(x)).numpy() * y, (x * back).sum(), rtol=1e-12)
    # reduce_as
    t = r.standard_normal((1, 4))
    yt = r.standard_normal((1, 4))
    fwd = paddle.reduce_as(to_paddle(x), to_paddle(t)).numpy()
    back = tvmgrad.run("reduce_as_grad", {"x": x, "target": t, "out_grad": yt})["x_grad"]
    np.testing.assert_allclose((fwd * yt).sum(), (x * back).sum(), rtol=1e-12)
    # identity_loss (sum and mean)
    for red, fn in ((0, np.sum), (1, np.mean)):
        back = tvmgrad.run("identity_loss_grad", {"x": x, "out_grad": np.asarray(y)}, {"reduction": red})["x_grad"]
        np.testing.assert_allclose(fn(x) * y, (x * back).sum(), rtol=1e-12)


def test_reduction_bad_input():
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match=r"identity_loss_grad: attribute 'reduction' must be 0"):
        tvmgrad.run("identity_loss_grad", {"x": x, "out_grad": np.ones(())}, {"reduction": 3})
    with pytest.raises(ValueError, match=r"identity_loss_grad: input 'out_grad' must hold one value"):
        tvmgrad.run("identity_loss_grad", {"x": x, "out_grad": np.ones(3)}, {"reduction": 0})
    with pytest.raises(ValueError, match=r"reduce_as_grad: 'target' of shape \[3\] cannot be broadcast"):
        tvmgrad.run("reduce_as_grad", {"x": x, "target": np.ones(3), "out_grad": np.ones(3)})
    with pytest.raises(ValueError, match=r"mean_all_grad: input 'out_grad' has shape \[2\]"):
        tvmgrad.run("mean_all_grad", {"x": x, "out_grad": np.ones(2)})
    with pytest.raises(ValueError, match=r"kldiv_loss_grad: attribute 'reduction' must be"):
        tvmgrad.run("kldiv_loss_grad", {"x": x, "label": x, "out_grad": np.ones(())}, {"reduction": "avg"})


# ------------------------------------------------------------------------------------------
# nll_loss


def _nll_inputs(shape, reduction, weight=True, ignore=-100, seed=0):
    r = rng(seed)
    n, c = shape[:2]
    lshape = (n,) + tuple(shape[2:])
    label = r.integers(0, c, lshape).astype("int64")
    if ignore != -100:
        label.reshape(-1)[::3] = ignore
    w = r.uniform(0.5, 2, c)
    valid = label != ignore
    tw = np.asarray((w[np.where(valid, label, 0)] * valid).sum() if weight else valid.sum() * 1.0)
    g = r.standard_normal(lshape) if reduction == "none" else np.asarray(1.4)
    inputs = {"input": r.standard_normal(shape), "label": label, "total_weight": tw, "out_grad": g}
    if weight:
        inputs["weight"] = w
    return inputs


NLL = [((5, 4), "mean", True, -100), ((5, 4), "sum", False, -100), ((5, 4), "none", True, 2),
       ((2, 3, 2, 2), "mean", True, 1), ((2, 3, 2, 2), "none", False, -100), ((4, 3), "mean", False, 0)]


@pytest.mark.parametrize("shape,reduction,weight,ignore", NLL)
def test_nll_loss_grad(shape, reduction, weight, ignore):
    inputs = _nll_inputs(shape, reduction, weight, ignore)
    attrs = {"ignore_index": ignore, "reduction": reduction}
    for dtype in ("float64", "float32"):
        check("nll_loss_grad", inputs, attrs, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nll_loss_grad_half(dtype):
    check("nll_loss_grad", _nll_inputs((5, 4), "mean"), {"ignore_index": -100, "reduction": "mean"}, dtype)


def test_nll_loss_grad_bad_input():
    inputs = _nll_inputs((5, 4), "mean")
    attrs = {"ignore_index": -100, "reduction": "mean"}
    bad = dict(inputs, label=np.array([0, 1, 4, 2, 3]))
    with pytest.raises(ValueError, match=r"nll_loss_grad: input 'label' holds 4, out of range"):
        tvmgrad.run("nll_loss_grad", bad, attrs)
    with pytest.raises(ValueError, match=r"nll_loss_grad: input 'label' has shape \[4\], expected \[5\]"):
        tvmgrad.run("nll_loss_grad", dict(inputs, label=inputs["label"][:4]), attrs)
    with pytest.raises(ValueError, match=r"nll_loss_grad: input 'label' has dtype int32, expected int64"):
        tvmgrad.run("nll_loss_grad", dict(inputs, label=inputs["label"].astype("int32")), attrs)
    with pytest.raises(ValueError, match=r"nll_loss_grad: input 'input' must have rank 2"):
        tvmgrad.run("nll_loss_grad", dict(inputs, input=np.ones((5, 4, 2))), attrs)
    with pytest.raises(ValueError, match=r"nll_loss_grad: attribute 'reduction' must be"):
        tvmgrad.run("nll_loss_grad", inputs, {**attrs, "reduction": "avg"})


# ------------------------------------------------------------------------------------------
# segment_pool


def _segment_inputs(pool, ids, feat=(3,), seed=0, ties=False):
    r = rng(seed)
    ids = np.asarray(ids, dtype="int64")
    x = r.standard_normal((len(ids),) + feat)
    if ties:
        x[1] = x[0]                                  # equal rows in segment 0: tied extrema
    s = int(ids.max()) + 1 if len(ids) else 1
    out = np.zeros((s,) + feat)
    counts = np.zeros((s, 1))
    for k in range(s):
        rows = x[ids == k]
        counts[k] = len(rows)
        if len(rows):
            out[k] = {"SUM": rows.sum(0), "MEAN": rows.mean(0), "MAX": rows.max(0), "MIN": rows.min(0)}[pool]
    inputs = {"x": x, "segment_ids": ids, "out": out, "out_grad": r.standard_normal(out.shape)}
    if pool == "MEAN":
        inputs["summed_ids"] = counts
    return inputs


@pytest.mark.parametrize("pool", ["SUM", "MEAN", "MAX", "MIN"])
def test_segment_pool_grad(pool):
    inputs = _segment_inputs(pool, [0, 0, 0, 1, 3, 3], feat=(2, 3), ties=True)
    for dtype in FLOATS:
        check("segment_pool_grad", inputs, {"pooltype": pool}, dtype)


def test_segment_pool_grad_mean_without_summed_ids_and_int32_ids():
    inputs = _segment_inputs("MEAN", [0, 1, 1, 1, 2, 4, 4])
    del inputs["summed_ids"]
    want = check("segment_pool_grad", dict(inputs, summed_ids=_segment_inputs("MEAN", [0, 1, 1, 1, 2, 4, 4])["summed_ids"]),
                 {"pooltype": "MEAN"}, "float64")
    got = tvmgrad.run("segment_pool_grad", inputs, {"pooltype": "MEAN"})
    np.testing.assert_allclose(got["x_grad"], want["x_grad"], rtol=1e-12)
    inputs32 = dict(inputs, segment_ids=inputs["segment_ids"].astype("int32"))
    check("segment_pool_grad", _segment_inputs("SUM", [0, 0, 2]) | {"segment_ids": np.array([0, 0, 2], "int32")},
          {"pooltype": "SUM"}, "float32")
    assert tvmgrad.run("segment_pool_grad", inputs32, {"pooltype": "MEAN"})["x_grad"].shape == inputs["x"].shape


def test_segment_pool_adjoint():
    """SUM and MEAN pooling are linear in x."""
    import paddle
    ids = np.array([0, 0, 1, 2, 2, 2], "int64")
    r = rng(12)
    x, y = r.standard_normal((6, 3)), r.standard_normal((3, 3))
    for pool in ("SUM", "MEAN"):
        fwd = paddle.geometric.segment_sum if pool == "SUM" else paddle.geometric.segment_mean
        out = fwd(to_paddle(x), to_paddle(ids)).numpy()
        inputs = _segment_inputs(pool, ids)
        inputs.update(x=x, out=out, out_grad=y)
        back = tvmgrad.run("segment_pool_grad", inputs, {"pooltype": pool})["x_grad"]
        np.testing.assert_allclose((out * y).sum(), (x * back).sum(), rtol=1e-12)


def test_segment_pool_bad_input():
    inputs = _segment_inputs("SUM", [0, 0, 1, 2])
    with pytest.raises(ValueError, match=r"segment_pool_grad: input 'segment_ids' must be sorted"):
        tvmgrad.run("segment_pool_grad", dict(inputs, segment_ids=np.array([0, 1, 0, 2])), {"pooltype": "SUM"})
    with pytest.raises(ValueError, match=r"segment_pool_grad: input 'segment_ids' holds 3, out of range"):
        tvmgrad.run("segment_pool_grad", dict(inputs, segment_ids=np.array([0, 0, 1, 3])), {"pooltype": "SUM"})
    with pytest.raises(ValueError, match=r"segment_pool_grad: attribute 'pooltype' must be"):
        tvmgrad.run("segment_pool_grad", inputs, {"pooltype": "PROD"})


# ------------------------------------------------------------------------------------------
# maxout


def _maxout_inputs(shape, groups, axis, seed=0):
    r = rng(seed)
    x = np.round(r.standard_normal(shape) * 2) / 2      # coarse values: ties within groups
    xs = np.moveaxis(x, axis, 1)
    n, c = xs.shape[:2]
    out = xs.reshape(n, c // groups, groups, *xs.shape[2:]).max(2)
    out = np.moveaxis(out, 1, axis)
    return {"x": x, "out": out, "out_grad": r.standard_normal(out.shape)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,groups,axis", [((2, 6, 3, 2), 2, 1), ((2, 3, 2, 6), 3, 3),
                                               ((1, 4, 2, 2), 4, 1), ((2, 2, 2, 4), 2, -1)])
def test_maxout_grad(shape, groups, axis, dtype):
    """Ties: only the first channel of a group that equals the max gets the grad (Paddle)."""
    inputs = _maxout_inputs(shape, groups, axis)
    check("maxout_grad", inputs, {"groups": groups, "axis": axis}, dtype)


def test_maxout_bad_input():
    inputs = _maxout_inputs((2, 6, 3, 2), 2, 1)
    with pytest.raises(ValueError, match=r"maxout_grad: attribute 'groups' = 4 must be positive and divide"):
        tvmgrad.run("maxout_grad", inputs, {"groups": 4, "axis": 1})
    with pytest.raises(ValueError, match=r"maxout_grad: attribute 'axis' must be 1"):
        tvmgrad.run("maxout_grad", inputs, {"groups": 2, "axis": 2})
    with pytest.raises(ValueError, match=r"maxout_grad: input 'out' has shape"):
        tvmgrad.run("maxout_grad", dict(inputs, out=inputs["x"]), {"groups": 2, "axis": 1})


def test_half_dtypes_follow_input():
    r = rng(13)
    out = tvmgrad.run("bce_loss_grad", {k: cast(v, "float16") for k, v in
                                        {"input": r.uniform(0.1, 0.9, 4), "label": r.uniform(0, 1, 4),
                                         "out_grad": r.standard_normal(4)}.items()})
    assert out["input_grad"].dtype == np.float16


def test_kldiv_loss_grad_special_labels():
    """NaN labels give NaN (Paddle's `label > 0 ? … : 0` keeps a NaN through its NaN product);
    ±inf labels and infinite cotangents as Paddle."""
    inputs = {"x": np.zeros(5), "label": np.array([np.nan, np.inf, -np.inf, 1.0, 0.0]),
              "out_grad": np.array([1.0, 2.0, 3.0, np.inf, np.nan])}
    for log_target in (False, True):
        check("kldiv_loss_grad", inputs, {"reduction": "none", "log_target": log_target}, "float64")
