"""Interpolation, grid_sample and affine_grid grads against Paddle 3.3.1 (te_defs/interp.py).

float64 comparisons are at 1e-10: they check Paddle's mixed float/double coordinate arithmetic
(float32 ratios and weights, double or float source indices depending on op and dim, round-half-
even in grid_sample's nearest mode) exactly, not just the maths. Paddle's CPU build registers
these grads for float32/float64: float16/bfloat16 are checked against Paddle in float32 on the
rounded inputs (harness.check).

Where Paddle crashes or is wrong (tests below say which): a scale that contradicts the output size
(Paddle writes out of bounds), "NCDHW" passed to the C op (Paddle reads it as channel-last), a NaN
grid coordinate (Paddle writes out of bounds), affine_grid with a size-1 dim and align_corners
(Paddle's base grid is NaN).
"""

import itertools

import numpy as np
import pytest

import tvmgrad
from harness import (FLOATS, assert_close, c_ops, check, from_paddle, in_child_process, rng,
                     to_paddle)

OPS = {"linear": "linear_interp_grad", "bilinear": "bilinear_interp_grad",
       "trilinear": "trilinear_interp_grad", "bicubic": "bicubic_interp_grad",
       "nearest": "nearest_interp_grad"}
NAMES = {1: ("out_w",), 2: ("out_h", "out_w"), 3: ("out_d", "out_h", "out_w")}


def interp_case(method, ins, outs, *, last=False, N=2, C=3, seed=0, **attrs):
    """(op, inputs, attrs) of an interpolation grad from spatial sizes."""
    r = rng(seed)
    S = len(ins)
    xs = (N, *ins, C) if last else (N, C, *ins)
    gs = (N, *outs, C) if last else (N, C, *outs)
    a = dict(zip(NAMES[S], outs), interp_method=method, data_format="NHWC" if last else "NCHW")
    a.update(attrs)
    return OPS[method], {"x": r.standard_normal(xs), "output_grad": r.standard_normal(gs)}, a


def scale_f32_oracle(op):
    """Paddle reads scale_tensor as float32 only (the harness casts it with the data)."""
    def oracle(inputs, attrs):
        ins = dict(inputs)
        if ins.get("scale_tensor") is not None:
            ins["scale_tensor"] = np.asarray(ins["scale_tensor"], np.float32)
        return c_ops(op, ins, attrs)
    return oracle


# ------------------------------------------------------------------------------------------
# every scheme, layout and alignment, float64 (exact coordinate arithmetic)

SWEEP = [
    # method, in sizes, out sizes
    ("linear", (5,), (13,)), ("linear", (13,), (4,)), ("linear", (1,), (8,)), ("linear", (7,), (1,)),
    ("bilinear", (5, 7), (9, 4)), ("bilinear", (2, 3), (50, 83)), ("bilinear", (1, 6), (5, 1)),
    ("bilinear", (33, 12), (12, 33)),
    ("trilinear", (3, 4, 5), (5, 3, 9)), ("trilinear", (4, 3, 3), (1, 5, 5)),
    ("bicubic", (5, 7), (9, 4)), ("bicubic", (1, 2), (6, 7)), ("bicubic", (12, 9), (5, 20)),
    ("nearest", (5, 7), (9, 4)), ("nearest", (2, 3), (3, 83)), ("nearest", (6, 6), (1, 11)),
    ("nearest", (2, 3, 4), (5, 3, 83)),
]


@pytest.mark.parametrize("method,ins,outs", SWEEP)
@pytest.mark.parametrize("align", [(True, 1), (False, 0), pytest.param((False, 1), marks=pytest.mark.slow)])
@pytest.mark.sweep
def test_interp_float64(method, ins, outs, align):
    ac, am = align
    for last in (False, True):
        op, inputs, attrs = interp_case(method, ins, outs, last=last, align_corners=ac,
                                        align_mode=am)
        check(op, inputs, attrs, "float64")


@pytest.mark.parametrize("method", list(OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.sweep
def test_interp_dtypes(method, dtype):
    S = {"linear": 1, "trilinear": 3}.get(method, 2)
    ins, outs = [(6,), (4, 5), (3, 4, 5)][S - 1], [(11,), (9, 3), (5, 7, 2)][S - 1]
    for last, (ac, am) in [(False, (False, 0)), (True, (True, 1))]:
        op, inputs, attrs = interp_case(method, ins, outs, last=last, align_corners=ac,
                                        align_mode=am)
        check(op, inputs, attrs, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_interp_random_sweep(seed):
    r = rng(100 + seed)
    for _ in range(40):
        method = str(r.choice(list(OPS) + ["nearest"]))
        S = {"linear": 1, "trilinear": 3}.get(method, int(r.integers(2, 4)) if method == "nearest" else 2)
        hi = 12 if S == 3 else 60
        ins = tuple(int(v) for v in r.integers(1, hi, S))
        outs = tuple(int(v) for v in r.integers(1, 2 * hi, S))
        if ins == outs:
            continue
        op, inputs, attrs = interp_case(method, ins, outs, last=bool(r.integers(2)),
                                        align_corners=bool(r.integers(2)),
                                        align_mode=int(r.integers(2)), seed=seed)
        for dtype in ("float64", "float32"):
            check(op, inputs, attrs, dtype)


# ------------------------------------------------------------------------------------------
# output size: size_tensor > out_size > scale_tensor > scale > out_d/h/w

def test_size_tensor_beats_out_size_and_attrs():
    _, inputs, attrs = interp_case("bilinear", (5, 7), (8, 11), align_corners=False, align_mode=0)
    inputs["size_tensor"] = [np.array([8], "int32"), np.array([11], "int64")]
    inputs["out_size"] = np.array([3, 3], "int32")        # ignored: size_tensor wins
    attrs.update(out_h=1, out_w=1)                         # ignored
    ours = check("bilinear_interp_grad", inputs, attrs, "float64")
    plain = tvmgrad.run("bilinear_interp_grad", {"x": inputs["x"], "output_grad":
                        inputs["output_grad"]}, dict(attrs, out_h=8, out_w=11))
    np.testing.assert_array_equal(ours["x_grad"], plain["x_grad"])


def test_scale_sets_ratio_when_out_size_overrides():
    # scale 1.6 gives 8x11 from 5x7 (int(5·1.6)=8, int(7·1.6)=11); the ratio is 1/1.6, not in/out
    _, inputs, attrs = interp_case("bilinear", (5, 7), (8, 11), align_corners=False, align_mode=0)
    inputs["out_size"] = np.array([8, 11], "int32")
    with_scale = check("bilinear_interp_grad", inputs, dict(attrs, scale=[1.6, 1.6]), "float64")
    without = check("bilinear_interp_grad", inputs, attrs, "float64")
    assert not np.allclose(with_scale["x_grad"], without["x_grad"])


def test_scale_tensor_beats_scale_attr():
    _, inputs, attrs = interp_case("bilinear", (5, 7), (10, 14), align_corners=False, align_mode=0)
    inputs["scale_tensor"] = np.array([2.0], "float32")
    attrs.update(scale=[1.5, 1.5], out_h=0, out_w=0)
    for dtype in ("float64", "float32"):
        check("bilinear_interp_grad", inputs, attrs, dtype, oracle=scale_f32_oracle("bilinear_interp_grad"))
    # two values: (h, w); a float64 tensor is accepted (Paddle insists on float32)
    _, inputs, attrs = interp_case("bicubic", (5, 7), (7, 8), align_corners=False)
    inputs["scale_tensor"] = np.array([1.5, 1.2])
    check("bicubic_interp_grad", inputs, dict(attrs, out_h=0, out_w=0), "float64",
          oracle=scale_f32_oracle("bicubic_interp_grad"))


def test_scale_attr_rules():
    # out = int(float(in)·float(scale)): 10·0.7f rounds to 7 in float (6 in double)
    op, inputs, attrs = interp_case("bilinear", (10, 10), (7, 7), align_corners=False, align_mode=0)
    check(op, inputs, dict(attrs, out_h=0, out_w=0, scale=[0.7, 0.7]), "float64")
    # 2-D ignores a single scale value (it uses out_h/out_w); 1-D uses it
    check(op, inputs, dict(attrs, scale=[3.0]), "float64")
    op, inputs, attrs = interp_case("linear", (6,), (9,), align_corners=False, align_mode=0)
    check(op, inputs, dict(attrs, out_w=0, scale=[1.5]), "float64")
    op, inputs, attrs = interp_case("trilinear", (2, 3, 4), (3, 4, 6), align_corners=False,
                                    align_mode=1)
    check(op, inputs, dict(attrs, out_d=0, out_h=0, out_w=0, scale=[1.5, 1.5, 1.5]), "float64")


def test_same_size_is_a_copy():
    # in == out: Paddle copies output_grad whatever the ratio would be (here 1/1.05)
    op, inputs, attrs = interp_case("bicubic", (10, 10), (10, 10), align_corners=False)
    ours = check(op, inputs, dict(attrs, out_h=0, out_w=0, scale=[1.05, 1.05]), "float64")
    np.testing.assert_array_equal(ours["x_grad"], inputs["output_grad"])
    view = tvmgrad.run(op, inputs, dict(attrs, scale=[1.05, 1.05]), alias=True)["x_grad"]
    assert np.shares_memory(view, inputs["output_grad"])


def test_empty_tensors():
    for ins, outs, N in [((4, 5), (0, 3), 2), ((4, 5), (6, 7), 0), ((0, 5), (3, 7), 2)]:
        op, inputs, attrs = interp_case("bilinear", ins, outs, N=N, align_corners=False,
                                        align_mode=0)
        out = tvmgrad.run(op, inputs, attrs)["x_grad"]
        assert out.shape == inputs["x"].shape and not out.any()


def test_layout_names():
    """NCW/NCDHW are channel-first and NWC/NDHWC channel-last, for their ranks (Paddle's Python
    API maps them to NCHW/NHWC; its C op rejects NCW/NWC and reads NCDHW as channel-last, which
    contradicts the name: the oracle here is Paddle with NCHW/NHWC)."""
    for method, ins, outs, first, lastn in [("linear", (5,), (8,), "NCW", "NWC"),
                                            ("trilinear", (2, 3, 4), (3, 5, 2), "NCDHW", "NDHWC")]:
        op, inputs, attrs = interp_case(method, ins, outs, align_corners=False, align_mode=0)
        ours = tvmgrad.run(op, inputs, dict(attrs, data_format=first))
        want = c_ops(op, inputs, dict(attrs, data_format="NCHW"))
        assert_close(op, ours["x_grad"], want["x_grad"], "float64")
        op, inputs, attrs = interp_case(method, ins, outs, last=True, align_corners=False,
                                        align_mode=0)
        ours = tvmgrad.run(op, inputs, dict(attrs, data_format=lastn))
        want = c_ops(op, inputs, dict(attrs, data_format="NHWC"))
        assert_close(op, ours["x_grad"], want["x_grad"], "float64")


def test_interp_method_attribute_decides():
    # Paddle dispatches on interp_method, not on the op: nearest_interp_grad with "bilinear"
    # (the YAML default) computes the bilinear grad
    _, inputs, attrs = interp_case("bilinear", (4, 5), (7, 3), align_corners=True)
    a = tvmgrad.run("nearest_interp_grad", inputs, attrs)["x_grad"]
    b = tvmgrad.run("bilinear_interp_grad", inputs, attrs)["x_grad"]
    np.testing.assert_array_equal(a, b)
    check("nearest_interp_grad", inputs, attrs, "float64")


def test_special_values_reach_the_same_inputs():
    for method in ("bilinear", "bicubic", "nearest"):
        op, inputs, attrs = interp_case(method, (4, 5), (9, 7), align_corners=False, align_mode=0)
        g = inputs["output_grad"]
        g[0, 0, 3, 2] = np.inf
        g[1, 2, 0, 0] = np.nan
        g[1, 1, 8, 6] = -np.inf
        check(op, inputs, attrs, "float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bilinear_rows_special_values(dtype):
    """The CPU's two passes per input row (channel-first bilinear): 2x upsampling, ratios that
    are not 1/2, and align_corners, whose last taps merge a zero weight into a nonzero one (inf·0
    is NaN in Paddle); infinite and NaN gradients on edges, corners and inside."""
    for ins, outs, ac, am in [((4, 6), (8, 12), False, 0), ((5, 7), (12, 9), False, 0),
                              ((4, 6), (8, 12), True, 1)]:
        op, inputs, attrs = interp_case("bilinear", ins, outs, align_corners=ac, align_mode=am)
        g = inputs["output_grad"]
        g[0, 0, 0, 0] = np.inf
        g[0, 1, 0, 5] = -np.inf
        g[1, 0, outs[0] - 1, outs[1] - 1] = np.inf
        g[1, 1, 3, 0] = np.nan
        g[1, 2, 2, 4] = np.inf
        check(op, inputs, attrs, dtype)


def test_adjoint_with_paddle_forward():
    """⟨interp(x), g⟩ = ⟨x, interp_grad(g)⟩ with Paddle's forward op."""
    import paddle
    for method, ins, outs, ac, am in [("bilinear", (5, 7), (9, 4), False, 0),
                                      ("bilinear", (5, 7), (9, 4), True, 1),
                                      ("bicubic", (6, 5), (8, 9), False, 0),
                                      ("nearest", (5, 7), (9, 4), False, 1),
                                      ("linear", (7,), (12,), False, 0),
                                      ("trilinear", (3, 4, 2), (5, 3, 4), True, 1)]:
        op, inputs, attrs = interp_case(method, ins, outs, align_corners=ac, align_mode=am)
        fwd = getattr(paddle._C_ops, op[: -len("_grad")])
        y = fwd(to_paddle(inputs["x"]), None, None, None, "NCHW", attrs.get("out_d", 0),
                attrs.get("out_h", 0), attrs.get("out_w", 0), [], method, ac, am)
        lhs = float((from_paddle(y) * inputs["output_grad"]).sum())
        rhs = float((tvmgrad.run(op, inputs, attrs)["x_grad"] * inputs["x"]).sum())
        # Paddle's forward kernels keep ratios and some weights in float32 even for float64 data,
        # its grad kernels (which ours match to float64 precision) not always the same way
        rtol = 1e-10 if method in ("bilinear", "nearest", "trilinear") else 1e-6
        assert abs(lhs - rhs) <= rtol * max(1.0, abs(lhs)), (op, lhs, rhs)


# ------------------------------------------------------------------------------------------
# bad input

@pytest.mark.parametrize("change,match", [
    (dict(data_format="NCHWX"), "bilinear_interp_grad: attribute 'data_format'"),
    (dict(data_format="NCW"), "attribute 'data_format' 'NCW' does not fit a 4-D"),
    (dict(interp_method="trilinear"), "attribute 'interp_method' 'trilinear' needs a 5-D"),
    (dict(interp_method="area"), "attribute 'interp_method' is 'area'"),
    (dict(out_h=8), "input 'output_grad' has spatial size \\[9, 4\\] but the output size"),
    (dict(scale=[1.0, -2.0]), "attribute 'scale'"),
])
def test_interp_bad_attributes(change, match):
    op, inputs, attrs = interp_case("bilinear", (5, 7), (9, 4), align_corners=False, align_mode=0)
    with pytest.raises(ValueError, match=match):
        tvmgrad.run(op, inputs, dict(attrs, **change))


def test_interp_bad_inputs():
    op, inputs, attrs = interp_case("bilinear", (5, 7), (9, 4), align_corners=False, align_mode=0)
    with pytest.raises(ValueError, match="input 'output_grad' has shape .* batch and channel"):
        tvmgrad.run(op, {"x": inputs["x"], "output_grad": inputs["output_grad"][:, :2]}, attrs)
    with pytest.raises(ValueError, match="input 'x' has rank 3 but 'output_grad' has rank 4"):
        tvmgrad.run(op, {"x": inputs["x"][0], "output_grad": inputs["output_grad"]}, attrs)
    with pytest.raises(ValueError, match="input 'out_size' holds 1 values"):
        tvmgrad.run(op, dict(inputs, out_size=np.array([9], "int32")), attrs)
    with pytest.raises(ValueError, match="input 'out_size' must hold integers"):
        tvmgrad.run(op, dict(inputs, out_size=np.array([9.0, 4.0])), attrs)
    with pytest.raises(ValueError, match=r"input 'size_tensor\[0\]' must have shape \[1\]"):
        tvmgrad.run(op, dict(inputs, size_tensor=[np.array([9, 4], "int32")]), attrs)
    with pytest.raises(ValueError, match="input 'scale_tensor' holds .* scales must be > 0"):
        tvmgrad.run(op, dict(inputs, scale_tensor=np.array([0.0], "float32")), attrs)
    with pytest.raises(TypeError, match="input 'output_grad' has dtype float64 but 'x' has float32"):
        tvmgrad.run(op, dict(inputs, x=inputs["x"].astype("float32")), attrs)
    op3, inputs3, attrs3 = interp_case("trilinear", (2, 3, 4), (3, 4, 6), align_corners=False)
    with pytest.raises(ValueError, match="attribute 'scale' has 2 values; a 3-D interpolation needs 3"):
        tvmgrad.run(op3, inputs3, dict(attrs3, scale=[1.5, 1.5]))


def test_scale_past_the_input_is_an_error():
    """scale 1.5 with out_size [8, 12] from 5x7: output 11 · (1/1.5) reaches input index 7 > 6
    (Paddle writes out of bounds and aborts)."""
    op, inputs, attrs = interp_case("bilinear", (5, 7), (8, 12), align_corners=False, align_mode=1)
    inputs["out_size"] = np.array([8, 12], "int32")
    with pytest.raises(ValueError, match="bilinear_interp_grad: output index 11 along w maps to "
                                         "input index 7, past the input size 7"):
        tvmgrad.run(op, inputs, dict(attrs, scale=[1.5, 1.5]))


# ------------------------------------------------------------------------------------------
# grid_sample

def grid_case(S, mode, pad, ac, *, seed=0, spread=1.6, N=2, C=3):
    r = rng(seed)
    sp, osp = [(5, 4), (4, 5, 3)][S - 2], [(3, 6), (3, 6, 2)][S - 2]
    inputs = {"x": r.standard_normal((N, C, *sp)),
              "grid": r.uniform(-spread, spread, (N, *osp, S)),
              "out_grad": r.standard_normal((N, C, *osp))}
    return inputs, dict(mode=mode, padding_mode=pad, align_corners=ac)


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("mode,pad,ac", list(itertools.product(("bilinear", "nearest"),
                                                               ("zeros", "border", "reflection"),
                                                               (True, False))))
@pytest.mark.sweep
def test_grid_sample_float64(S, mode, pad, ac):
    inputs, attrs = grid_case(S, mode, pad, ac, spread=3.5 if pad == "reflection" else 1.6)
    check("grid_sample_grad", inputs, attrs, "float64")


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_grid_sample_dtypes(dtype):
    for S, mode, pad, ac in [(2, "bilinear", "zeros", False), (2, "nearest", "reflection", True),
                             (3, "bilinear", "border", True)]:
        inputs, attrs = grid_case(S, mode, pad, ac)
        check("grid_sample_grad", inputs, attrs, dtype)


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_grid_sample_grid_grad_over_several_runs(S, dtype):
    """The CPU grid_grad sums channel by channel over runs of RUN output positions: two whole runs
    and a partial one, each point's sum matching Paddle's (channel order kept)."""
    from te_defs.interp import RUN
    osp = [(9, 15), (3, 5, 9)][S - 2]
    Q = int(np.prod(osp))
    assert Q > 2 * RUN and Q % RUN
    r = rng(4)
    sp = [(6, 5), (4, 6, 5)][S - 2]
    inputs = {"x": r.standard_normal((2, 5, *sp)), "grid": r.uniform(-1.2, 1.2, (2, *osp, S)),
              "out_grad": r.standard_normal((2, 5, *osp))}
    for pad in ("zeros", "reflection"):
        check("grid_sample_grad", inputs,
              dict(mode="bilinear", padding_mode=pad, align_corners=False), dtype)


GRID_EMPTY = [  # S, N, C, x spatial, grid output size
    (2, 2, 3, (5, 6), (1, 0)), (3, 2, 3, (4, 5, 6), (1, 1, 0)), (2, 2, 0, (5, 6), (3, 70)),
    (3, 2, 0, (4, 5, 6), (1, 1, 70)), (2, 0, 3, (5, 6), (3, 4)), (2, 2, 3, (0, 6), (3, 4))]


def _grid_empty_results():
    """[shape, any nonzero] of each output for every GRID_EMPTY call, both modes."""
    out = []
    for S, N, C, sp, osp in GRID_EMPTY:
        for mode in ("bilinear", "nearest"):
            r = rng(0)
            inputs = {"x": r.standard_normal((N, C, *sp)), "grid": r.uniform(-1, 1, (N, *osp, S)),
                      "out_grad": r.standard_normal((N, C, *osp))}
            res = tvmgrad.run("grid_sample_grad", inputs,
                              {"mode": mode, "padding_mode": "zeros", "align_corners": False})
            out.append({k: [list(v.shape), bool(v.any())] for k, v in res.items()})
    return out


def test_grid_sample_empty_in_a_child_process():
    """Size-0 output positions, channels, batch or input rows, both modes: x_grad and grid_grad
    of the right shapes, all zero (the sums are empty). In a child process: a size-0 extent
    once divided by zero (SIGFPE) computing the sizes of the kernel's tables."""
    got = iter(in_child_process("test_interp", "_grid_empty_results"))
    for S, N, C, sp, osp in GRID_EMPTY:
        for mode in ("bilinear", "nearest"):
            res = next(got)
            assert res["x_grad"] == [[N, C, *sp], False], (S, N, C, sp, osp, mode, res)
            assert res["grid_grad"] == [[N, *osp, S], False], (S, N, C, sp, osp, mode, res)


def test_grid_sample_pixel_centres_and_ties():
    """Grids on exact pixel positions (floor decides the cell, so grid_grad depends on the
    rounding of (g+1)·(S−1)/2), half-way ties for nearest (Paddle rounds half to even) and the
    borders exactly."""
    r = rng(3)
    x = r.standard_normal((1, 2, 5, 7))
    gx = np.linspace(-1, 1, 13)
    gy = np.linspace(-1, 1, 9)
    grid = np.stack(np.meshgrid(gx, gy), -1)[None]
    g = r.standard_normal((1, 2, 9, 13))
    for mode, pad, ac in itertools.product(("bilinear", "nearest"), ("zeros", "border", "reflection"),
                                           (True, False)):
        check("grid_sample_grad", {"x": x, "grid": grid, "out_grad": g},
              dict(mode=mode, padding_mode=pad, align_corners=ac), "float64")


def test_grid_sample_special_values():
    inputs, attrs = grid_case(2, "bilinear", "zeros", False)
    inputs["out_grad"][0, 1, 2, 3] = np.nan
    inputs["out_grad"][1, 0, 0, 0] = np.inf
    inputs["grid"][0, 1, 1] = [np.inf, 0.2]
    for pad in ("zeros", "border"):
        check("grid_sample_grad", inputs, dict(attrs, padding_mode=pad), "float64")


def test_grid_sample_nan_grid():
    """A NaN coordinate: Paddle computes int(round(NaN)) and writes out of bounds (it aborts).
    Here the point reaches no input pixel and its grid_grad is NaN."""
    inputs, attrs = grid_case(2, "bilinear", "zeros", True)
    clean = tvmgrad.run("grid_sample_grad", inputs, attrs)
    g2 = dict(inputs, out_grad=inputs["out_grad"].copy(), grid=inputs["grid"].copy())
    g2["grid"][1, 2, 4, 0] = np.nan
    g2["out_grad"][1, :, 2, 4] = 0.0
    res = tvmgrad.run("grid_sample_grad", g2, attrs)
    g0 = dict(g2, grid=inputs["grid"])
    base = tvmgrad.run("grid_sample_grad", g0, attrs)
    np.testing.assert_array_equal(res["x_grad"], base["x_grad"])
    assert np.isnan(res["grid_grad"][1, 2, 4]).all()
    mask = np.ones(res["grid_grad"].shape, bool)
    mask[1, 2, 4] = False
    np.testing.assert_array_equal(res["grid_grad"][mask], base["grid_grad"][mask])
    assert clean["x_grad"].shape == res["x_grad"].shape


def test_grid_sample_adjoint_with_paddle_forward():
    """⟨grid_sample(x, grid), g⟩ = ⟨x, x_grad⟩ (linear in x) with Paddle's forward."""
    import paddle
    for S, mode, pad, ac in [(2, "bilinear", "zeros", False), (2, "bilinear", "reflection", True),
                             (3, "bilinear", "border", False), (2, "nearest", "zeros", True)]:
        inputs, attrs = grid_case(S, mode, pad, ac)
        y = paddle._C_ops.grid_sample(to_paddle(inputs["x"]), to_paddle(inputs["grid"]), mode,
                                      pad, ac)
        lhs = float((from_paddle(y) * inputs["out_grad"]).sum())
        rhs = float((tvmgrad.run("grid_sample_grad", inputs, attrs)["x_grad"] * inputs["x"]).sum())
        assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs)), (S, mode, pad, ac, lhs, rhs)


def test_grid_sample_bad_input():
    inputs, attrs = grid_case(2, "bilinear", "zeros", False)
    with pytest.raises(ValueError, match="grid_sample_grad: attribute 'mode' is 'bicubic'"):
        tvmgrad.run("grid_sample_grad", inputs, dict(attrs, mode="bicubic"))
    with pytest.raises(ValueError, match="attribute 'padding_mode' is 'wrap'"):
        tvmgrad.run("grid_sample_grad", inputs, dict(attrs, padding_mode="wrap"))
    with pytest.raises(ValueError, match="input 'grid' must be \\[N, H_out, W_out, 2\\]"):
        tvmgrad.run("grid_sample_grad", dict(inputs, grid=inputs["grid"][..., :1]), attrs)
    with pytest.raises(ValueError, match="input 'out_grad' must have shape \\[2, 3, 3, 6\\]"):
        tvmgrad.run("grid_sample_grad", dict(inputs, out_grad=inputs["out_grad"][:, :, :2]), attrs)
    with pytest.raises(ValueError, match="input 'x' must be 4-D"):
        tvmgrad.run("grid_sample_grad", dict(inputs, x=inputs["x"][0]), attrs)


# ------------------------------------------------------------------------------------------
# affine_grid

def affine_case(shape, seed=0):
    r = rng(seed)
    S = len(shape) - 2
    return {"input": r.standard_normal((shape[0], S, S + 1)),
            "output_grad": r.standard_normal([shape[0], *shape[2:], S])}


@pytest.mark.parametrize("shape", [[2, 3, 4, 5], [1, 1, 7, 2], [2, 2, 3, 4, 5], [3, 1, 2, 1, 6]])
@pytest.mark.parametrize("dtype", FLOATS)
def test_affine_grid(shape, dtype):
    for ac in (True, False):
        if ac and 1 in shape[2:]:
            continue
        check("affine_grid_grad", affine_case(shape), dict(output_shape=shape, align_corners=ac),
              dtype)


def test_affine_grid_single_point_dim():
    """A size-1 dim with align_corners: Paddle's linspace step is 2/0 and its base coordinate NaN
    (so theta_grad is NaN); the coordinate is 0 here (the centre, PyTorch's value). The other
    entries match Paddle."""
    inputs = affine_case([3, 1, 1, 6])
    ours = tvmgrad.run("affine_grid_grad", inputs, dict(output_shape=[3, 1, 1, 6],
                                                        align_corners=True))["input_grad"]
    want = c_ops("affine_grid_grad", inputs, dict(output_shape=[3, 1, 1, 6],
                                                  align_corners=True))["input_grad"]
    assert np.isnan(want[:, :, 1]).all()
    np.testing.assert_array_equal(ours[:, :, 1], 0.0)
    np.testing.assert_allclose(ours[:, :, [0, 2]], want[:, :, [0, 2]], rtol=1e-12)


def test_affine_grid_adjoint_with_paddle_forward():
    import paddle
    for shape, ac in [([2, 3, 4, 5], True), ([2, 2, 3, 4, 5], False)]:
        inputs = affine_case(shape)
        y = paddle._C_ops.affine_grid(to_paddle(inputs["input"]), shape, ac)
        lhs = float((from_paddle(y) * inputs["output_grad"]).sum())
        rhs = float((tvmgrad.run("affine_grid_grad", inputs, dict(output_shape=shape,
                                                                  align_corners=ac))
                     ["input_grad"] * inputs["input"]).sum())
        assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


def test_affine_grid_bad_input():
    inputs = affine_case([2, 3, 4, 5])
    with pytest.raises(ValueError, match="affine_grid_grad: attribute 'output_shape' must hold 4"):
        tvmgrad.run("affine_grid_grad", inputs, dict(output_shape=[2, 3, 4]))
    with pytest.raises(ValueError, match="input 'output_grad' has shape \\[2, 4, 5, 2\\] but "
                                         "output_shape"):
        tvmgrad.run("affine_grid_grad", inputs, dict(output_shape=[2, 3, 4, 6]))
    with pytest.raises(ValueError, match="input 'input' \\(theta\\) must have shape \\[2, 2, 3\\]"):
        tvmgrad.run("affine_grid_grad", dict(inputs, input=inputs["input"][:, :, :2]),
                    dict(output_shape=[2, 3, 4, 5]))
