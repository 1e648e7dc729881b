"""yolo_loss_grad (te_defs/detection.py).

Oracles: Paddle 3.3.1's CPU ``_C_ops.yolo_loss_grad`` fed with the objectness / match masks of
``samples_attention.yolo_forward`` (a float64 port of the CPU forward; Paddle's binding returns
only the loss, so the port's loss is checked against Paddle's first), and end to end
``paddle.grad`` through ``paddle.vision.ops.yolo_loss`` (which uses Paddle's own masks).

Paddle difference (documented in te_defs/detection.py): when two matched gt boxes share the same
anchor of the same cell Paddle *assigns* their gradient entries (the last box wins) although its
forward loss adds both terms; the grad of that loss is the sum, computed here and checked against
a numpy reference (test_yolo_loss_grad_shared_cell). Half types: Paddle's CPU build registers
float32/float64; ``check`` runs Paddle in float32 on the rounded inputs.
"""

import copy

import numpy as np
import pytest

import tvmgrad
from harness import c_ops, cast, check
from tvmgrad.examples.attention import YOLO_ATTRS, sigmoid, yolo_forward, yolo_inputs

OP = "yolo_loss_grad"


def _rng(seed=0):
    return np.random.default_rng(seed)


def _paddle_loss(inp, attrs, dtype="float64"):
    import paddle

    P = paddle.to_tensor
    score = inp.get("gt_score")
    return paddle._C_ops.yolo_loss(
        P(inp["x"].astype(dtype)), P(inp["gt_box"].astype(dtype)), P(inp["gt_label"]),
        None if score is None else P(score.astype(dtype)), attrs["anchors"], attrs["anchor_mask"],
        attrs["class_num"], attrs["ignore_thresh"], attrs["downsample_ratio"],
        attrs["use_label_smooth"], attrs["scale_x_y"]).numpy()


def _case(seed, attrs=YOLO_ATTRS, **kw):
    inp = yolo_inputs(_rng(seed), attrs=attrs, **kw)
    ref, _, _ = yolo_forward(inp["x"], inp["gt_box"], inp["gt_label"], inp.get("gt_score"), **attrs)
    np.testing.assert_allclose(_paddle_loss(inp, attrs), ref, rtol=1e-10, atol=1e-10)
    return inp


def _clean_case(seed, attrs=YOLO_ATTRS, **kw):
    """The first case from ``seed`` on whose matched boxes all have their own anchor cell (where
    Paddle's assignment and the exact gradient agree) and some box is matched."""
    for s in range(seed, seed + 50):
        inp = _case(s, attrs, **kw)
        if _no_shared_cells(inp) and (inp["gt_match_mask"] >= 0).any():
            return inp
    raise AssertionError("no clean yolo case")


def _attrs(**kw):
    a = copy.deepcopy(YOLO_ATTRS)
    a.update(kw)
    return a


def _no_shared_cells(inp):
    m, box = inp["gt_match_mask"], inp["gt_box"]
    H, W = inp["x"].shape[2:]
    for n in range(m.shape[0]):
        keys = [(m[n, t], int(box[n, t, 0] * W), int(box[n, t, 1] * H))
                for t in range(m.shape[1]) if m[n, t] >= 0]
        if len(keys) != len(set(keys)):
            return False
    return True


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_yolo_loss_grad_vs_paddle(dtype):
    attrs = _attrs(ignore_thresh=0.05)
    inp = _clean_case(0, attrs)
    assert (inp["objectness_mask"] < -0.5).any()            # ignored cells present
    out = check(OP, inp, attrs, dtype, outputs=["x_grad"])
    assert out["gt_box_grad"] is None and out["gt_label_grad"] is None


@pytest.mark.parametrize("kw", [
    dict(use_label_smooth=False),
    dict(scale_x_y=1.2, ignore_thresh=0.3),
    dict(anchor_mask=[0, 2], class_num=1),
    dict(anchors=[10, 13, 16, 30], anchor_mask=[1], class_num=3, downsample_ratio=8),
])
def test_yolo_loss_grad_attrs(kw):
    attrs = _attrs(**kw)
    check(OP, _clean_case(1, attrs), attrs, "float64", outputs=["x_grad"])


def test_yolo_loss_grad_without_gt_score():
    inp = _clean_case(2, score=False)
    assert "gt_score" not in inp
    check(OP, inp, dict(YOLO_ATTRS), "float64", outputs=["x_grad"])
    check(OP, {**inp, "gt_score": None}, dict(YOLO_ATTRS), "float32", outputs=["x_grad"])


def test_yolo_loss_grad_odd_grids():
    for seed, (n, h, b) in enumerate(((2, 1, 3), (3, 4, 2), (1, 7, 5))):
        inp = _clean_case(10 + 50 * seed, n=n, h=h, w=h, b=b)
        check(OP, inp, dict(YOLO_ATTRS), "float64", outputs=["x_grad"])


def test_yolo_loss_grad_int64_labels():
    inp = _case(3)
    inp["gt_label"] = inp["gt_label"].astype(np.int64)
    want = tvmgrad.run(OP, {**inp, "gt_label": inp["gt_label"].astype(np.int32)},
                       dict(YOLO_ATTRS))["x_grad"]
    np.testing.assert_array_equal(tvmgrad.run(OP, inp, dict(YOLO_ATTRS))["x_grad"], want)


def test_yolo_loss_grad_end_to_end():
    """x's gradient of paddle.vision.ops.yolo_loss (Paddle's own masks) with a random cotangent."""
    import paddle
    from paddle.vision.ops import yolo_loss

    inp = _clean_case(4)
    a = YOLO_ATTRS
    x = paddle.to_tensor(inp["x"], stop_gradient=False)
    loss = yolo_loss(x, paddle.to_tensor(inp["gt_box"]), paddle.to_tensor(inp["gt_label"]),
                     a["anchors"], a["anchor_mask"], a["class_num"], a["ignore_thresh"],
                     a["downsample_ratio"], gt_score=paddle.to_tensor(inp["gt_score"]),
                     use_label_smooth=a["use_label_smooth"], scale_x_y=a["scale_x_y"])
    want = paddle.grad(loss, x, paddle.to_tensor(inp["loss_grad"]))[0].numpy()
    got = tvmgrad.run(OP, inp, dict(a))["x_grad"]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _numpy_grad(inp, attrs):
    """x_grad from the module docstring's formulas, summing boxes that share an anchor cell."""
    x, box, lab, match, obj, lg = (inp[k] for k in ("x", "gt_box", "gt_label", "gt_match_mask",
                                                    "objectness_mask", "loss_grad"))
    score = inp.get("gt_score")
    N, _, H, W = x.shape
    C, M = attrs["class_num"], len(attrs["anchor_mask"])
    xr = x.reshape(N, M, 5 + C, H, W)
    g = np.zeros_like(xr)
    s = sigmoid(xr)
    o = obj
    g[:, :, 4] = np.where(o > 1e-5, (s[:, :, 4] - 1) * o, np.where(o > -0.5, s[:, :, 4], 0.0))
    neg = min(1 / C, 1 / 40) if attrs["use_label_smooth"] else 0.0
    input_size = attrs["downsample_ratio"] * H
    for n in range(N):
        for t in range(box.shape[1]):
            a = match[n, t]
            if a < 0:
                continue
            an = attrs["anchor_mask"][a]
            bx, by, bw, bh = box[n, t]
            gi, gj = int(bx * W), int(by * H)
            sc = 1.0 if score is None else score[n, t]
            scale = (2 - bw * bh) * sc
            xv, sv = xr[n, a, :, gj, gi], s[n, a, :, gj, gi]
            tw = np.log(bw * input_size / attrs["anchors"][2 * an])
            th = np.log(bh * input_size / attrs["anchors"][2 * an + 1])
            g[n, a, 0, gj, gi] += (sv[0] - (bx * H - gi)) * scale
            g[n, a, 1, gj, gi] += (sv[1] - (by * H - gj)) * scale
            g[n, a, 2, gj, gi] += (1.0 if xv[2] > tw else -1.0) * scale
            g[n, a, 3, gj, gi] += (1.0 if xv[3] > th else -1.0) * scale
            for c in range(C):
                target = (1 - neg) if c == lab[n, t] else neg
                g[n, a, 5 + c, gj, gi] += (sv[5 + c] - target) * sc
    return (g * lg[:, None, None, None, None]).reshape(x.shape)


def test_yolo_loss_grad_shared_cell():
    """Two gt boxes in the same cell matching the same anchor: the grad of Paddle's loss (which
    adds both) is the sum of both boxes' terms; Paddle's kernel keeps only the last box."""
    attrs = dict(YOLO_ATTRS)
    inp = yolo_inputs(_rng(5), n=1, h=4, w=4, b=3, attrs=attrs)
    inp["gt_box"][0, 1] = inp["gt_box"][0, 0] * [1.0, 1.0, 1.02, 0.98]
    inp["gt_box"][0, 1, :2] = inp["gt_box"][0, 0, :2] + 0.01
    _, obj, match = yolo_forward(inp["x"], inp["gt_box"], inp["gt_label"], inp["gt_score"], **attrs)
    inp["objectness_mask"], inp["gt_match_mask"] = obj, match
    assert not _no_shared_cells(inp)
    got = tvmgrad.run(OP, inp, attrs)["x_grad"]
    np.testing.assert_allclose(got, _numpy_grad(inp, attrs), rtol=1e-10, atol=1e-12)


def test_yolo_loss_grad_shared_cell_is_the_derivative_of_paddles_own_loss():
    """Where Paddle's CPU grad kernel and tvmgrad differ (use_label_smooth and gt_score on, the
    default example, two gt boxes matched to one anchor cell: errors ~0.4 on that cell's box and
    class channels), central differences of Paddle's own forward loss agree with tvmgrad: its
    kernel assigns each box's entries (the last box wins) while the forward adds both boxes'
    terms. Everything else equals Paddle's kernel."""
    import paddle

    a = dict(YOLO_ATTRS)
    assert a["use_label_smooth"]
    inp = yolo_inputs(_rng(0))
    assert "gt_score" in inp and not _no_shared_cells(inp)
    got = tvmgrad.run(OP, inp, a)["x_grad"]
    want = c_ops(OP, inp, a)["x_grad"]
    diff = np.abs(got - want) > 1e-9
    assert diff.any() and np.abs(got - want).max() > 0.3
    P = paddle.to_tensor

    def loss(x):
        return paddle._C_ops.yolo_loss(P(x), P(inp["gt_box"]), P(inp["gt_label"]), P(inp["gt_score"]),
                                       a["anchors"], a["anchor_mask"], a["class_num"], a["ignore_thresh"],
                                       a["downsample_ratio"], a["use_label_smooth"], a["scale_x_y"]).numpy()

    x, lg, h = inp["x"], inp["loss_grad"], 1e-6
    for idx in [tuple(i) for i in np.argwhere(diff)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num = float((loss(xp) - loss(xm)) @ lg) / (2 * h)
        assert abs(num - got[idx]) < 1e-6 * (1 + abs(num)), (idx, num, got[idx], want[idx])
        assert abs(num - want[idx]) > 1e-3
    np.testing.assert_allclose(got[~diff], want[~diff], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("smooth", [True, False])
def test_yolo_loss_grad_label_smooth_and_gt_score_vs_paddle(smooth, dtype):
    """use_label_smooth with and without gt_score, several grids and box counts: equal to
    Paddle's CPU kernel on every channel wherever no two matched boxes share an anchor cell."""
    attrs = _attrs(use_label_smooth=smooth)
    for seed, kw in ((20, {}), (80, dict(h=4, w=4, b=6)), (140, dict(n=3, b=5)), (200, dict(score=False))):
        inp = _clean_case(seed, attrs, **kw)
        check(OP, inp, attrs, dtype, outputs=["x_grad"])


def test_yolo_loss_grad_matched_labels_in_range():
    inp = _clean_case(0)
    lab = inp["gt_label"].copy()
    n, t = np.argwhere(inp["gt_match_mask"] >= 0)[0]
    lab[n, t] = YOLO_ATTRS["class_num"]
    with pytest.raises(ValueError, match=rf"yolo_loss_grad: input 'gt_label' holds 4 at \[{n}, {t}\] \(a "
                                         r"matched box\), out of range"):
        tvmgrad.run(OP, {**inp, "gt_label": lab}, dict(YOLO_ATTRS))
    unmatched = np.argwhere(inp["gt_match_mask"] < 0)
    if unmatched.size:                       # an unmatched box's label is never read
        lab = inp["gt_label"].copy()
        lab[tuple(unmatched[0])] = -5
        tvmgrad.run(OP, {**inp, "gt_label": lab}, dict(YOLO_ATTRS))


def test_yolo_loss_grad_numpy_reference_agrees():
    attrs = _attrs(use_label_smooth=False)
    inp = _case(6, attrs)
    got = tvmgrad.run(OP, inp, attrs)["x_grad"]
    np.testing.assert_allclose(got, _numpy_grad(inp, attrs), rtol=1e-10, atol=1e-12)


def test_yolo_loss_grad_ties():
    """tw/th kinks: x == target gives sign -1 (Paddle's sign(0) = -1 convention)."""
    attrs = dict(YOLO_ATTRS)
    inp = _case(7, attrs)
    n, t = np.argwhere(inp["gt_match_mask"] >= 0)[0]
    a = inp["gt_match_mask"][n, t]
    H, W = inp["x"].shape[2:]
    gi, gj = int(inp["gt_box"][n, t, 0] * W), int(inp["gt_box"][n, t, 1] * H)
    an = attrs["anchor_mask"][a]
    E = 5 + attrs["class_num"]
    inp["x"][n, a * E + 2, gj, gi] = np.log(inp["gt_box"][n, t, 2] * 32 * H / attrs["anchors"][2 * an])
    got = tvmgrad.run(OP, inp, attrs)["x_grad"]
    np.testing.assert_allclose(got, _numpy_grad(inp, attrs), rtol=1e-10, atol=1e-12)
    if _no_shared_cells(inp):
        check(OP, inp, attrs, "float64", outputs=["x_grad"])


def test_yolo_loss_grad_unmatched_and_empty():
    inp = _case(8)
    inp["gt_match_mask"][:] = -1
    got = tvmgrad.run(OP, inp, dict(YOLO_ATTRS))["x_grad"]
    E = 5 + YOLO_ATTRS["class_num"]
    keep = np.zeros(got.shape[1], bool)
    keep[4::E] = True
    assert (got[:, ~keep] == 0).all() and (got[:, keep] != 0).any()
    check(OP, inp, dict(YOLO_ATTRS), "float64", outputs=["x_grad"])
    empty = {**inp, "gt_box": np.zeros((2, 0, 4)), "gt_label": np.zeros((2, 0), np.int32),
             "gt_score": np.zeros((2, 0)), "gt_match_mask": np.zeros((2, 0), np.int32)}
    np.testing.assert_allclose(tvmgrad.run(OP, empty, dict(YOLO_ATTRS))["x_grad"], got,
                               rtol=1e-12)


def test_yolo_loss_grad_bad_input():
    inp, attrs = _clean_case(0), dict(YOLO_ATTRS)

    def run(**kw):
        a = {**attrs, **{k: v for k, v in kw.items() if k in attrs}}
        return tvmgrad.run(OP, {**inp, **{k: v for k, v in kw.items() if k not in attrs}}, a)

    with pytest.raises(ValueError, match="yolo_loss_grad.*'x'"):
        run(x=inp["x"][:, :-1])
    with pytest.raises(ValueError, match="yolo_loss_grad.*'x'.*square"):
        run(x=inp["x"][..., :-1], objectness_mask=inp["objectness_mask"][..., :-1])
    with pytest.raises(ValueError, match="yolo_loss_grad.*class_num"):
        run(class_num=0)
    with pytest.raises(ValueError, match="yolo_loss_grad.*anchor_mask"):
        run(anchor_mask=[1, 3, 4, 6])
    with pytest.raises(ValueError, match="yolo_loss_grad.*anchors"):
        run(anchors=[10, 13, 16])
    with pytest.raises(ValueError, match="yolo_loss_grad.*gt_box"):
        run(gt_box=inp["gt_box"][..., :3])
    with pytest.raises(ValueError, match="yolo_loss_grad.*objectness_mask"):
        run(objectness_mask=inp["objectness_mask"][:, :, :-1])
    with pytest.raises(ValueError, match="yolo_loss_grad.*loss_grad"):
        run(loss_grad=np.ones(3))
    with pytest.raises(ValueError, match="yolo_loss_grad.*gt_label"):
        run(gt_label=inp["gt_label"][:, :-1])
    bad = inp["gt_match_mask"].copy()
    bad[0, 0] = 4
    with pytest.raises(ValueError, match="yolo_loss_grad.*gt_match_mask"):
        run(gt_match_mask=bad)
    n, t = np.argwhere(inp["gt_match_mask"] >= 0)[0]
    box = inp["gt_box"].copy()
    box[n, t, 0] = 1.3                                      # matched box outside the grid
    with pytest.raises(ValueError, match="yolo_loss_grad.*gt_box.*outside"):
        run(gt_box=box)
    with pytest.raises((ValueError, TypeError), match="yolo_loss_grad.*gt_label"):
        run(gt_label=inp["gt_label"].astype(np.float64))
