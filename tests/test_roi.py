"""ROI grads (roi_align_grad, roi_pool_grad, psroi_pool_grad) against Paddle 3.3.1
(te_defs/roi.py).

Paddle's CPU build registers these for float32/float64; float16/bfloat16 are checked against
Paddle in float32 on the rounded inputs. Where Paddle crashes (boxes_num absent: it reads the
boxes' LoD, which a dygraph tensor lacks, and segfaults; counts that do not add up to the boxes:
out-of-bounds reads/writes) tvmgrad raises a ValueError (tests below); with N = 1 a missing
boxes_num means every box belongs to image 0, and the oracle is Paddle given boxes_num = [R].
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, c_ops, check, from_paddle, rng, to_paddle


def boxes(r, R, H, W, scale=1.0, small=False):
    """Boxes partly outside the map; at least a pixel wide and high after scaling unless
    ``small`` (then 0.05 to 1.2 pixels)."""
    x1 = r.uniform(-3, W / scale + 1, R)
    y1 = r.uniform(-3, H / scale + 1, R)
    span = (0.05 / scale, 1.2 / scale) if small else (1.0 / scale, max(H, W) / scale)
    return np.stack([x1, y1, x1 + r.uniform(*span, R), y1 + r.uniform(*span, R)], 1)


def align_case(ph=2, pw=3, scale=1.0, ratio=-1, aligned=False, *, N=2, C=3, H=9, W=7,
               counts=(3, 2), seed=0, small=False):
    r = rng(seed)
    R = int(sum(counts))
    inputs = {"x": r.standard_normal((N, C, H, W)), "boxes": boxes(r, R, H, W, scale, small),
              "boxes_num": np.array(counts, "int32"), "out_grad": r.standard_normal((R, C, ph, pw))}
    return inputs, dict(pooled_height=ph, pooled_width=pw, spatial_scale=scale,
                        sampling_ratio=ratio, aligned=aligned)


def pool_case(ph=2, pw=2, *, N=2, C=3, H=6, W=5, counts=(3, 2), seed=0):
    r = rng(seed)
    R = int(sum(counts))
    return {"x": r.standard_normal((N, C, H, W)), "boxes": boxes(r, R, H, W),
            "boxes_num": np.array(counts, "int32"),
            "arg_max": r.integers(-1, H * W, (R, C, ph, pw)).astype("int64"),
            "out_grad": r.standard_normal((R, C, ph, pw))}, \
        dict(pooled_height=ph, pooled_width=pw, spatial_scale=1.0)


def psroi_case(ph=2, pw=3, oc=2, scale=1.0, *, N=2, H=9, W=7, counts=(3, 2), seed=0):
    r = rng(seed)
    R = int(sum(counts))
    return {"x": r.standard_normal((N, oc * ph * pw, H, W)), "boxes": boxes(r, R, H, W, scale),
            "boxes_num": np.array(counts, "int32"), "out_grad": r.standard_normal((R, oc, ph, pw))}, \
        dict(pooled_height=ph, pooled_width=pw, output_channels=oc, spatial_scale=scale)


# ------------------------------------------------------------------------------------------
# roi_align

ALIGN = [dict(), dict(ph=3, pw=2, scale=0.5, ratio=2, aligned=True), dict(ph=1, pw=1, scale=0.25, ratio=0),
         dict(ph=4, pw=4, aligned=True), dict(ph=2, pw=2, ratio=3, small=True),
         dict(ph=3, pw=3, small=True), dict(counts=(0, 4)), dict(counts=(5, 0))]


@pytest.mark.parametrize("case", ALIGN)
@pytest.mark.sweep
def test_roi_align_float64(case):
    inputs, attrs = align_case(**case)
    check("roi_align_grad", inputs, attrs, "float64")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.sweep
def test_roi_align_dtypes(dtype):
    for case in (dict(), dict(ph=3, pw=2, scale=0.5, ratio=2, aligned=True)):
        inputs, attrs = align_case(**case, seed=1)
        check("roi_align_grad", inputs, attrs, dtype)


def test_roi_align_int64_counts_and_no_boxes():
    inputs, attrs = align_case()
    check("roi_align_grad", dict(inputs, boxes_num=inputs["boxes_num"].astype("int64")), attrs,
          "float64")
    inputs, attrs = align_case(counts=(0, 0))
    out = tvmgrad.run("roi_align_grad", inputs, attrs)["x_grad"]
    assert out.shape == inputs["x"].shape and not out.any()


def test_roi_align_without_boxes_num():
    """N = 1: every box belongs to image 0 (Paddle segfaults without boxes_num: oracle with
    boxes_num = [R])."""
    inputs, attrs = align_case(N=1, counts=(4,))
    ours = tvmgrad.run("roi_align_grad", dict(inputs, boxes_num=None), attrs)["x_grad"]
    want = c_ops("roi_align_grad", inputs, attrs)["x_grad"]
    np.testing.assert_allclose(ours, want, rtol=1e-10, atol=1e-12)
    inputs, attrs = align_case()
    with pytest.raises(ValueError, match="roi_align_grad: input 'boxes_num' is required when x "
                                         "holds 2 images"):
        tvmgrad.run("roi_align_grad", dict(inputs, boxes_num=None), attrs)


def test_roi_align_special_gradients():
    inputs, attrs = align_case()
    inputs["out_grad"][1, 2, 0, 1] = np.inf
    inputs["out_grad"][4, 0, 1, 2] = np.nan
    check("roi_align_grad", inputs, attrs, "float64")


def test_roi_align_adjoint_with_paddle_forward():
    """⟨roi_align(x), g⟩ = ⟨x, roi_align_grad(g)⟩ with Paddle's forward, also for boxes under a
    pixel with ``aligned``, where Paddle's grad clamps the box to a pixel and its forward does
    not (Paddle's grad is not the derivative of its forward there: checked to differ)."""
    import paddle
    for case in (dict(), dict(ph=3, pw=2, scale=0.5, ratio=2, aligned=True),
                 dict(ratio=2, aligned=True, small=True), dict(aligned=True, small=True),
                 dict(ratio=3, small=True)):
        inputs, attrs = align_case(**case, seed=2)
        y = paddle._C_ops.roi_align(to_paddle(inputs["x"]), to_paddle(inputs["boxes"]),
                                    to_paddle(inputs["boxes_num"]), attrs["pooled_height"],
                                    attrs["pooled_width"], attrs["spatial_scale"],
                                    attrs["sampling_ratio"], attrs["aligned"])
        lhs = float((from_paddle(y) * inputs["out_grad"]).sum())
        ours = tvmgrad.run("roi_align_grad", inputs, attrs)["x_grad"]
        rhs = float((ours * inputs["x"]).sum())
        assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs)), (case, lhs, rhs)
        if attrs["aligned"] and case.get("small"):
            theirs = c_ops("roi_align_grad", inputs, attrs)["x_grad"]
            assert not np.allclose(ours, theirs)


# ------------------------------------------------------------------------------------------
# roi_pool

@pytest.mark.parametrize("dtype", FLOATS)
def test_roi_pool(dtype):
    for case in (dict(), dict(ph=3, pw=1, counts=(0, 4)), dict(N=1, counts=(6,), H=2, W=2)):
        inputs, attrs = pool_case(**case)
        check("roi_pool_grad", inputs, attrs, dtype)


def test_roi_pool_repeated_targets_and_empty_bins():
    """Many bins recording the same pixel add up; −1 (an empty bin, what the forward records) is
    skipped, as Paddle's `arg_max >= 0` test does; an index below −1 is no index the forward
    records, and is refused."""
    inputs, attrs = pool_case()
    am = inputs["arg_max"]
    am[:] = 7
    am[0, 0] = -1
    am[1, 1, 0, 0] = -3
    with pytest.raises(ValueError, match=r"roi_pool_grad: input 'arg_max' holds -3 at \[1, 1, 0, 0\]"):
        tvmgrad.run("roi_pool_grad", inputs, attrs)
    am[1, 1, 0, 0] = -1
    check("roi_pool_grad", inputs, attrs, "float64")
    ours = tvmgrad.run("roi_pool_grad", inputs, attrs)["x_grad"]
    g = inputs["out_grad"].copy()
    g[0, 0] = 0
    g[1, 1, 0, 0] = 0
    np.testing.assert_allclose(ours[0, :, 1, 2], g[:3].sum((0, 2, 3)), rtol=1e-12)


def test_roi_pool_adjoint():
    """⟨x[batch(r), c, arg_max[r, c, i, j]], g⟩ = ⟨x, roi_pool_grad(g)⟩ (the forward's gather
    by the recorded index)."""
    inputs, attrs = pool_case(seed=4)
    am, x = inputs["arg_max"], inputs["x"]
    batch = np.repeat(np.arange(2), inputs["boxes_num"])
    plane = x.reshape(2, 3, -1)
    gathered = np.where(am >= 0, plane[batch[:, None, None, None], np.arange(3)[None, :, None, None],
                                       np.maximum(am, 0)], 0.0)
    lhs = float((gathered * inputs["out_grad"]).sum())
    rhs = float((tvmgrad.run("roi_pool_grad", inputs, attrs)["x_grad"] * x).sum())
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))


def test_roi_pool_bad_indices():
    inputs, attrs = pool_case()
    inputs["arg_max"][2, 1, 0, 1] = 30
    with pytest.raises(ValueError, match=r"roi_pool_grad: input 'arg_max' holds 30 at \[2, 1, 0, "
                                         r"1\], outside the 6x5 plane"):
        tvmgrad.run("roi_pool_grad", inputs, attrs)
    inputs, attrs = pool_case()
    with pytest.raises(TypeError, match="input 'arg_max' has dtype float64"):
        tvmgrad.run("roi_pool_grad", dict(inputs, arg_max=inputs["arg_max"].astype("float64")),
                    attrs)
    with pytest.raises(ValueError, match="input 'arg_max' must have shape \\[5, 3, 2, 2\\]"):
        tvmgrad.run("roi_pool_grad", dict(inputs, arg_max=inputs["arg_max"][:, :, :1]), attrs)


# ------------------------------------------------------------------------------------------
# psroi_pool

PSROI = [dict(), dict(ph=3, pw=3, oc=1, scale=0.5), dict(ph=1, pw=2, oc=3, scale=2.0),
         dict(counts=(0, 5))]


@pytest.mark.sweep
@pytest.mark.parametrize("case", PSROI)
@pytest.mark.parametrize("dtype", FLOATS)
def test_psroi_pool(case, dtype):
    inputs, attrs = psroi_case(**case)
    check("psroi_pool_grad", inputs, attrs, dtype)


def test_psroi_pool_rounding_and_empty_bins():
    """Box corners at .5 (C round: half away from zero), boxes outside the map (empty bins get
    nothing), degenerate boxes (height forced to 0.1)."""
    inputs, attrs = psroi_case(ph=2, pw=2, oc=1)
    inputs["boxes"] = np.array([[0.5, 1.5, 2.5, 3.5], [-1.5, -2.5, 4.5, 0.5], [20, 20, 30, 30],
                                [3.0, 3.0, 3.0, 3.0], [6.5, 8.5, 6.5, 8.5]])
    check("psroi_pool_grad", inputs, attrs, "float64")


def test_psroi_pool_adjoint_with_paddle_forward():
    import paddle
    inputs, attrs = psroi_case(seed=5)
    y = paddle._C_ops.psroi_pool(to_paddle(inputs["x"]), to_paddle(inputs["boxes"]),
                                 to_paddle(inputs["boxes_num"]), attrs["pooled_height"],
                                 attrs["pooled_width"], attrs["output_channels"],
                                 attrs["spatial_scale"])
    lhs = float((from_paddle(y) * inputs["out_grad"]).sum())
    rhs = float((tvmgrad.run("psroi_pool_grad", inputs, attrs)["x_grad"] * inputs["x"]).sum())
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


def test_psroi_pool_bad_input():
    inputs, attrs = psroi_case()
    with pytest.raises(ValueError, match="psroi_pool_grad: input 'x' has 12 channels; "
                                         "output_channels·pooled_height·pooled_width = 18"):
        tvmgrad.run("psroi_pool_grad", dict(inputs, out_grad=np.zeros((5, 3, 2, 3))),
                    dict(attrs, output_channels=3))
    with pytest.raises(ValueError, match="attribute 'output_channels' must be > 0"):
        tvmgrad.run("psroi_pool_grad", inputs, dict(attrs, output_channels=0))


# ------------------------------------------------------------------------------------------
# shared checks of boxes and counts

@pytest.mark.parametrize("op", ["roi_align_grad", "roi_pool_grad", "psroi_pool_grad"])
def test_bad_boxes_and_counts(op):
    make = {"roi_align_grad": align_case, "roi_pool_grad": pool_case,
            "psroi_pool_grad": psroi_case}[op]
    inputs, attrs = make()
    bad = [
        (dict(boxes_num=np.array([3, 3], "int32")), "input 'boxes_num' counts 6 ROIs in all but "
                                                    "'boxes' holds 5"),
        (dict(boxes_num=np.array([6, -1], "int32")), "input 'boxes_num' holds a negative count"),
        (dict(boxes_num=np.array([5], "int32")), "input 'boxes_num' holds 1 counts but x holds 2"),
        (dict(boxes=inputs["boxes"][:, :3]), "input 'boxes' must be \\[R, 4\\]"),
        (dict(out_grad=inputs["out_grad"][:4]), "input 'out_grad' must have shape"),
    ]
    b = inputs["boxes"].copy()
    b[1, 2] = np.nan
    bad.append((dict(boxes=b), "input 'boxes' holds non-finite coordinates"))
    for change, match in bad:
        with pytest.raises(ValueError, match=f"{op}: {match}"):
            tvmgrad.run(op, dict(inputs, **change), attrs)
    with pytest.raises(TypeError, match="input 'boxes_num' has dtype float64"):
        tvmgrad.run(op, dict(inputs, boxes_num=np.array([3.0, 2.0])), attrs)
    with pytest.raises(ValueError, match="attribute 'pooled_height' must be > 0"):
        tvmgrad.run(op, inputs, dict(attrs, pooled_height=0))
    with pytest.raises(ValueError, match="attribute 'spatial_scale' must be > 0"):
        tvmgrad.run(op, inputs, dict(attrs, spatial_scale=0.0))


def test_roi_align_refuses_runaway_sampling():
    """sampling_ratio <= 0 samples ceil(box/bin) per bin: a huge box would run ~forever."""
    inputs, attrs = align_case()
    inputs["boxes"][0] = [0, 0, 1e9, 1e9]
    with pytest.raises(ValueError, match="roi_align_grad: input 'boxes' holds a box of 1e\\+09 "
                                         "pixels"):
        tvmgrad.run("roi_align_grad", inputs, attrs)
    check("roi_align_grad", inputs, dict(attrs, sampling_ratio=2), "float64")
