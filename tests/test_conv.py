"""Convolution grads against Paddle 3.3.1 (te_defs/conv.py): conv2d/conv3d/depthwise_conv2d
first and double grads and conv3d_transpose_grad.

Configurations cover strides, symmetric and per-side paddings, SAME/VALID, dilations, groups
(including depthwise with channel multipliers), both layouts, 1x1 kernels, empty batches and
size-1 dims; every float dtype runs on a representative subset (the rest is behind ``slow``).
Double grads use Paddle's own double-grad kernels through autograd (depthwise_conv2d_double_grad
has no CPU kernel in Paddle: its oracle is the conv2d double grad with the same groups); the data
and filter grads are also checked as the adjoint of the forward convolution (the double grad's
grad_out_grad).

Paddle's conv3d_transpose kernel treats only the exact string "NHWC" as channel-last (its
"NDHWC" path is channel-first and then fails shape checks); tvmgrad reads "NDHWC" and "NHWC"
as channel-last for 5-D tensors, so the channel-last oracle passes "NHWC".
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, autograd_oracle, c_ops, check, micro_kernel_rows, rng, scheduled

FAST = ("float64",)
# float32: a grad element sums up to a few hundred unit-size products (conv2d "wide": 66 x 3,
# conv3d 9 x 27), so it rounds to ~1e-5 absolute whatever its size: a sum that cancels to 0.03
# cannot hold rtol alone
F32_SUM_ATOL = 2e-5


def N(*shape, seed=0):
    return rng(seed + 13 * len(shape) + sum(shape)).standard_normal(shape)


def conv_out(i, k, s, lo, hi, d):
    return (i + lo + hi - d * (k - 1) - 1) // s + 1


def same_pad(i, k, s):
    out = (i + s - 1) // s
    total = max((out - 1) * s + k - i, 0)
    return total // 2, total - total // 2


def conv_shapes(x, w, attrs):
    """out_grad's shape for a conv of x (layout per attrs) with filter w."""
    S = len(w) - 2
    last = attrs["data_format"] in ("NHWC", "NDHWC")
    sp = x[1:1 + S] if last else x[2:]
    pads = attrs["paddings"]
    lo, hi = (pads, pads) if len(pads) == S else (pads[0::2], pads[1::2])
    dil = attrs["dilations"]
    if attrs["padding_algorithm"] == "VALID":
        lo = hi = [0] * S
    if attrs["padding_algorithm"] == "SAME":
        lo, hi = zip(*[same_pad(sp[i], w[2 + i], attrs["strides"][i]) for i in range(S)])
        dil = [1] * S
    out = [conv_out(sp[i], w[2 + i], attrs["strides"][i], lo[i], hi[i], dil[i]) for i in range(S)]
    return (x[0], *out, w[0]) if last else (x[0], w[0], *out)


def attrs2(**kw):
    a = dict(strides=[1, 1], paddings=[0, 0], padding_algorithm="EXPLICIT", dilations=[1, 1],
             groups=1, data_format="NCHW")
    a.update(kw)
    return a


def attrs3(**kw):
    a = dict(strides=[1, 1, 1], paddings=[0, 0, 0], padding_algorithm="EXPLICIT",
             dilations=[1, 1, 1], groups=1, data_format="NCDHW")
    a.update(kw)
    return a


def conv_inputs(x, w, attrs, seed=0):
    return {"input": N(*x, seed=seed), "filter": N(*w, seed=seed + 1),
            "out_grad": N(*conv_shapes(x, w, attrs), seed=seed + 2)}


# ------------------------------------------------------------------------------------------
# conv2d_grad

CONV2D = {
    "plain": ((2, 3, 7, 6), (4, 3, 3, 3), attrs2()),
    "pad1": ((2, 3, 7, 7), (4, 3, 3, 3), attrs2(paddings=[1, 1])),
    "stride2_pad4": ((2, 4, 9, 8), (6, 2, 3, 2), attrs2(strides=[2, 2], paddings=[1, 0, 1, 1], groups=2)),
    "dilated": ((2, 5, 9, 8), (4, 5, 3, 3), attrs2(strides=[1, 2], dilations=[2, 2])),
    "same_s2": ((2, 3, 7, 7), (4, 3, 3, 3), attrs2(padding_algorithm="SAME", strides=[2, 2], dilations=[2, 2])),
    "valid": ((1, 2, 5, 6), (3, 2, 2, 3), attrs2(padding_algorithm="VALID", paddings=[3, 3])),
    "1x1": ((2, 8, 5, 5), (5, 8, 1, 1), attrs2()),
    "nhwc": ((2, 7, 6, 3), (4, 3, 3, 3), attrs2(data_format="NHWC", paddings=[1, 2])),
    "nhwc_groups_s2": ((2, 7, 7, 6), (6, 2, 3, 3), attrs2(data_format="NHWC", groups=3, strides=[2, 2])),
    "depthwise": ((2, 6, 7, 7), (6, 1, 3, 3), attrs2(groups=6, paddings=[1, 1])),
    "depthwise_nhwc": ((2, 7, 7, 6), (12, 1, 3, 3), attrs2(groups=6, data_format="NHWC")),
    "wide": ((1, 3, 5, 70), (66, 3, 1, 3), attrs2(paddings=[0, 1])),
    "unit": ((1, 1, 1, 1), (1, 1, 1, 1), attrs2()),
    "kernel_eq_input": ((2, 2, 3, 3), (2, 2, 3, 3), attrs2()),
    # channel-first with a full grain of channels: the data grad is computed channel-last
    "many_channels": ((2, 48, 5, 9), (4, 48, 3, 3), attrs2(paddings=[1, 1], dilations=[1, 2])),
    "many_channels_s2": ((1, 96, 6, 8), (8, 48, 3, 3), attrs2(strides=[2, 2], paddings=[1, 1], groups=2)),
}


@pytest.mark.parametrize("name", sorted(CONV2D))
@pytest.mark.sweep
def test_conv2d_grad(name):
    x, w, attrs = CONV2D[name]
    check("conv2d_grad", conv_inputs(x, w, attrs), attrs, "float64")


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("name", ["pad1", "nhwc_groups_s2"])
@pytest.mark.sweep
def test_conv2d_grad_dtypes(dtype, name):
    x, w, attrs = CONV2D[name]
    check("conv2d_grad", conv_inputs(x, w, attrs), attrs, dtype,
          rtol=5e-5 if dtype == "float32" else None,
          atol=F32_SUM_ATOL if dtype == "float32" else None)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("name", sorted(CONV2D))
def test_conv2d_grad_dtypes_all(dtype, name):
    x, w, attrs = CONV2D[name]
    check("conv2d_grad", conv_inputs(x, w, attrs), attrs, dtype,
          rtol=5e-5 if dtype == "float32" else None,
          atol=F32_SUM_ATOL if dtype == "float32" else None)


def test_conv2d_grad_empty_batch():
    x, w, attrs = (0, 3, 5, 5), (4, 3, 3, 3), attrs2(paddings=[1, 1])
    out = tvmgrad.run("conv2d_grad", conv_inputs(x, w, attrs), attrs)
    assert out["input_grad"].shape == x
    np.testing.assert_array_equal(out["filter_grad"], 0)     # Paddle fills it with zeros too


def test_conv2d_grad_special_values():
    """inf/NaN in the cotangent reach exactly the inputs in their receptive field (zero padding
    must not multiply into them)."""
    x, w, attrs = (1, 2, 6, 6), (3, 2, 3, 3), attrs2(paddings=[1, 1])
    inputs = conv_inputs(x, w, attrs)
    inputs["out_grad"][0, 1, 0, 0] = np.inf
    inputs["out_grad"][0, 2, 5, 5] = np.nan
    inputs["input"][0, 0, 3, 3] = np.inf
    check("conv2d_grad", inputs, attrs, "float64")


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="x86-64 CPU names")
@pytest.mark.parametrize("cpu", ["x86-64-v3", "x86-64-v4"])
def test_channel_blocked_grads_tile_the_targets_micro_kernel_rows(cpu):
    """A channel-first conv2d_grad with 64 channels and a 3 x 5 window (its data grad stays
    channel-first: _channel_last_data): its data grad (M = c) and filter grad (M = o) pad their
    channels to the target's micro-kernel rows (6: 66 channels, not 64) and tile by
    them, as _dense.gemm's contractions do; on the host the grads are Paddle's."""
    import re

    attrs = attrs2(paddings=[1, 2])
    inputs = {k: v.astype("float32") for k, v in
              conv_inputs((1, 64, 9, 10), (64, 64, 3, 5), attrs).items()}
    _, script = scheduled("conv2d_grad", inputs, attrs, cpu=cpu)
    assert set(re.findall(r'"dense\.gm": (\d+)', script)) == {"6"}, cpu
    assert micro_kernel_rows(script) == {"6"}, cpu
    if cpu == "x86-64-v3":        # any x86-64 host runs AVX2 code; the host's own target here
        check("conv2d_grad", inputs, attrs, "float64")      # float64: 960-term sums, exact


def test_conv2d_grad_adjoint():
    """⟨conv(x', w), g⟩ = ⟨x', input_grad(g)⟩ and ⟨conv(x, w'), g⟩ = ⟨w', filter_grad(g)⟩,
    with our own forward convolution (conv2d_grad_grad's grad_out_grad)."""
    x, w, attrs = CONV2D["stride2_pad4"]
    inputs = conv_inputs(x, w, attrs)
    xp, wp = N(*x, seed=7), N(*w, seed=8)
    g = inputs["out_grad"]
    grads = tvmgrad.run("conv2d_grad", inputs, attrs)
    fwd_x = tvmgrad.run("conv2d_grad_grad", {"input": inputs["input"], "filter": inputs["filter"],
                                             "grad_out": g, "grad_input_grad": xp}, attrs)
    fwd_w = tvmgrad.run("conv2d_grad_grad", {"input": inputs["input"], "filter": inputs["filter"],
                                             "grad_out": g, "grad_filter_grad": wp}, attrs)
    for fwd, tangent, grad in ((fwd_x, xp, grads["input_grad"]), (fwd_w, wp, grads["filter_grad"])):
        lhs, rhs = np.sum(fwd["grad_out_grad"] * g), np.sum(tangent * grad)
        assert abs(lhs - rhs) < 1e-10 * (abs(lhs) + 1)


def test_conv2d_grad_bench_shape():
    """The benchmark shape (8 x 64 x 56 x 56, 3 x 3): many tiles of every kind."""
    x, w, attrs = (2, 64, 56, 56), (64, 64, 3, 3), attrs2(paddings=[1, 1])
    # filter_grad sums 2·56·56 products of ~1: float32 rounding (ours and Paddle's) ~1e-4
    check("conv2d_grad", conv_inputs(x, w, attrs), attrs, "float32", rtol=1e-4, atol=2e-3)


# ------------------------------------------------------------------------------------------
# conv3d_grad, depthwise_conv2d_grad

CONV3D = {
    "plain": ((2, 3, 5, 6, 4), (4, 3, 3, 2, 2), attrs3()),
    "s2_groups": ((1, 4, 7, 6, 5), (4, 2, 3, 3, 3), attrs3(strides=[2, 2, 2], paddings=[1, 1, 1], groups=2)),
    "ndhwc_pad6": ((2, 5, 6, 4, 3), (4, 3, 3, 2, 2), attrs3(data_format="NDHWC", paddings=[1, 0, 0, 1, 1, 1])),
    "same": ((1, 2, 5, 5, 5), (3, 2, 3, 3, 3), attrs3(padding_algorithm="SAME", strides=[2, 1, 2])),
}


@pytest.mark.sweep
@pytest.mark.parametrize("name", sorted(CONV3D))
def test_conv3d_grad(name):
    x, w, attrs = CONV3D[name]
    check("conv3d_grad", conv_inputs(x, w, attrs), attrs, "float64")


@pytest.mark.parametrize("dtype", ("float32", "float64"))
def test_conv3d_filter_grad_swept_over_output_rows(dtype):
    """The filter grad's reduction over output positions runs its depth and row loops around
    the M tiles (schedules/cpu/gemm_dense._swept_reduction): 9 output channels are 3 tiles of
    rows (and padding), 4 x 5 output rows are 20 runs, each accumulating onto the tile that
    the last run left; the data grad's reduction stays whole."""
    x, w, attrs = (2, 5, 4, 5, 11), (9, 5, 3, 3, 3), attrs3(paddings=[1, 1, 1])
    check("conv3d_grad", conv_inputs(x, w, attrs), attrs, dtype,
          atol=F32_SUM_ATOL if dtype == "float32" else None)


def test_only_a_filter_grad_reduction_is_swept():
    """In conv3d_grad's scheduled TIR the filter contraction's output depth and row loops
    (p0, p1) are outside its M tile loop (o_0) and its output column loop (p2) inside; the data
    contraction keeps its reduction (output channels x kernel window) in one nest inside."""
    import re
    from tvmgrad.build import lower
    from tvmgrad.planning import plan_call
    x, w, attrs = CONV3D["plain"]
    planned = plan_call("conv3d_grad", conv_inputs(x, w, attrs), attrs, target="llvm")
    script = lower(planned.plan, planned.target).script()
    assert re.search(r"for conv_dw_p0, conv_dw_p1, o_0, conv_dw_p2 in T\.grid", script)
    assert re.search(r"for conv_dx_o, conv_dx_j0, conv_dx_j1, conv_dx_j2 in T\.grid", script)


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_conv3d_grad_dtypes(dtype):
    x, w, attrs = CONV3D["s2_groups"]
    check("conv3d_grad", conv_inputs(x, w, attrs), attrs, dtype)


DEPTHWISE = {
    "m2_s2": ((2, 4, 8, 7), (8, 1, 3, 3), attrs2(groups=4, strides=[2, 2], paddings=[1, 1])),
    "nhwc": ((2, 7, 7, 5), (5, 1, 3, 3), attrs2(groups=5, data_format="NHWC", dilations=[2, 1])),
}
# one channel per group, channel-first: both grads per plane (te_defs/_conv_planes.py). Rows of
# 37 are 4 whole strips of 8 and a partial one; "far_pad" pads more than the window spans (the
# first dy rows and columns fall outside every dx); "s1x2" skips every other dx column
PLANES = {
    "m1": ((2, 6, 7, 7), (6, 1, 3, 3), attrs2(groups=6, paddings=[1, 1])),
    "wide_dilated": ((2, 5, 9, 37), (5, 1, 3, 3), attrs2(groups=5, paddings=[1, 2], dilations=[2, 1])),
    "far_pad": ((1, 4, 5, 6), (4, 1, 3, 2), attrs2(groups=4, paddings=[4, 1, 3, 5])),
    "s1x2_5x3": ((2, 4, 8, 19), (4, 1, 5, 3), attrs2(groups=4, strides=[1, 2], paddings=[2, 1])),
    "same_s2": ((2, 4, 9, 10), (4, 1, 3, 3), attrs2(groups=4, padding_algorithm="SAME", strides=[2, 2])),
    "1x1": ((2, 4, 3, 17), (4, 1, 1, 1), attrs2(groups=4)),
    "7x7": ((1, 4, 9, 11), (4, 1, 7, 7), attrs2(groups=4, paddings=[3, 3])),     # 49 partials
    "unit": ((1, 4, 1, 1), (4, 1, 1, 1), attrs2(groups=4)),
}
DEPTHWISE.update(PLANES)


@pytest.mark.sweep
@pytest.mark.parametrize("name", sorted(DEPTHWISE))
@pytest.mark.parametrize("dtype", FLOATS)
def test_depthwise_conv2d_grad(name, dtype):
    x, w, attrs = DEPTHWISE[name]
    if dtype != "float64" and name not in ("m2_s2", "wide_dilated"):
        return      # every dtype on a configuration of each form; float64 on all
    check("depthwise_conv2d_grad", conv_inputs(x, w, attrs), attrs, dtype,
          atol=F32_SUM_ATOL if dtype == "float32" else None)


def test_depthwise_conv2d_grad_empty_batch():
    x, w, attrs = PLANES["m1"]
    out = tvmgrad.run("depthwise_conv2d_grad", conv_inputs((0, *x[1:]), w, attrs), attrs)
    assert out["input_grad"].shape == (0, *x[1:])
    np.testing.assert_array_equal(out["filter_grad"], 0)
    assert out["filter_grad"].shape == w


def _planes_cuda_form():
    """The per-plane kernel's CUDA blocks (a thread per dx element, per tap partial), built for
    LLVM: the CPU rule made to keep them. In a fresh cache (the key does not see the swap)."""
    import os
    import tempfile
    os.environ["TVMGRAD_CACHE_DIR"] = tempfile.mkdtemp()
    from tvmgrad.schedules.cpu import gather_owners
    keep_cpu = gather_owners.specialise
    gather_owners.specialise = lambda sch, on_cuda: keep_cpu(sch, 1)
    from tvmgrad.build import lower
    from tvmgrad.planning import plan_call
    x, w, attrs = PLANES["m1"]
    planned = plan_call("depthwise_conv2d_grad", conv_inputs(x, w, attrs), attrs, target="llvm")
    script = lower(planned.plan, planned.target).script()
    results = {"blocks": [b for b in ("depthwise_planes", "depthwise_dx", "depthwise_dw")
                          if f'sblock("{b}")' in script]}
    for name, (x, w, attrs) in PLANES.items():
        out = tvmgrad.run("depthwise_conv2d_grad", conv_inputs(x, w, attrs), attrs)
        results[name] = {k: v.tolist() for k, v in out.items()}
    return results


@pytest.mark.slow      # CI runs it by name (.ci/run): the default run's time budget
def test_depthwise_planes_cuda_form_matches_the_cpu_form():
    """Both forms of te_defs/_conv_planes.py (the CPU one is checked against Paddle above) agree
    on every PLANES configuration; the CUDA form's math runs here on LLVM."""
    from harness import in_child_process
    cuda_form = in_child_process("test_conv", "_planes_cuda_form")
    assert cuda_form["blocks"] == ["depthwise_dx", "depthwise_dw"]
    for name, (x, w, attrs) in PLANES.items():
        cpu_form = tvmgrad.run("depthwise_conv2d_grad", conv_inputs(x, w, attrs), attrs)
        for k, v in cpu_form.items():
            np.testing.assert_allclose(cuda_form[name][k], v, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name}: {k}")


# ------------------------------------------------------------------------------------------
# conv3d_transpose_grad

def attrs_t(**kw):
    a = dict(strides=[1, 1, 1], paddings=[0, 0, 0], output_padding=[], output_size=[],
             padding_algorithm="EXPLICIT", groups=1, dilations=[1, 1, 1], data_format="NCDHW")
    a.update(kw)
    return a


def transpose_out(x, w, a):
    S = 3
    last = a["data_format"] in ("NHWC", "NDHWC")
    sp = x[1:1 + S] if last else x[2:]
    pads = a["paddings"]
    lo, hi = (pads, pads) if len(pads) == S else (pads[0::2], pads[1::2])
    dil = a["dilations"]
    if a["padding_algorithm"] == "VALID":
        lo = hi = [0] * S
    if a["padding_algorithm"] == "SAME":
        lo, hi = zip(*[same_pad(sp[i], w[2 + i], a["strides"][i]) for i in range(S)])
        dil = [1] * S
    op = a["output_padding"] or [0] * S
    out = [(sp[i] - 1) * a["strides"][i] - lo[i] - hi[i] + dil[i] * (w[2 + i] - 1) + 1 + op[i]
           for i in range(S)]
    oc = w[1] * a["groups"]
    return (x[0], *out, oc) if last else (x[0], oc, *out)


TRANSPOSE = {
    "plain": ((2, 3, 3, 4, 3), (3, 2, 2, 3, 2), attrs_t()),
    "s2_op_groups": ((1, 4, 3, 3, 3), (4, 3, 3, 3, 3), attrs_t(strides=[2, 2, 2], paddings=[1, 1, 1], output_padding=[1, 0, 1], groups=2)),
    "dilated_pad6": ((1, 2, 3, 2, 3), (2, 2, 2, 2, 3), attrs_t(dilations=[2, 1, 1], paddings=[0, 1, 1, 0, 1, 1])),
    "nhwc": ((2, 3, 2, 3, 4), (4, 2, 2, 2, 2), attrs_t(data_format="NHWC", strides=[1, 2, 1])),
}


def transpose_oracle(inputs, attrs):
    """Paddle's binding, with "NHWC" for channel-last (see the module docstring)."""
    a = dict(attrs)
    if a.get("data_format") == "NDHWC":
        a["data_format"] = "NHWC"
    return c_ops("conv3d_transpose_grad", inputs, a)


@pytest.mark.sweep
@pytest.mark.parametrize("name", sorted(TRANSPOSE))
def test_conv3d_transpose_grad(name):
    x, w, attrs = TRANSPOSE[name]
    inputs = {"x": N(*x), "filter": N(*w, seed=1), "out_grad": N(*transpose_out(x, w, attrs), seed=2)}
    check("conv3d_transpose_grad", inputs, attrs, "float64", oracle=transpose_oracle)


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_conv3d_transpose_grad_dtypes(dtype):
    x, w, attrs = TRANSPOSE["s2_op_groups"]
    inputs = {"x": N(*x), "filter": N(*w, seed=1), "out_grad": N(*transpose_out(x, w, attrs), seed=2)}
    check("conv3d_transpose_grad", inputs, attrs, dtype, oracle=transpose_oracle)


def test_conv3d_transpose_grad_ndhwc_is_channel_last():
    x, w, attrs = TRANSPOSE["nhwc"]
    inputs = {"x": N(*x), "filter": N(*w, seed=1), "out_grad": N(*transpose_out(x, w, attrs), seed=2)}
    a = tvmgrad.run("conv3d_transpose_grad", inputs, attrs)
    b = tvmgrad.run("conv3d_transpose_grad", inputs, dict(attrs, data_format="NDHWC"))
    np.testing.assert_array_equal(a["x_grad"], b["x_grad"])
    np.testing.assert_array_equal(a["filter_grad"], b["filter_grad"])


# ------------------------------------------------------------------------------------------
# double grads

def double_inputs(x, w, attrs, which=("x", "w")):
    base = conv_inputs(x, w, attrs)
    inputs = {"input": base["input"], "filter": base["filter"], "grad_out": base["out_grad"]}
    if "x" in which:
        inputs["grad_input_grad"] = N(*x, seed=5)
    if "w" in which:
        inputs["grad_filter_grad"] = N(*w, seed=6)
    return inputs


@pytest.mark.sweep
@pytest.mark.parametrize("which", [("x", "w"), ("x",), ("w",)])
@pytest.mark.parametrize("name", ["pad1", "stride2_pad4", "nhwc", "many_channels_s2"])
def test_conv2d_grad_grad(name, which):
    x, w, attrs = CONV2D[name]
    check("conv2d_grad_grad", double_inputs(x, w, attrs, which), attrs, "float64",
          oracle=autograd_oracle("conv2d_grad_grad"))


def test_conv2d_grad_grad_none():
    """No cotangent at all: every output is zero."""
    x, w, attrs = CONV2D["pad1"]
    out = tvmgrad.run("conv2d_grad_grad", double_inputs(x, w, attrs, ()), attrs)
    for v in out.values():
        np.testing.assert_array_equal(v, 0)


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_conv2d_grad_grad_dtypes(dtype):
    x, w, attrs = CONV2D["dilated"]
    check("conv2d_grad_grad", double_inputs(x, w, attrs), attrs, dtype,
          oracle=autograd_oracle("conv2d_grad_grad"))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.sweep
def test_conv3d_double_grad(dtype):
    x, w, attrs = CONV3D["s2_groups"]
    check("conv3d_double_grad", double_inputs(x, w, attrs), attrs, dtype,
          oracle=autograd_oracle("conv3d_double_grad"))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.sweep
def test_depthwise_conv2d_double_grad(dtype):
    """Paddle has no CPU depthwise_conv2d_double_grad kernel: the oracle is its conv2d double
    grad with the same groups (the same mathematics)."""
    x, w, attrs = DEPTHWISE["m2_s2"]
    check("depthwise_conv2d_double_grad", double_inputs(x, w, attrs, ("x", "w")), attrs, dtype,
          oracle=autograd_oracle("conv2d_grad_grad"))


# ------------------------------------------------------------------------------------------
# bad input

def test_conv_errors():
    x, w, attrs = CONV2D["pad1"]
    good = conv_inputs(x, w, attrs)
    with pytest.raises(ValueError, match=r"conv2d_grad: channel/group mismatch: 'input' has 3 channels"):
        tvmgrad.run("conv2d_grad", dict(good, filter=N(4, 2, 3, 3)), attrs)
    with pytest.raises(ValueError, match=r"conv2d_grad: channel/group mismatch"):
        tvmgrad.run("conv2d_grad", good, dict(attrs, groups=2))
    with pytest.raises(ValueError, match=r"conv2d_grad: the filter .* is larger than the padded input"):
        tvmgrad.run("conv2d_grad", {"input": N(1, 3, 2, 2), "filter": N(4, 3, 5, 5),
                                    "out_grad": N(1, 4, 1, 1)}, attrs)
    with pytest.raises(ValueError, match=r"conv2d_grad: attribute 'data_format' must be one of"):
        tvmgrad.run("conv2d_grad", good, dict(attrs, data_format="NWHC"))
    with pytest.raises(ValueError, match=r"conv2d_grad: attribute 'padding_algorithm' must be one of"):
        tvmgrad.run("conv2d_grad", good, dict(attrs, padding_algorithm="FULL"))
    with pytest.raises(ValueError, match=r"conv2d_grad: input 'out_grad' has spatial size 6 in dim 0"):
        tvmgrad.run("conv2d_grad", dict(good, out_grad=N(2, 4, 6, 7)), attrs)
    with pytest.raises(ValueError, match=r"conv2d_grad: attribute 'strides' must be >= 1"):
        tvmgrad.run("conv2d_grad", good, dict(attrs, strides=[0, 1]))
    with pytest.raises(ValueError, match=r"conv2d_grad: attribute 'paddings' must have 2 or 4 values"):
        tvmgrad.run("conv2d_grad", good, dict(attrs, paddings=[1, 1, 1]))
    with pytest.raises(ValueError, match=r"conv2d_grad: input 'filter' must be 4-D"):
        tvmgrad.run("conv2d_grad", dict(good, filter=N(4, 3, 3)), attrs)
    with pytest.raises(ValueError, match=r"conv2d_grad: input 'out_grad' has 5 channels"):
        tvmgrad.run("conv2d_grad", dict(good, out_grad=N(2, 5, 7, 7)), attrs)
    dd = double_inputs(x, w, attrs)
    with pytest.raises(ValueError, match=r"conv2d_grad_grad: input 'grad_input_grad' has shape"):
        tvmgrad.run("conv2d_grad_grad", dict(dd, grad_input_grad=N(2, 3, 7, 6)), attrs)
    xt, wt, at = TRANSPOSE["plain"]
    with pytest.raises(ValueError, match=r"conv3d_transpose_grad: input 'out_grad' has spatial size"):
        tvmgrad.run("conv3d_transpose_grad", {"x": N(*xt), "filter": N(*wt), "out_grad": N(2, 2, 9, 6, 4)}, at)


@pytest.mark.cuda
@pytest.mark.slow
def test_channel_last_data_grad_compiles_to_cubin_without_spills():
    """The CUDA build of the CPU-driven forms: a channel-first data grad computed channel-last
    (many channels), its double grad, and filter grads reading x in place (a last spatial dim
    that the reduction grain divides, in 2-D and 3-D)."""
    from cubins import assert_compiles_without_spills, plans_of
    calls = []
    for op, (x, w, attrs) in (("conv2d_grad", ((1, 64, 8, 8), (64, 64, 3, 3), attrs2(paddings=[1, 1]))),
                              ("conv2d_grad", CONV2D["many_channels_s2"]),
                              ("conv3d_grad", ((1, 4, 3, 4, 8), (4, 4, 3, 3, 3), attrs3(paddings=[1, 1, 1])))):
        calls.append((op, {k: v.astype("float32") for k, v in conv_inputs(x, w, attrs).items()}, attrs))
    x, w, attrs = CONV2D["many_channels_s2"]
    calls.append(("conv2d_grad_grad", {k: v.astype("float32") for k, v in
                                       double_inputs(x, w, attrs, ("x", "w")).items()}, attrs))
    assert_compiles_without_spills(plans_of(calls))
