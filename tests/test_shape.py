"""Reshape, view and index-map grads (te_defs/shape.py) against Paddle 3.3.1.

Every op runs in every float dtype against Paddle (``_C_ops.<grad>``; the forward op for the
double grads that invoke one), on odd shapes, negative axes and non-default attributes, and every
linear map is checked with the adjoint identity <A x, y> = <x, A^T y> in float64 against its
forward (ours, Paddle's or numpy's).

Where Paddle 3.3.1 is wrong the reference is numpy and the test says why:
* as_strided_grad and tensor_unfold_grad with overlapping windows: Paddle copies out_grad into the
  strided view (the last write wins) instead of summing; as_strided's ``offset`` is in bytes.
* fill_diagonal_tensor_grad with negative dims: Paddle's kernel leaves them unnormalised (its
  strides are then uninitialised; 3.3.1 returns out_grad unchanged); here they count from the end.
"""

import math

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from adjoint import assert_adjoint
from harness import CPLX, FLOATS, INTLIKE, TOL, agree, cast, extra_dtypes, check, data, from_paddle, np_dtype, rng, to_paddle


def _n(*shape, seed=0):
    return rng(seed).standard_normal(shape)


def _c(name):
    import paddle
    paddle.set_device("cpu")
    return getattr(paddle._C_ops, name)


def _grad(op, inputs, attrs, name):
    return tvmgrad.run(op, inputs, attrs)[name]


# ------------------------------------------------------------------------------------------
# zero-copy: squeeze / unsqueeze / flatten / view_shape

RESHAPES = [
    ("squeeze_grad", (2, 1, 3), (2, 3), {"axis": [1]}),
    ("squeeze_grad", (1, 4, 1), (4,), {"axis": []}),
    ("unsqueeze_grad", (2, 3), (2, 1, 3, 1), {"axis": [1, -1]}),
    ("flatten_grad", (2, 3, 4), (2, 12), {}),
    ("flatten_grad", (5,), (5,), {}),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op,xs,gs,attrs", RESHAPES)
def test_reshape_grads(op, xs, gs, attrs, dtype):
    """Paddle 3.3.1 takes the forward input x as ``xshape`` (the grad has its dims)."""
    check(op, {"xshape": _n(*xs), "out_grad": _n(*gs, seed=1)}, attrs, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_view_shape_grad(dtype):
    check("view_shape_grad", {"input": _n(2, 3, 4), "out_grad": _n(6, 4, seed=1)}, {"dims": [6, 4]}, dtype)


def test_legacy_xshape_is_accepted():
    g = _n(2, 3)
    got = tvmgrad.run("squeeze_grad", {"xshape": np.zeros((0, 2, 1, 3)), "out_grad": g}, {"axis": [1]})
    np.testing.assert_array_equal(got["x_grad"], g.reshape(2, 1, 3))


@pytest.mark.parametrize("op,xs,gs,attrs", RESHAPES)
def test_reshape_grads_alias_or_copy(op, xs, gs, attrs):
    g = _n(*gs)
    inputs = {"xshape": _n(*xs), "out_grad": g}
    view = tvmgrad.run(op, inputs, attrs, alias=True)["x_grad"]
    copy = tvmgrad.run(op, inputs, attrs)["x_grad"]
    assert view.shape == copy.shape == xs
    assert np.shares_memory(view, g) and not np.shares_memory(copy, g)
    np.testing.assert_array_equal(copy, g.reshape(xs))
    launch = tvmgrad.prepare(op, inputs, attrs, alias=True)
    assert launch.function is None                  # no kernel either way


def test_view_shape_grad_alias():
    g = _n(6, 4)
    got = tvmgrad.run("view_shape_grad", {"input": _n(2, 3, 4), "out_grad": g}, {"dims": [6, 4]}, alias=True)
    assert np.shares_memory(got["input_grad"], g) and got["input_grad"].shape == (2, 3, 4)


SQUEEZE_AXES = [[1], [-2], [], [0, 1], [0]]


@pytest.mark.parametrize("axis", SQUEEZE_AXES)
def test_squeeze_double_grad_is_squeeze(axis):
    x = _n(2, 1, 3, 1)
    got = tvmgrad.run("squeeze_double_grad", {"grad_x_grad": x}, {"axis": axis})
    want = from_paddle(_c("squeeze")(to_paddle(x), axis))
    np.testing.assert_array_equal(got["grad_out_grad"], want)
    assert got["xshape"].shape == x.shape                 # xshape carries x's shape (3.3.1)


UNSQUEEZE_AXES = [[0], [-1], [1, 1], [0, -1], [2, 0, -2], [0, 3], [-1, -1], []]


@pytest.mark.parametrize("axis", UNSQUEEZE_AXES)
def test_unsqueeze_double_grad_is_unsqueeze(axis):
    x = _n(2, 3)
    got = tvmgrad.run("unsqueeze_double_grad", {"grad_x_grad": x}, {"axis": axis})
    want = from_paddle(_c("unsqueeze")(to_paddle(x), axis))
    assert got["grad_out_grad"].shape == want.shape
    np.testing.assert_array_equal(got["grad_out_grad"], want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_squeeze_unsqueeze_double_grads_dtypes(dtype):
    x = cast(_n(2, 1, 3), dtype)
    a = tvmgrad.run("squeeze_double_grad", {"grad_x_grad": x}, {"axis": [1]})["grad_out_grad"]
    b = tvmgrad.run("unsqueeze_double_grad", {"grad_x_grad": x}, {"axis": [0]})["grad_out_grad"]
    assert a.dtype == b.dtype == np_dtype(dtype)
    np.testing.assert_array_equal(a, x.reshape(2, 3))
    np.testing.assert_array_equal(b, x.reshape(1, 2, 1, 3))


def test_squeeze_unsqueeze_adjoint():
    x, y = _n(2, 1, 3), _n(2, 3, seed=1)
    assert_adjoint(lambda v: tvmgrad.run("squeeze", {"x": v}, {"axis": [1]})["out"],
                   lambda w: _grad("squeeze_grad", {"xshape": x, "out_grad": w}, {"axis": [1]}, "x_grad"),
                   x, y)
    assert_adjoint(lambda v: tvmgrad.run("unsqueeze", {"x": v}, {"axis": [1]})["out"],
                   lambda w: _grad("unsqueeze_grad", {"xshape": y, "out_grad": w}, {"axis": [1]}, "x_grad"),
                   y, x)


def test_reshape_errors():
    with pytest.raises(ValueError, match=r"squeeze_grad: out_grad of shape \[2, 4\] \(8 elements\) cannot "
                                         r"be reshaped to the shape of xshape \[2, 1, 3\]"):
        tvmgrad.run("squeeze_grad", {"xshape": _n(2, 1, 3), "out_grad": _n(2, 4)}, {"axis": [1]})
    with pytest.raises(ValueError, match=r"view_shape_grad: out_grad of shape \[5\] cannot be viewed"):
        tvmgrad.run("view_shape_grad", {"input": _n(2, 3), "out_grad": _n(5)}, {"dims": [5]})
    with pytest.raises(TypeError, match=r"view_shape_grad: out_grad has dtype float32 but input has float64"):
        tvmgrad.run("view_shape_grad", {"input": _n(2, 3), "out_grad": _n(6).astype("float32")}, {"dims": [6]})
    with pytest.raises(ValueError, match=r"(unsqueeze_double_grad|unsqueeze): attribute 'axis' = \[4\]: "
                                         r"axis 4 is out of range"):
        tvmgrad.run("unsqueeze_double_grad", {"grad_x_grad": _n(2, 3)}, {"axis": [4]})
    with pytest.raises(ValueError, match=r"(squeeze_double_grad|squeeze): attribute 'axis' = 3 is out of range"):
        tvmgrad.run("squeeze_double_grad", {"grad_x_grad": _n(2, 3)}, {"axis": [3]})
    with pytest.raises((TypeError, ValueError), match=r"flatten_grad: input '(out_grad' has dtype int64|xshape' "
                                                      r"has dtype float64 but 'out_grad' has int64)"):
        tvmgrad.run("flatten_grad", {"xshape": _n(6), "out_grad": np.arange(6)})


# ------------------------------------------------------------------------------------------
# view_dtype_grad: bit reinterpretation

VIEW_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128", "bool", "int8",
               "uint8", "int16", "int32", "int64")
# (input dtype, viewed as): every dtype on both sides and every element-size ratio (1:16 .. 16:1)
VIEWS = [("float32", "float16"), ("float16", "float32"), ("float64", "float16"), ("float16", "bfloat16"),
         ("float32", "float64"), ("bfloat16", "float64"), ("float64", "float64"), ("float32", "int32"),
         ("int32", "float32"), ("float32", "uint8"), ("uint8", "float32"), ("float32", "int8"),
         ("float64", "int16"), ("int16", "float64"), ("int64", "float16"), ("float16", "int64"),
         ("bfloat16", "int8"), ("complex64", "float32"), ("float32", "complex64"), ("complex128", "float64"),
         ("complex64", "int64"), ("int8", "complex128"), ("complex128", "bool"), ("bool", "uint8"),
         ("uint8", "bool"), ("bool", "float32"), ("float64", "bool"), ("int64", "int32"), ("int8", "uint8")]


def _bytes_as(shape, dtype, seed=0):
    """An array of ``dtype`` holding random bytes (0/1 bytes for bool, finite floats)."""
    dt = np_dtype(dtype)
    r = rng(seed)
    if dtype == "bool":
        return r.integers(0, 2, shape).astype(bool)
    raw = r.integers(0, 256, math.prod(shape) * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)
    if dt.kind in "fc" or dtype == "bfloat16":
        raw = np.where(np.isfinite(raw.astype(np.complex128 if dt.kind == "c" else np.float64)), raw, 0).astype(dt)
    return raw


def _view_case(src, dst, shape=(2, 3, 16)):
    """input of dtype ``src``; out_grad: what a view of it as ``dst`` has (its bytes random, 0/1
    bytes where input_grad is bool, as a bool holds)."""
    x = _bytes_as(shape, src)
    gshape = x.view(np_dtype(dst)).shape
    if src == "bool" and dst != "bool":
        g = _bytes_as(x.shape, "bool", 1).view(np_dtype(dst))
    else:
        g = _bytes_as(gshape, dst, 1)
    return x, g


@pytest.mark.parametrize("src,dst", VIEWS)
def test_view_dtype_grad_reinterprets_bits(src, dst):
    """input (dtype ``src``) was viewed as ``dst``: its grad is out_grad's bytes viewed back, for
    every pair of dtypes (Paddle registers view_dtype_grad for all; the last dim scales by the
    element-size ratio); bit-exact against numpy's view and Paddle's kernel. Paddle 3.3.1 first
    casts input to a complex out_grad's dtype (its data transform), so with a complex out_grad
    and another input dtype it returns out_grad unchanged (a real input) or fails (int8,
    complex128 -> complex64): the reference there is numpy's view alone."""
    x, g = _view_case(src, dst)
    got = tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": g}, {"dtype": dst})["input_grad"]
    assert got.dtype == np_dtype(src) and got.shape == x.shape
    assert got.tobytes() == np.ascontiguousarray(g).tobytes()
    if dst.startswith("complex") and src != dst:
        return
    want = _c("view_dtype_grad")(to_paddle(x), to_paddle(g), to_paddle(g).dtype)
    want = want.view("uint16").numpy() if src == "bfloat16" else want.numpy()
    assert want.shape == x.shape and want.tobytes() == got.tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("src", VIEW_DTYPES)
@pytest.mark.parametrize("dst", VIEW_DTYPES)
def test_view_dtype_grad_every_pair(src, dst):
    x, g = _view_case(src, dst)
    got = tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": g}, {"dtype": dst})["input_grad"]
    assert got.dtype == np_dtype(src) and got.tobytes() == np.ascontiguousarray(g).tobytes()


def test_view_dtype_grad_bool_output_is_canonical():
    """A bool input_grad holds byte != 0: a TVM bool is 0 or 1 (Paddle keeps other bytes as they
    are, which numpy reads as True too)."""
    x = np.zeros((2, 4), bool)
    g = np.array([[0, 1, 2, 255], [7, 0, 0, 128]], np.uint8)
    got = tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": g}, {"dtype": "uint8"})["input_grad"]
    np.testing.assert_array_equal(got.view(np.uint8), (g != 0).astype(np.uint8))


def test_view_dtype_grad_empty_and_0d():
    for src, dst, shape in (("float32", "float16", (2, 0)), ("float16", "float32", (0, 4)),
                            ("int32", "float32", (0,)), ("complex64", "int8", (3, 0))):
        x = np.zeros(shape, np_dtype(src))
        g = np.zeros(x.view(np_dtype(dst)).shape, np_dtype(dst))
        got = tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": g}, {"dtype": dst})["input_grad"]
        assert got.shape == shape and got.dtype == np_dtype(src)
    x, g = np.float32(1.5), np.float32(1.5).view(np.int32)
    got = tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": g}, {"dtype": "int32"})["input_grad"]
    assert got.shape == () and got == np.float32(1.5)
    with pytest.raises(ValueError, match=r"view_dtype_grad: out_grad has shape \[\]; input of shape \[\] "
                                         r"\(float32\) viewed as float16 has shape none \(a 0-d tensor"):
        tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": np.float16(1)}, {"dtype": "float16"})


def test_view_dtype_grad_same_dtype_aliases():
    g = _n(2, 3)
    got = tvmgrad.run("view_dtype_grad", {"input": _n(2, 3), "out_grad": g}, {"dtype": "float64"}, alias=True)
    assert np.shares_memory(got["input_grad"], g)


def test_view_dtype_grad_ignores_dtype_attribute_like_paddle():
    x, g = _n(2, 3).astype("float32"), _n(2, 6).astype("float16")
    a = tvmgrad.run("view_dtype_grad", {"input": x, "out_grad": g}, {"dtype": "float64"})["input_grad"]
    b = from_paddle(_c("view_dtype_grad")(to_paddle(x), to_paddle(g), "float64"))
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_view_dtype_grad_errors():
    with pytest.raises(ValueError, match=r"view_dtype_grad: out_grad has shape \[2, 5\]"):
        tvmgrad.run("view_dtype_grad", {"input": _n(2, 3).astype("float32"),
                                        "out_grad": _n(2, 5).astype("float16")}, {"dtype": "float16"})
    with pytest.raises(ValueError, match=r"view_dtype_grad: .*its last dim does not divide"):
        tvmgrad.run("view_dtype_grad", {"input": _n(2, 3).astype("float16"),
                                        "out_grad": _n(2, 1).astype("float32")}, {"dtype": "float32"})
    with pytest.raises(ValueError, match=r"view_dtype_grad: out_grad has shape \[2, 3\]; input of shape "
                                         r"\[2, 3\] \(int64\) viewed as float32 has shape \[2, 6\]"):
        tvmgrad.run("view_dtype_grad", {"input": np.zeros((2, 3), np.int64),
                                        "out_grad": _n(2, 3).astype("float32")}, {"dtype": "float32"})


# ------------------------------------------------------------------------------------------
# flip / reverse / roll

FLIPS = [((3, 4, 5), [0, 2]), ((3, 4, 5), [-1]), ((2, 1, 3), [0, 1, 2]), ((4,), []), ((), []),
         ((2, 0, 3), [1])]


@pytest.mark.parametrize("dtype", FLOATS)
def test_flip_reverse_dtypes(dtype):
    g = _n(3, 4, 5)
    check("flip_grad", {"out_grad": g}, {"axis": [0, -1]}, dtype)
    check("reverse_grad", {"out_grad": g}, {"axis": [1]}, dtype)


@pytest.mark.parametrize("shape,axis", FLIPS)
def test_flip_shapes_and_adjoint(shape, axis):
    g = _n(*shape)
    got = check("flip_grad", {"out_grad": g}, {"axis": axis}, "float64")["x_grad"]
    np.testing.assert_array_equal(got, np.flip(g, axis=tuple(axis)) if axis else g)
    x = _n(*shape, seed=3)
    assert_adjoint(lambda v: tvmgrad.run("flip", {"x": v}, {"axis": axis})["out"],
                   lambda w: _grad("flip_grad", {"out_grad": w}, {"axis": axis}, "x_grad"), x, g)


def test_reverse_repeated_axis_reverses_once_like_paddle():
    g = _n(3, 4)
    got = check("reverse_grad", {"out_grad": g}, {"axis": [0, 0, -2]}, "float64")["x_grad"]
    np.testing.assert_array_equal(got, g[::-1])
    assert_adjoint(lambda v: tvmgrad.run("reverse", {"x": v}, {"axis": [1]})["out"],
                   lambda w: _grad("reverse_grad", {"out_grad": w}, {"axis": [1]}, "x_grad"), _n(3, 4, seed=2), g)


def test_flip_reverse_errors():
    with pytest.raises(ValueError, match=r"(flip_grad|flip): attribute 'axis' = \[0, 0\] has duplicate"):
        tvmgrad.run("flip_grad", {"out_grad": _n(2, 3)}, {"axis": [0, 0]})
    with pytest.raises(ValueError, match=r"(flip_grad|flip): attribute 'axis' = 2 is out of range"):
        tvmgrad.run("flip_grad", {"out_grad": _n(2, 3)}, {"axis": [2]})
    with pytest.raises(ValueError, match=r"(reverse_grad|reverse): attribute 'axis' can not be empty"):
        tvmgrad.run("reverse_grad", {"out_grad": _n(2, 3)}, {"axis": []})


ROLLS = [((3, 4, 5), [1, -2], [0, 2]), ((3, 4, 5), [7], []), ((6,), [-13], [0]), ((2, 3), [2, 1], [1, 1]),
         ((4, 3), [0], [0]), ((2, 0, 3), [1], [1]), ((3, 4), [5], [-1])]


@pytest.mark.parametrize("dtype", FLOATS)
def test_roll_grad_dtypes(dtype):
    check("roll_grad", {"x": _n(3, 4, 5), "out_grad": _n(3, 4, 5, seed=1)}, {"shifts": [1, -2], "axis": [0, 2]}, dtype)


@pytest.mark.parametrize("shape,shifts,axis", ROLLS)
def test_roll_grad_shapes_and_adjoint(shape, shifts, axis):
    x, g = _n(*shape), _n(*shape, seed=1)
    attrs = {"shifts": shifts, "axis": axis}
    if math.prod(shape):
        check("roll_grad", {"x": x, "out_grad": g}, attrs, "float64")
    roll = (lambda v: np.roll(v, shifts[0])) if not axis else (lambda v: np.roll(v, shifts, axis))
    assert_adjoint(roll, lambda w: _grad("roll_grad", {"x": x, "out_grad": w}, attrs, "x_grad"), x, g)


def test_roll_grad_errors():
    x = _n(3, 4)
    with pytest.raises(ValueError, match=r"roll_grad: attributes 'shifts' = \[1\] and 'axis' = \[0, 1\]"):
        tvmgrad.run("roll_grad", {"x": x, "out_grad": x}, {"shifts": [1], "axis": [0, 1]})
    with pytest.raises(ValueError, match=r"roll_grad: attribute 'shifts' = \[1, 2\] must have one element"):
        tvmgrad.run("roll_grad", {"x": x, "out_grad": x}, {"shifts": [1, 2], "axis": []})
    with pytest.raises(ValueError, match=r"roll_grad: attribute 'axis' = 2 is out of range"):
        tvmgrad.run("roll_grad", {"x": x, "out_grad": x}, {"shifts": [1], "axis": [2]})
    with pytest.raises(ValueError, match=r"roll_grad: out_grad has shape \[4, 3\] but x has \[3, 4\]"):
        tvmgrad.run("roll_grad", {"x": x, "out_grad": x.T}, {"shifts": [1], "axis": [0]})


# ------------------------------------------------------------------------------------------
# crop / pad3d

@pytest.mark.parametrize("dtype", FLOATS)
def test_crop_grad_dtypes(dtype):
    check("crop_grad", {"x": _n(4, 5, 6), "out_grad": _n(2, 3, 4, seed=1)}, {"offsets": [1, 0, 2]}, dtype)


@pytest.mark.parametrize("xs,gs,offsets", [((4, 6), (4, 6), [0, 0]), ((5,), (0,), [5]), ((3, 1, 4), (1, 1, 2), [2, 0, 2])])
def test_crop_grad_shapes_and_adjoint(xs, gs, offsets):
    x, g = _n(*xs), _n(*gs, seed=1)
    check("crop_grad", {"x": x, "out_grad": g}, {"offsets": offsets}, "float64")
    box = tuple(slice(o, o + n) for o, n in zip(offsets, gs))
    assert_adjoint(lambda v: v[box], lambda w: _grad("crop_grad", {"x": x, "out_grad": w},
                                                     {"offsets": offsets}, "x_grad"), x, g)


def test_crop_grad_errors():
    with pytest.raises(ValueError, match=r"crop_grad: attribute 'offsets' = \[3, 0\]: out_grad of shape \[2, 2\] "
                                         r"at offset 3 does not fit x's dim 0 of size 4"):
        tvmgrad.run("crop_grad", {"x": _n(4, 4), "out_grad": _n(2, 2)}, {"offsets": [3, 0]})
    with pytest.raises(ValueError, match=r"crop_grad: attribute 'offsets' = \[1\] must have one entry per dim"):
        tvmgrad.run("crop_grad", {"x": _n(4, 4), "out_grad": _n(2, 2)}, {"offsets": [1]})
    with pytest.raises(ValueError, match=r"crop_grad: out_grad has rank 1 but x has rank 2"):
        tvmgrad.run("crop_grad", {"x": _n(4, 4), "out_grad": _n(2)}, {"offsets": [1, 1]})


PADS = [("constant", "NCDHW", [1, 2, 0, 3, 2, 1]), ("reflect", "NCDHW", [1, 2, 0, 2, 2, 1]),
        ("replicate", "NDHWC", [2, 1, 3, 0, 1, 2]), ("circular", "NCDHW", [1, 2, 3, 1, 2, 1]),
        ("circular", "NDHWC", [5, 4, 0, 0, 1, 0]), ("reflect", "NDHWC", [2, 2, 1, 1, 0, 0]),
        ("replicate", "NCDHW", [0, 0, 0, 0, 0, 0]), ("constant", "NDHWC", [0, 0, 2, 0, 0, 1])]


def _np_pad(x, pads, mode, data_format, value=0.0):
    pw = [(pads[4], pads[5]), (pads[2], pads[3]), (pads[0], pads[1])]
    pw = [(0, 0), (0, 0)] + pw if data_format == "NCDHW" else [(0, 0)] + pw + [(0, 0)]
    kw = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x, pw, {"constant": "constant", "reflect": "reflect", "replicate": "edge",
                          "circular": "wrap"}[mode], **kw)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.sweep
def test_pad3d_grads_dtypes(mode, dtype):
    x = _n(2, 3, 3, 4, 5)
    attrs = {"paddings": [1, 2, 2, 1, 1, 2], "mode": mode, "pad_value": 0.0, "data_format": "NCDHW"}
    g = _n(*_np_pad(x, attrs["paddings"], mode, "NCDHW").shape, seed=1)
    check("pad3d_grad", {"x": x, "out_grad": g}, attrs, dtype)
    check("pad3d_double_grad", {"grad_x_grad": x}, {**attrs, "pad_value": 0.3}, dtype,
          oracle=lambda i, a: {"grad_out_grad": from_paddle(_c("pad3d")(
              to_paddle(i["grad_x_grad"]), a["paddings"], a["mode"], a["pad_value"], a["data_format"]))})


@pytest.mark.parametrize("mode,fmt,pads", PADS)
def test_pad3d_modes_layouts_and_adjoint(mode, fmt, pads):
    x = _n(2, 3, 4, 3, 2) if fmt == "NDHWC" else _n(2, 2, 3, 4, 3)
    attrs = {"paddings": pads, "mode": mode, "pad_value": 0.0, "data_format": fmt}
    fwd = _np_pad(x, pads, mode, fmt)
    g = _n(*fwd.shape, seed=2)
    check("pad3d_grad", {"x": x, "out_grad": g}, attrs, "float64")
    ours = tvmgrad.run("pad3d_double_grad", {"grad_x_grad": x}, attrs)["grad_out_grad"]
    np.testing.assert_array_equal(ours, fwd)
    assert_adjoint(lambda v: tvmgrad.run("pad3d_double_grad", {"grad_x_grad": v}, attrs)["grad_out_grad"],
                   lambda w: _grad("pad3d_grad", {"x": x, "out_grad": w}, attrs, "x_grad"), x, g)


@pytest.mark.parametrize("fmt,shape,pads", [
    ("NCDHW", (2, 3, 5, 6, 37), [3, 2, 2, 1, 1, 3]),     # rows of 2 vectors and a tail (W enumerated)
    ("NCDHW", (1, 2, 4, 3, 40), [17, 18, 1, 0, 0, 2]),    # W pads too wide to enumerate
    ("NDHWC", (2, 4, 5, 6, 37), [2, 1, 1, 3, 3, 0])])     # channel rows
def test_pad3d_reflect_grad_long_rows(fmt, shape, pads):
    """Reflect's mirror terms are branches on each row's position: a row with none, one or two
    mirrors in D and H, vector steps of a row and its tail all match Paddle."""
    x = _n(*shape)
    attrs = {"paddings": pads, "mode": "reflect", "pad_value": 0.0, "data_format": fmt}
    g = _n(*_np_pad(x, pads, "reflect", fmt).shape, seed=3)
    check("pad3d_grad", {"x": x, "out_grad": g}, attrs, "float32")


def test_pad3d_constant_value_keeps_double_precision_like_paddle():
    x = _n(1, 1, 1, 1, 2)
    attrs = {"paddings": [1, 0, 0, 0, 0, 0], "mode": "constant", "pad_value": 0.1, "data_format": "NCDHW"}
    got = tvmgrad.run("pad3d_double_grad", {"grad_x_grad": x}, attrs)["grad_out_grad"]
    want = from_paddle(_c("pad3d")(to_paddle(x), [1, 0, 0, 0, 0, 0], "constant", 0.1, "NCDHW"))
    np.testing.assert_array_equal(got, want)
    assert got[0, 0, 0, 0, 0] == 0.1


def test_pad3d_empty_input():
    x = np.zeros((1, 2, 0, 3, 3))
    attrs = {"paddings": [1, 1, 1, 1, 0, 0], "mode": "reflect", "pad_value": 0.0, "data_format": "NCDHW"}
    got = tvmgrad.run("pad3d_grad", {"x": x, "out_grad": np.zeros((1, 2, 0, 5, 5))}, attrs)["x_grad"]
    assert got.shape == x.shape
    got = tvmgrad.run("pad3d_double_grad", {"grad_x_grad": x}, {**attrs, "mode": "constant", "pad_value": 2.0})
    np.testing.assert_array_equal(got["grad_out_grad"], np.full((1, 2, 0, 5, 5), 2.0))


def test_pad3d_errors():
    x = _n(1, 1, 2, 3, 4)
    base = {"paddings": [1, 1, 1, 1, 1, 1], "mode": "reflect", "pad_value": 0.0, "data_format": "NCDHW"}
    with pytest.raises(ValueError, match=r"pad3d_grad: attribute 'paddings' = \[1, 1, 1, 1, 2, 1\]: reflect "
                                         r"mode needs pads smaller than the depth 2 of x"):
        tvmgrad.run("pad3d_grad", {"x": x, "out_grad": _n(1, 1, 5, 5, 6)}, {**base, "paddings": [1, 1, 1, 1, 2, 1]})
    with pytest.raises(ValueError, match=r"pad3d_grad: out_grad has shape \[1, 1, 4, 5, 5\], expected \[1, 1, 4, 5, 6\]"):
        tvmgrad.run("pad3d_grad", {"x": x, "out_grad": _n(1, 1, 4, 5, 5)}, base)
    with pytest.raises(ValueError, match=r"pad3d_grad: attribute 'mode' = 'edge' must be one of"):
        tvmgrad.run("pad3d_grad", {"x": x, "out_grad": _n(1, 1, 4, 5, 6)}, {**base, "mode": "edge"})
    with pytest.raises(ValueError, match=r"pad3d_grad: attribute 'data_format' = 'NCHW'"):
        tvmgrad.run("pad3d_grad", {"x": x, "out_grad": _n(1, 1, 4, 5, 6)}, {**base, "data_format": "NCHW"})
    with pytest.raises(ValueError, match=r"pad3d_double_grad: attribute 'paddings' = \[1, 1\] must have 6 elements"):
        tvmgrad.run("pad3d_double_grad", {"grad_x_grad": x}, {**base, "paddings": [1, 1]})
    # (the InferMeta's x is the op's grad_x_grad: errors name the op's argument)
    with pytest.raises(ValueError, match=r"pad3d_double_grad: (grad_x_grad|x) has rank 4"):
        tvmgrad.run("pad3d_double_grad", {"grad_x_grad": _n(1, 2, 3, 4)}, base)
    with pytest.raises(ValueError, match=r"pad3d_double_grad: (grad_x_grad|x) has an empty depth, which circular mode cannot pad"):
        tvmgrad.run("pad3d_double_grad", {"grad_x_grad": np.zeros((1, 1, 0, 2, 2))},
                    {**base, "mode": "circular", "paddings": [0, 0, 0, 0, 1, 0]})


# ------------------------------------------------------------------------------------------
# diag / diagonal / fill_diagonal / fill_diagonal_tensor

@pytest.mark.parametrize("dtype", FLOATS)
def test_diag_grads_dtypes(dtype):
    check("diag_grad", {"x": _n(4), "out_grad": _n(5, 5, seed=1)}, {"offset": 1}, dtype)
    check("diag_grad", {"x": _n(3, 5), "out_grad": _n(3, seed=1)}, {"offset": 2}, dtype)
    check("diagonal_grad", {"x": _n(3, 4, 5), "out_grad": _n(4, 3, seed=2)},
          {"offset": 1, "axis1": 0, "axis2": 2}, dtype)


@pytest.mark.parametrize("xs,offset", [((3,), 0), ((3,), -2), ((1,), 3), ((3, 5), -1), ((3, 5), 4),
                                       ((3, 5), -3), ((4, 2), 0), ((0,), 1)])
def test_diag_grad_offsets_and_adjoint(xs, offset):
    x = _n(*xs)
    fwd = (lambda v: np.diag(v, offset)) if len(xs) == 1 else (lambda v: np.diagonal(v, offset).copy())
    g = _n(*fwd(x).shape, seed=1)
    if math.prod(xs):
        check("diag_grad", {"x": x, "out_grad": g}, {"offset": offset}, "float64")
    assert_adjoint(fwd, lambda w: _grad("diag_grad", {"x": x, "out_grad": w}, {"offset": offset}, "x_grad"), x, g)


@pytest.mark.parametrize("xs,offset,a1,a2", [((2, 3, 4), 1, 0, 2), ((2, 3, 4), -1, -1, 1), ((3, 3), 0, 1, 0),
                                             ((2, 5, 3), -4, 1, 2), ((4, 4, 2), 2, 0, 1)])
def test_diagonal_grad_and_adjoint(xs, offset, a1, a2):
    x = _n(*xs)
    attrs = {"offset": offset, "axis1": a1, "axis2": a2}
    fwd = lambda v: np.diagonal(v, offset, a1, a2).copy()  # noqa: E731
    g = _n(*fwd(x).shape, seed=1)
    check("diagonal_grad", {"x": x, "out_grad": g}, attrs, "float64")
    assert_adjoint(fwd, lambda w: _grad("diagonal_grad", {"x": x, "out_grad": w}, attrs, "x_grad"), x, g)


def test_diag_errors():
    with pytest.raises(ValueError, match=r"diag_grad: out_grad has shape \[4, 4\], expected \[5, 5\]"):
        tvmgrad.run("diag_grad", {"x": _n(4), "out_grad": _n(4, 4)}, {"offset": 1})
    with pytest.raises(ValueError, match=r"diag_grad: x has rank 3"):
        tvmgrad.run("diag_grad", {"x": _n(2, 2, 2), "out_grad": _n(2)}, {"offset": 0})
    with pytest.raises(ValueError, match=r"diagonal_grad: attributes 'axis1' and 'axis2' name the same dim"):
        tvmgrad.run("diagonal_grad", {"x": _n(3, 3), "out_grad": _n(3)}, {"offset": 0, "axis1": 0, "axis2": -2})
    with pytest.raises(ValueError, match=r"diagonal_grad: out_grad has shape \[3\], expected \[2\]"):
        tvmgrad.run("diagonal_grad", {"x": _n(3, 3), "out_grad": _n(3)}, {"offset": 1, "axis1": 0, "axis2": 1})


@pytest.mark.parametrize("dtype", FLOATS)
def test_fill_diagonal_grads_dtypes(dtype):
    g = _n(5, 3)
    g[0, 0] = np.nan                           # a filled position: its grad is 0 whatever it was
    check("fill_diagonal_grad", {"out_grad": g}, {"value": 2.0, "offset": 0, "wrap": True}, dtype)
    check("fill_diagonal_tensor_grad", {"out_grad": _n(2, 3, 4)}, {"offset": -1, "dim1": 1, "dim2": 2}, dtype)


@pytest.mark.parametrize("shape,offset,wrap", [((5, 3), 0, True), ((5, 3), -1, False), ((3, 5), 2, True),
                                               ((7, 2), 1, True), ((3, 3, 3), 0, False), ((2, 2, 2, 2), 1, True),
                                               ((4, 4), -5, False), ((1, 6), 3, False)])
def test_fill_diagonal_grad_rules(shape, offset, wrap):
    check("fill_diagonal_grad", {"out_grad": _n(*shape)}, {"value": 0.5, "offset": offset, "wrap": wrap}, "float64")


@pytest.mark.parametrize("shape,offset,d1,d2", [((3, 4), 1, 0, 1), ((3, 4), -2, 1, 0), ((2, 3, 4), 0, 2, 0),
                                                ((2, 3, 4, 2), 1, 1, 3), ((3, 3), 5, 0, 1)])
def test_fill_diagonal_tensor_grad_dims(shape, offset, d1, d2):
    check("fill_diagonal_tensor_grad", {"out_grad": _n(*shape)}, {"offset": offset, "dim1": d1, "dim2": d2}, "float64")


def test_fill_diagonal_tensor_grad_negative_dims():
    """Paddle's kernel leaves negative dims unnormalised (3.3.1 zeroes nothing); they count from
    the end here: (-2, -1) is (1, 2) of a rank-3 tensor."""
    g = _n(2, 3, 4)
    a = tvmgrad.run("fill_diagonal_tensor_grad", {"out_grad": g}, {"offset": 1, "dim1": -2, "dim2": -1})["x_grad"]
    b = from_paddle(_c("fill_diagonal_tensor_grad")(to_paddle(g), 1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert (a == 0).sum() == 2 * 3


def test_fill_diagonal_tensor_grad_in_place():
    g = _n(3, 4)
    want = tvmgrad.run("fill_diagonal_tensor_grad", {"out_grad": g.copy()}, {"offset": 0, "dim1": 0, "dim2": 1})
    got = tvmgrad.run("fill_diagonal_tensor_grad", {"out_grad": g}, {"offset": 0, "dim1": 0, "dim2": 1}, inplace=True)
    assert got["x_grad"] is g
    np.testing.assert_array_equal(g, want["x_grad"])


def test_fill_diagonal_errors():
    with pytest.raises(ValueError, match=r"fill_diagonal_grad: out_grad has rank 1"):
        tvmgrad.run("fill_diagonal_grad", {"out_grad": _n(3)}, {"value": 0.0, "offset": 0, "wrap": False})
    with pytest.raises(ValueError, match=r"fill_diagonal_grad: out_grad of shape \[2, 3, 2\]: .* all dims equal"):
        tvmgrad.run("fill_diagonal_grad", {"out_grad": _n(2, 3, 2)}, {"value": 0.0, "offset": 0, "wrap": False})
    with pytest.raises(ValueError, match=r"fill_diagonal_tensor_grad: attributes 'dim1' = 0 and 'dim2' = -2"):
        tvmgrad.run("fill_diagonal_tensor_grad", {"out_grad": _n(3, 3)}, {"offset": 0, "dim1": 0, "dim2": -2})
    with pytest.raises(ValueError, match=r"fill_diagonal_tensor_grad: attribute 'dim2' = 2 is out of range"):
        tvmgrad.run("fill_diagonal_tensor_grad", {"out_grad": _n(3, 3)}, {"offset": 0, "dim1": 0, "dim2": 2})


# ------------------------------------------------------------------------------------------
# fold / unfold

CONV = [((2, 3, 5, 6), [2, 2], [1, 1], [0, 0, 0, 0], [1, 1]),
        ((1, 2, 7, 6), [3, 2], [2, 1], [1, 0, 2, 1], [1, 2]),
        ((2, 1, 4, 4), [1, 1], [1, 1], [1, 1, 1, 1], [1, 1]),
        ((1, 2, 9, 5), [2, 3], [3, 2], [0, 1, 0, 1], [2, 1])]


def _unfold_np(x, k, s, p, d):
    p = list(p) * 2 if len(p) == 2 else list(p)
    xp = np.pad(x, [(0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])])
    n, c, hp, wp = xp.shape
    bh = (hp - (d[0] * (k[0] - 1) + 1)) // s[0] + 1
    bw = (wp - (d[1] * (k[1] - 1) + 1)) // s[1] + 1
    out = np.zeros((n, c, k[0], k[1], bh, bw))
    for i in range(k[0]):
        for j in range(k[1]):
            out[:, :, i, j] = xp[:, :, i * d[0]: i * d[0] + s[0] * (bh - 1) + 1: s[0],
                                 j * d[1]: j * d[1] + s[1] * (bw - 1) + 1: s[1]]
    return out.reshape(n, c * k[0] * k[1], bh * bw)


def _sym(p):
    """Paddle's fold pads symmetrically by paddings[0] and paddings[1]."""
    return [p[0], p[1], p[0], p[1]]


@pytest.mark.parametrize("dtype", FLOATS)
def test_fold_unfold_grads_dtypes(dtype):
    xs, k, s, p, d = CONV[1]
    x = _n(*xs)
    attrs = {"kernel_sizes": k, "strides": s, "paddings": p, "dilations": d}
    check("unfold_grad", {"x": x, "out_grad": _n(*_unfold_np(x, k, s, p, d).shape, seed=1)}, attrs, dtype)
    cols = _unfold_np(x, k, s, _sym(p), d)
    check("fold_grad", {"x": cols, "out_grad": _n(*xs, seed=2)},
          {**attrs, "paddings": _sym(p), "output_sizes": list(xs[2:])}, dtype)


@pytest.mark.parametrize("xs,k,s,p,d", CONV)
def test_fold_unfold_against_paddle_and_adjoint(xs, k, s, p, d):
    x = _n(*xs)
    cols = _unfold_np(x, k, s, p, d)
    np.testing.assert_allclose(cols, from_paddle(_c("unfold")(to_paddle(x), k, s, p, d)), rtol=0, atol=0)
    attrs = {"kernel_sizes": k, "strides": s, "paddings": p, "dilations": d}
    y = _n(*cols.shape, seed=1)
    check("unfold_grad", {"x": x, "out_grad": y}, attrs, "float64")
    assert_adjoint(lambda v: _unfold_np(v, k, s, p, d),
                   lambda w: _grad("unfold_grad", {"x": x, "out_grad": w}, attrs, "x_grad"), x, y)
    attrs = {**attrs, "paddings": _sym(p)}
    fattrs = {**attrs, "output_sizes": list(xs[2:])}
    cols = _unfold_np(x, k, s, _sym(p), d)
    y = _n(*cols.shape, seed=1)
    check("fold_grad", {"x": cols, "out_grad": _n(*xs, seed=2)}, fattrs, "float64")
    # unfold_grad (col2im) and fold_grad (im2col) are each other's adjoints
    assert_adjoint(lambda v: _grad("fold_grad", {"x": cols, "out_grad": v}, fattrs, "x_grad"),
                   lambda w: _grad("unfold_grad", {"x": x, "out_grad": w}, attrs, "x_grad"), x, y)


def test_fold_grad_pads_like_paddle():
    """Paddle's fold (FoldInferMeta, im2col) pads symmetrically by paddings[0]/paddings[1] even
    when four values are given; fold_grad does the same (the asymmetric forward fold errors)."""
    xs, k, s, p, d = (1, 2, 7, 6), [3, 2], [2, 1], [1, 0, 2, 1], [1, 2]
    g = _n(*xs)
    cols = _unfold_np(g, k, s, _sym(p), d)
    attrs = {"kernel_sizes": k, "strides": s, "paddings": p, "dilations": d, "output_sizes": [7, 6]}
    got = check("fold_grad", {"x": np.zeros(cols.shape), "out_grad": g}, attrs, "float64")["x_grad"]
    np.testing.assert_array_equal(got, cols)


def test_fold_unfold_errors():
    attrs = {"kernel_sizes": [2, 2], "strides": [1, 1], "paddings": [0, 0, 0, 0], "dilations": [1, 1]}
    with pytest.raises(ValueError, match=r"unfold_grad: out_grad has shape \[1, 4, 8\], expected \[1, 4, 9\]"):
        tvmgrad.run("unfold_grad", {"x": _n(1, 1, 4, 4), "out_grad": _n(1, 4, 8)}, attrs)
    with pytest.raises(ValueError, match=r"unfold_grad: attribute 'strides' = \[0, 1\] must be 2 positive ints"):
        tvmgrad.run("unfold_grad", {"x": _n(1, 1, 4, 4), "out_grad": _n(1, 4, 9)}, {**attrs, "strides": [0, 1]})
    with pytest.raises(ValueError, match=r"unfold_grad: the kernel .* does not fit the padded input"):
        tvmgrad.run("unfold_grad", {"x": _n(1, 1, 1, 4), "out_grad": _n(1, 4, 9)}, attrs)
    with pytest.raises(ValueError, match=r"fold_grad: x of shape \[1, 4, 8\] does not match kernel_sizes"):
        tvmgrad.run("fold_grad", {"x": _n(1, 4, 8), "out_grad": _n(1, 1, 4, 4)}, {**attrs, "output_sizes": [4, 4]})
    with pytest.raises(ValueError, match=r"fold_grad: attribute 'paddings' = \[1, 1\] must be 4"):
        tvmgrad.run("fold_grad", {"x": _n(1, 4, 9), "out_grad": _n(1, 1, 4, 4)},
                    {**attrs, "paddings": [1, 1], "output_sizes": [4, 4]})


# ------------------------------------------------------------------------------------------
# frame / tensor_unfold (overlap-add)

@pytest.mark.parametrize("dtype", FLOATS)
def test_frame_grad_dtypes(dtype):
    check("frame_grad", {"x": _n(2, 10), "out_grad": _n(2, 4, 3, seed=1)},
          {"frame_length": 4, "hop_length": 3, "axis": -1}, dtype)
    check("frame_grad", {"x": _n(9, 2), "out_grad": _n(4, 3, 2, seed=1)},
          {"frame_length": 3, "hop_length": 2, "axis": 0}, dtype)


@pytest.mark.parametrize("xs,length,hop,axis", [((10,), 4, 3, -1), ((2, 3, 11), 5, 1, -1), ((7, 2), 7, 4, 0),
                                                ((12,), 3, 5, 0), ((8, 1, 2), 2, 2, 0)])
def test_frame_grad_and_adjoint(xs, length, hop, axis):
    x = _n(*xs)
    attrs = {"frame_length": length, "hop_length": hop, "axis": axis}
    fwd = lambda v: from_paddle(_c("frame")(to_paddle(v), length, hop, axis))  # noqa: E731
    g = _n(*fwd(x).shape, seed=1)
    check("frame_grad", {"x": x, "out_grad": g}, attrs, "float64")
    assert_adjoint(fwd, lambda w: _grad("frame_grad", {"x": x, "out_grad": w}, attrs, "x_grad"), x, g)


def _tensor_unfold_np(x, axis, size, step):
    n = x.shape[axis]
    frames = [np.take(x, range(f * step, f * step + size), axis=axis) for f in range((n - size) // step + 1)]
    return np.moveaxis(np.stack(frames, axis=axis), axis + 1, -1)


@pytest.mark.parametrize("dtype", FLOATS)
def test_tensor_unfold_grad_dtypes(dtype):
    check("tensor_unfold_grad", {"input": _n(3, 9), "out_grad": _n(3, 3, 3, seed=1)},
          {"axis": 1, "size": 3, "step": 3}, dtype)


@pytest.mark.parametrize("xs,axis,size,step", [((9,), 0, 3, 3), ((3, 10, 2), 1, 2, 4), ((4, 5), -2, 1, 1),
                                               ((7,), 0, 3, 2), ((2, 8), -1, 4, 1), ((6, 3), 0, 6, 1)])
def test_tensor_unfold_grad_and_adjoint(xs, axis, size, step):
    x = _n(*xs)
    attrs = {"axis": axis, "size": size, "step": step}
    fwd = from_paddle(_c("tensor_unfold")(to_paddle(x), axis, size, step))
    np.testing.assert_array_equal(fwd, _tensor_unfold_np(x, axis % len(xs), size, step))
    g = _n(*fwd.shape, seed=1)
    if step >= size or (xs[axis] - size) // step == 0:     # no overlap: Paddle's grad is right
        check("tensor_unfold_grad", {"input": x, "out_grad": g}, attrs, "float64")
    else:                                  # overlap: Paddle's last-write-wins copy is not the gradient
        ours = _grad("tensor_unfold_grad", {"input": x, "out_grad": g}, attrs, "input_grad")
        theirs = from_paddle(_c("tensor_unfold_grad")(to_paddle(x), to_paddle(g), axis, size, step))
        assert not np.allclose(ours, theirs)
    assert_adjoint(lambda v: _tensor_unfold_np(v, axis % len(xs), size, step),
                   lambda w: _grad("tensor_unfold_grad", {"input": x, "out_grad": w}, attrs, "input_grad"), x, g)


def test_frame_unfold_errors():
    with pytest.raises(ValueError, match=r"frame_grad: attribute 'frame_length' = 11 must be in \[1, 10\]"):
        tvmgrad.run("frame_grad", {"x": _n(10), "out_grad": _n(11, 1)}, {"frame_length": 11, "hop_length": 1, "axis": -1})
    with pytest.raises(ValueError, match=r"frame_grad: attribute 'axis' = 1 must be 0 or -1"):
        tvmgrad.run("frame_grad", {"x": _n(10), "out_grad": _n(4, 3)}, {"frame_length": 4, "hop_length": 3, "axis": 1})
    with pytest.raises(ValueError, match=r"frame_grad: out_grad has shape \[3, 4\], expected \[4, 3\]"):
        tvmgrad.run("frame_grad", {"x": _n(10), "out_grad": _n(3, 4)}, {"frame_length": 4, "hop_length": 3, "axis": -1})
    with pytest.raises(ValueError, match=r"tensor_unfold_grad: attribute 'step' = 0 must be positive"):
        tvmgrad.run("tensor_unfold_grad", {"input": _n(5), "out_grad": _n(2, 2)}, {"axis": 0, "size": 2, "step": 0})
    with pytest.raises(ValueError, match=r"tensor_unfold_grad: attribute 'axis' = 1 is out of range"):
        tvmgrad.run("tensor_unfold_grad", {"input": _n(5), "out_grad": _n(2, 2)}, {"axis": 1, "size": 2, "step": 2})


# ------------------------------------------------------------------------------------------
# as_strided

def _as_strided_np(x, dims, stride, offset_elems):
    flat = np.ascontiguousarray(x).reshape(-1)
    idx = offset_elems + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(dims))]) * s
                             for d, (n, s) in enumerate(zip(dims, stride)))
    return flat[idx] if dims else flat[offset_elems]


def _as_strided_grad_np(size, g, dims, stride, offset_elems):
    out = np.zeros(size)
    if g.size:
        idx = offset_elems + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(dims))]) * s
                                 for d, (n, s) in enumerate(zip(dims, stride)))
        np.add.at(out, np.broadcast_to(idx, g.shape).reshape(-1), g.astype(np.float64).reshape(-1))
    return out


STRIDED = [((12,), [3, 4], [4, 1], 0, False), ((12,), [2, 3], [1, 4], 1, False),     # transpose-like
           ((3, 4), [2, 2], [4, 2], 1, False), ((20,), [2, 3, 2], [5, 1, 10], 0, False),
           ((6,), [3, 3], [1, 1], 0, True), ((10,), [4, 4], [2, 1], 0, True),        # sliding windows
           ((5,), [3, 2], [0, 2], 0, True), ((4,), [], [], 3, False),                  # broadcast; scalar
           ((6,), [0, 3], [1, 1], 0, False)]


@pytest.mark.parametrize("xs,dims,stride,off,overlap", STRIDED)
def test_as_strided_grad(xs, dims, stride, off, overlap):
    x = _n(*xs)
    g = _n(*dims, seed=1)
    attrs = {"dims": dims, "stride": stride, "offset": off * 8}          # offset in bytes (float64)
    got = _grad("as_strided_grad", {"input": x, "out_grad": g}, attrs, "input_grad")
    np.testing.assert_allclose(got.reshape(-1), _as_strided_grad_np(x.size, g, dims, stride, off),
                               rtol=1e-14, atol=1e-14)
    theirs = from_paddle(_c("as_strided_grad")(to_paddle(x), to_paddle(g), dims, stride, off * 8))
    if overlap:                      # Paddle copies into the view: the last write wins
        assert not np.allclose(got, theirs)
    elif g.size:
        np.testing.assert_array_equal(got, theirs)
    assert_adjoint(lambda v: _as_strided_np(v, dims, stride, off),
                   lambda w: _grad("as_strided_grad", {"input": x, "out_grad": w}, attrs, "input_grad"), x, g)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("overlap", [False, True])
def test_as_strided_grad_dtypes(dtype, overlap):
    x = cast(_n(12), dtype)
    dims, stride = ([3, 2], [4, 1]) if not overlap else ([3, 4], [2, 1])
    g = cast(_n(*dims, seed=1), dtype)
    item = x.dtype.itemsize
    got = _grad("as_strided_grad", {"input": x, "out_grad": g}, {"dims": dims, "stride": stride, "offset": 2 * item},
                "input_grad")
    assert got.dtype == x.dtype
    want = cast(_as_strided_grad_np(12, g, dims, stride, 2), dtype)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


def test_as_strided_errors():
    x = _n(6)
    with pytest.raises(ValueError, match=r"as_strided_grad: attribute 'offset' = 4 is in bytes \(as Paddle's\) "
                                         r"and must be a non-negative multiple of the element size 8"):
        tvmgrad.run("as_strided_grad", {"input": x, "out_grad": _n(2)}, {"dims": [2], "stride": [1], "offset": 4})
    with pytest.raises(ValueError, match=r"as_strided_grad: the view .* reaches past input's 6 elements"):
        tvmgrad.run("as_strided_grad", {"input": x, "out_grad": _n(2, 3)}, {"dims": [2, 3], "stride": [3, 2], "offset": 0})
    with pytest.raises(ValueError, match=r"as_strided_grad: attribute 'dims' = \[3\] must equal out_grad's shape \[2\]"):
        tvmgrad.run("as_strided_grad", {"input": x, "out_grad": _n(2)}, {"dims": [3], "stride": [1], "offset": 0})
    with pytest.raises(ValueError, match=r"as_strided_grad: attribute 'stride' = \[-1\] must be >= 0"):
        tvmgrad.run("as_strided_grad", {"input": x, "out_grad": _n(2)}, {"dims": [2], "stride": [-1], "offset": 8})


@pytest.mark.parametrize("op,inputs,attrs,shape_input", [
    ("as_strided_grad", {"input": _n(6), "out_grad": _n(2)}, {"dims": [2], "stride": [1], "offset": 8}, "input"),
    ("frame_grad", {"x": _n(10), "out_grad": _n(4, 3)}, {"frame_length": 4, "hop_length": 3, "axis": -1}, "x"),
    ("tensor_unfold_grad", {"input": _n(5), "out_grad": _n(2, 2)}, {"axis": 0, "size": 2, "step": 2}, "input"),
    ("crop_grad", {"x": _n(4, 5), "out_grad": _n(2, 3)}, {"offsets": [1, 2]}, "x"),
])
def test_shape_only_input_dtype_is_checked(op, inputs, attrs, shape_input):
    """The grad has the dtype of the input whose shape it takes: a different out_grad dtype is a
    TypeError naming both before any build (not TVM's argument check after it)."""
    tvmgrad.run(op, inputs, attrs)
    for changed in (shape_input, "out_grad"):
        bad = {**inputs, changed: inputs[changed].astype(np.float32)}
        with pytest.raises(TypeError, match=rf"{op}: input 'out_grad' has dtype float\d+ but '{shape_input}' "
                                            rf"has float\d+; they must match"):
            tvmgrad.prepare(op, bad, attrs)


# ------------------------------------------------------------------------------------------
# pixel_shuffle / pixel_unshuffle / temporal_shift

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_pixel_shuffle_grads(fmt, dtype):
    shape = (2, 3, 4, 6) if fmt == "NCHW" else (2, 4, 6, 3)
    check("pixel_shuffle_grad", {"out_grad": _n(*shape)}, {"upscale_factor": 2, "data_format": fmt}, dtype)
    shape = (2, 12, 2, 3) if fmt == "NCHW" else (2, 2, 3, 12)
    check("pixel_unshuffle_grad", {"out_grad": _n(*shape)}, {"downscale_factor": 2, "data_format": fmt}, dtype)


@pytest.mark.parametrize("r", [1, 3])
def test_pixel_shuffle_factors_and_adjoint(r):
    x = _n(2, 2 * r * r, 2, 3)
    attrs = {"upscale_factor": r, "data_format": "NCHW"}
    fwd = lambda v: from_paddle(_c("pixel_shuffle")(to_paddle(v), r, "NCHW"))  # noqa: E731
    g = _n(*fwd(x).shape, seed=1)
    check("pixel_shuffle_grad", {"out_grad": g}, attrs, "float64")
    assert_adjoint(fwd, lambda w: _grad("pixel_shuffle_grad", {"out_grad": w}, attrs, "x_grad"), x, g)
    ua = {"downscale_factor": r, "data_format": "NHWC"}
    y = _n(2, 2 * r, 3 * r, 2)
    ufwd = lambda v: from_paddle(_c("pixel_unshuffle")(to_paddle(v), r, "NHWC"))  # noqa: E731
    gy = _n(*ufwd(y).shape, seed=2)
    check("pixel_unshuffle_grad", {"out_grad": gy}, ua, "float64")
    assert_adjoint(ufwd, lambda w: _grad("pixel_unshuffle_grad", {"out_grad": w}, ua, "x_grad"), y, gy)


def test_pixel_shuffle_errors():
    with pytest.raises(ValueError, match=r"pixel_shuffle_grad: out_grad of shape \[1, 1, 3, 4\]: height and "
                                         r"width must be divisible by upscale_factor 2"):
        tvmgrad.run("pixel_shuffle_grad", {"out_grad": _n(1, 1, 3, 4)}, {"upscale_factor": 2, "data_format": "NCHW"})
    with pytest.raises(ValueError, match=r"pixel_unshuffle_grad: out_grad of shape \[1, 6, 2, 2\]: its channels"):
        tvmgrad.run("pixel_unshuffle_grad", {"out_grad": _n(1, 6, 2, 2)}, {"downscale_factor": 2, "data_format": "NCHW"})
    with pytest.raises(ValueError, match=r"pixel_shuffle_grad: out_grad has rank 3"):
        tvmgrad.run("pixel_shuffle_grad", {"out_grad": _n(1, 4, 4)}, {"upscale_factor": 2, "data_format": "NCHW"})
    with pytest.raises(ValueError, match=r"pixel_shuffle_grad: attribute 'data_format' = 'CHW'"):
        tvmgrad.run("pixel_shuffle_grad", {"out_grad": _n(1, 1, 4, 4)}, {"upscale_factor": 2, "data_format": "CHW"})
    with pytest.raises(ValueError, match=r"pixel_shuffle_grad: the factor \(0\) must be positive"):
        tvmgrad.run("pixel_shuffle_grad", {"out_grad": _n(1, 1, 4, 4)}, {"upscale_factor": 0, "data_format": "NCHW"})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_temporal_shift_grad(fmt, dtype):
    shape = (6, 8, 2, 3) if fmt == "NCHW" else (6, 2, 3, 8)
    check("temporal_shift_grad", {"out_grad": _n(*shape)}, {"seg_num": 3, "shift_ratio": 0.25, "data_format": fmt}, dtype)


@pytest.mark.parametrize("seg,ratio,c", [(2, 0.3, 7), (1, 0.25, 4), (4, 0.1, 10), (2, 0.49, 5)])
def test_temporal_shift_ratios_and_adjoint(seg, ratio, c):
    x = _n(2 * seg, c, 2, 2)
    attrs = {"seg_num": seg, "shift_ratio": ratio, "data_format": "NCHW"}
    fwd = lambda v: from_paddle(_c("temporal_shift")(to_paddle(v), seg, ratio, "NCHW"))  # noqa: E731
    g = _n(*x.shape, seed=1)
    check("temporal_shift_grad", {"out_grad": g}, attrs, "float64")
    assert_adjoint(fwd, lambda w: _grad("temporal_shift_grad", {"out_grad": w}, attrs, "x_grad"), x, g)


def test_temporal_shift_errors():
    with pytest.raises(ValueError, match=r"temporal_shift_grad: attribute 'seg_num' = 4 must be positive and divide"):
        tvmgrad.run("temporal_shift_grad", {"out_grad": _n(6, 2, 1, 1)}, {"seg_num": 4, "shift_ratio": 0.25, "data_format": "NCHW"})
    with pytest.raises(ValueError, match=r"temporal_shift_grad: out_grad has rank 3"):
        tvmgrad.run("temporal_shift_grad", {"out_grad": _n(6, 2, 1)}, {"seg_num": 2, "shift_ratio": 0.25, "data_format": "NCHW"})
    for ratio in (0.7, -0.1):
        with pytest.raises(ValueError, match=r"temporal_shift_grad: attribute 'shift_ratio' = .* must be in \[0, 0.5\]"):
            tvmgrad.run("temporal_shift_grad", {"out_grad": _n(6, 2, 1, 1)},
                        {"seg_num": 2, "shift_ratio": ratio, "data_format": "NCHW"})


# ------------------------------------------------------------------------------------------
# Complex, integer and bool data: every such dtype Paddle registers for the op (CPU or GPU; see
# tests/test_paddle_dtypes.py). The references are Paddle's CPU kernel in that dtype where it has
# one and numpy's same math (often both: they must agree); complex values have nonzero imaginary
# parts, integer sums wrap as Paddle's and numpy's, a sum of bools is their OR.



def _paddle_table():
    import json
    import pathlib
    return json.loads((pathlib.Path(tvmgrad.__file__).parent / "paddle_dtypes.json").read_text())["ops"]


def _gathered(shape, dtype, index_map, g):
    """The adjoint of y = x.flat[index_map] (index_map < 0: not from x): x_grad.flat[i] = Σ g
    where index_map == i, in dtype (np.add.at: integers wrap, bools OR)."""
    out = np.zeros(math.prod(shape), dtype)
    keep = index_map >= 0
    np.add.at(out, index_map[keep], np.asarray(g)[keep])
    return out.reshape(shape)


def _flat_index(shape):
    return np.arange(math.prod(shape)).reshape(shape)


def _pad3d_case(dtype, mode, fmt):
    xs = (2, 3, 3, 4, 5) if fmt == "NCDHW" else (2, 3, 4, 5, 3)
    pads = [1, 2, 2, 1, 1, 0]
    imap = _np_pad(_flat_index(xs), pads, mode, fmt, value=-1)
    g = data(dtype, *imap.shape, seed=1)
    attrs = {"paddings": pads, "mode": mode, "pad_value": 0.0, "data_format": fmt}
    return {"x": data(dtype, *xs), "out_grad": g}, attrs, {"x_grad": _gathered(xs, dtype, imap, g)}


def _diag_case(dtype, xs, offset):
    x = data(dtype, *xs)
    imap = np.diag(_flat_index(xs), offset) if len(xs) == 1 else np.diagonal(_flat_index(xs), offset)
    if len(xs) == 1:
        imap = np.where(np.diag(np.ones(xs, bool), offset), imap, -1)
    g = data(dtype, *imap.shape, seed=1)
    return {"x": x, "out_grad": g}, {"offset": offset}, {"x_grad": _gathered(xs, dtype, imap, g)}


def _diagonal_case(dtype, xs, offset, a1, a2):
    imap = np.diagonal(_flat_index(xs), offset, a1, a2)
    g = data(dtype, *imap.shape, seed=1)
    return ({"x": data(dtype, *xs), "out_grad": g}, {"offset": offset, "axis1": a1, "axis2": a2},
            {"x_grad": _gathered(xs, dtype, imap, g)})


def _fill_diagonal_tensor_case(dtype, shape, offset, d1, d2):
    g = data(dtype, *shape)
    idx = np.indices(shape)
    want = np.where(idx[d2] - idx[d1] == offset, np.zeros((), dtype), g)
    return {"out_grad": g}, {"offset": offset, "dim1": d1, "dim2": d2}, {"x_grad": want}


def _as_strided_case(dtype, xs, dims, stride, off):
    idx = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(dims))]) * st
                    for d, (n, st) in enumerate(zip(dims, stride))) if dims else np.array(off)
    imap = np.broadcast_to(idx, tuple(dims))
    g = data(dtype, *dims, seed=1)
    attrs = {"dims": dims, "stride": stride, "offset": off * np.dtype(dtype).itemsize}
    return {"input": data(dtype, *xs), "out_grad": g}, attrs, {"input_grad": _gathered(xs, dtype, imap, g)}


def _extra_cases():
    """(op, id, make(dtype) -> (inputs, attrs, numpy want or None), paddle oracle or None)."""
    conv = {"kernel_sizes": [3, 2], "strides": [2, 1], "paddings": [1, 0, 1, 0], "dilations": [1, 2]}
    cases = [
        ("flatten_grad", "", lambda dt: ({"xshape": data(dt, 2, 3, 4), "out_grad": data(dt, 2, 12, seed=1)}, {},
                                         {"x_grad": data(dt, 2, 12, seed=1).reshape(2, 3, 4)})),
        ("squeeze_grad", "", lambda dt: ({"xshape": data(dt, 2, 1, 3), "out_grad": data(dt, 2, 3, seed=1)},
                                         {"axis": [1]}, {"x_grad": data(dt, 2, 3, seed=1).reshape(2, 1, 3)})),
        ("unsqueeze_grad", "", lambda dt: ({"xshape": data(dt, 2, 3), "out_grad": data(dt, 2, 1, 3, seed=1)},
                                           {"axis": [1]}, {"x_grad": data(dt, 2, 3, seed=1)})),
        ("view_shape_grad", "", lambda dt: ({"input": data(dt, 2, 3, 4), "out_grad": data(dt, 6, 4, seed=1)},
                                            {"dims": [6, 4]}, {"input_grad": data(dt, 6, 4, seed=1).reshape(2, 3, 4)})),
        ("flip_grad", "", lambda dt: ({"out_grad": data(dt, 3, 4, 5)}, {"axis": [0, -1]},
                                      {"x_grad": np.flip(data(dt, 3, 4, 5), (0, 2))})),
        ("flip_grad", "mid", lambda dt: ({"out_grad": data(dt, 3, 4, 5)}, {"axis": [1]},
                                         {"x_grad": np.flip(data(dt, 3, 4, 5), 1)})),
        ("reverse_grad", "", lambda dt: ({"out_grad": data(dt, 3, 4, 5)}, {"axis": [1]},
                                         {"x_grad": np.flip(data(dt, 3, 4, 5), 1)})),
        ("roll_grad", "", lambda dt: ({"x": data(dt, 3, 4, 5), "out_grad": data(dt, 3, 4, 5, seed=1)},
                                      {"shifts": [1, -2], "axis": [0, 2]},
                                      {"x_grad": np.roll(data(dt, 3, 4, 5, seed=1), (-1, 2), (0, 2))})),
        ("roll_grad", "flat", lambda dt: ({"x": data(dt, 3, 4), "out_grad": data(dt, 3, 4, seed=1)},
                                          {"shifts": [5], "axis": []},
                                          {"x_grad": np.roll(data(dt, 3, 4, seed=1), -5)})),
        ("crop_grad", "", lambda dt: ({"x": data(dt, 4, 6), "out_grad": data(dt, 2, 3, seed=1)}, {"offsets": [1, 2]},
                                      {"x_grad": np.pad(data(dt, 2, 3, seed=1), [(1, 1), (2, 1)])})),
        ("diag_grad", "1d", lambda dt: _diag_case(dt, (4,), 1)),
        ("diag_grad", "2d", lambda dt: _diag_case(dt, (3, 5), -1)),
        ("diagonal_grad", "", lambda dt: _diagonal_case(dt, (3, 4, 5), 1, 0, 2)),
        ("diagonal_grad", "neg", lambda dt: _diagonal_case(dt, (3, 4, 5), -1, -1, 1)),
        ("fill_diagonal_grad", "", lambda dt: ({"out_grad": data(dt, 5, 3)}, {"value": 2.0, "offset": 0, "wrap": True},
                                               None)),
        ("fill_diagonal_tensor_grad", "", lambda dt: _fill_diagonal_tensor_case(dt, (2, 3, 4), -1, 1, 2)),
        ("fold_grad", "", lambda dt: ({"x": data(dt, 1, 12, 6), "out_grad": data(dt, 1, 2, 5, 4, seed=1)},
                                      {**conv, "output_sizes": [5, 4]}, None)),
        ("frame_grad", "last", lambda dt: ({"x": data(dt, 2, 10), "out_grad": data(dt, 2, 4, 3, seed=1)},
                                           {"frame_length": 4, "hop_length": 3, "axis": -1}, None)),
        ("frame_grad", "first", lambda dt: ({"x": data(dt, 9, 2), "out_grad": data(dt, 4, 3, 2, seed=1)},
                                            {"frame_length": 3, "hop_length": 2, "axis": 0}, None)),
        ("tensor_unfold_grad", "", lambda dt: ({"input": data(dt, 3, 9), "out_grad": data(dt, 3, 3, 3, seed=1)},
                                               {"axis": 1, "size": 3, "step": 3},
                                               {"input_grad": data(dt, 3, 3, 3, seed=1).reshape(3, 9)})),
        ("as_strided_grad", "", lambda dt: _as_strided_case(dt, (12,), [3, 2], [4, 1], 2)),
        ("as_strided_grad", "2d", lambda dt: _as_strided_case(dt, (3, 4), [2, 2], [4, 2], 1)),
    ]
    cases += [("pad3d_grad", f"{m}-{f}", lambda dt, m=m, f=f: _pad3d_case(dt, m, f))
              for m in ("constant", "reflect", "replicate", "circular") for f in ("NCDHW", "NDHWC")]
    return cases


def _extra_params():
    return [pytest.param(op, make, dt, id=f"{op}-{name}-{dt}" if name else f"{op}-{dt}")
            for op, name, make in _extra_cases() for dt in extra_dtypes(op)]


@pytest.mark.parametrize("op,make,dtype", _extra_params())
@pytest.mark.sweep
def test_extra_dtypes(op, make, dtype):
    from harness import c_ops
    inputs, attrs, want = make(dtype)
    got = tvmgrad.run(op, inputs, attrs)
    refs = [("numpy", want)] if want is not None else []
    if dtype in _paddle_table()[op]["cpu"]:
        refs.append(("paddle", c_ops(op, inputs, attrs)))
    assert refs, f"{op} [{dtype}]: no reference"
    for who, ref in refs:
        for k, w in ref.items():
            agree(f"{op}.{k} [{dtype}] vs {who}", got[k], w)


@pytest.mark.parametrize("dtype", extra_dtypes("squeeze_double_grad"))
def test_squeeze_unsqueeze_double_grads_extra_dtypes(dtype):
    x = data(dtype, 2, 1, 3, 1)
    for op, fwd, axis, shape in (("squeeze_double_grad", "squeeze", [1], (2, 3, 1)),
                                 ("unsqueeze_double_grad", "unsqueeze", [0], (1, 2, 1, 3, 1))):
        got = tvmgrad.run(op, {"grad_x_grad": x}, {"axis": axis})["grad_out_grad"]
        agree(f"{op} [{dtype}] vs numpy", got, x.reshape(shape))
        agree(f"{op} [{dtype}] vs paddle", got, from_paddle(_c(fwd)(to_paddle(x), axis)))


@pytest.mark.parametrize("dtype", extra_dtypes("pad3d_double_grad"))
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("fmt", ["NCDHW", "NDHWC"])
@pytest.mark.sweep
def test_pad3d_double_grad_extra_dtypes(dtype, mode, fmt):
    """pad_value reaches a complex kernel as pad_value + 0i and an integer one truncated (Paddle's
    static_cast<T>: 1.7 -> 1, -2.9 -> -2)."""
    x = data(dtype, 2, 3, 3, 4, 5)
    pads = [1, 2, 2, 1, 1, 0]
    for value in (1.7, -2.9):
        attrs = {"paddings": pads, "mode": mode, "pad_value": value, "data_format": fmt}
        got = tvmgrad.run("pad3d_double_grad", {"grad_x_grad": x}, attrs)["grad_out_grad"]
        fill = complex(value) if dtype in CPLX else int(value)
        agree(f"pad3d_double_grad [{dtype}] vs numpy", got, _np_pad(x, pads, mode, fmt, value=fill))
        want = from_paddle(_c("pad3d")(to_paddle(x), pads, mode, value, fmt))
        agree(f"pad3d_double_grad [{dtype}] vs paddle", got, want)


@pytest.mark.parametrize("dtype", [d for d in extra_dtypes("as_strided_grad") if d in INTLIKE])
def test_as_strided_and_tensor_unfold_overlap_sum_in_the_dtype(dtype):
    """Overlapping windows sum their cotangents (module doc): integers wrap, bools OR."""
    inputs, attrs, want = _as_strided_case(dtype, (10,), [4, 4], [2, 1], 0)
    agree("as_strided_grad", tvmgrad.run("as_strided_grad", inputs, attrs)["input_grad"], want["input_grad"])
    g = data(dtype, 3, 3, seed=2)
    imap = _tensor_unfold_np(_flat_index((7,)), 0, 3, 2)
    got = tvmgrad.run("tensor_unfold_grad", {"input": data(dtype, 7), "out_grad": g},
                      {"axis": 0, "size": 3, "step": 2})["input_grad"]
    agree("tensor_unfold_grad", got, _gathered((7,), dtype, imap, g))


def test_shape_extra_dtypes_are_what_paddle_registers():
    """Every op of te_defs/shape.py takes exactly the complex/integer/bool dtypes Paddle registers
    for it (CPU or GPU), and each of them is tested above."""
    table = _paddle_table()
    tested = {op for op, _, _ in _extra_cases()} | {"squeeze_double_grad", "unsqueeze_double_grad",
                                                     "pad3d_double_grad"}
    for op, entry in table.items():
        impl = tvmgrad.registry.get(op).implementation
        if impl.family != "shape" or op == "view_dtype_grad":
            continue
        registered = (set(entry["cpu"]) | set(entry["gpu"] or [])) & set(CPLX + INTLIKE)
        assert set(extra_dtypes(op)) == registered, op
        assert not registered or op in tested, op


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", CPLX + INTLIKE)
@pytest.mark.sweep
@pytest.mark.slow      # every dtype in CI's "sweep and slow" run; none in the default run (its time)
def test_extra_dtype_kernels_compile_to_cubin_without_spills(dtype):
    """Every kernel of the complex/integer/bool cases above compiles for CUDA (sm_80, sm_90)
    without spills."""
    from cubins import assert_compiles_without_spills, plans_of
    calls = [(op, *make(dtype)[:2]) for op, _, make in _extra_cases() if dtype in extra_dtypes(op)]
    if dtype in extra_dtypes("pad3d_double_grad"):
        calls += [("pad3d_double_grad", {"grad_x_grad": data(dtype, 2, 3, 3, 4, 5)},
                   {"paddings": [1, 2, 2, 1, 1, 0], "mode": m, "pad_value": 0.5, "data_format": "NDHWC"})
                  for m in ("constant", "reflect", "replicate", "circular")]
    assert_compiles_without_spills(plans_of(calls))


# ------------------------------------------------------------------------------------------
# one kernel per code shape

def test_runtime_attributes_share_kernels():
    from tvmgrad import registry
    from tvmgrad.call import bind

    def key(op, inputs, attrs):
        entry = registry.get(op)
        call = bind(entry.spec, inputs, attrs)
        return entry.impl.plan(call, registry.infer_outputs(entry, call)).key

    assert key("roll_grad", {"x": _n(3, 4), "out_grad": _n(3, 4)}, {"shifts": [1], "axis": [1]}) == \
        key("roll_grad", {"x": _n(9, 5), "out_grad": _n(9, 5)}, {"shifts": [-7], "axis": [-1]})
    assert key("crop_grad", {"x": _n(4, 4), "out_grad": _n(2, 2)}, {"offsets": [1, 2]}) == \
        key("crop_grad", {"x": _n(7, 5), "out_grad": _n(3, 1)}, {"offsets": [0, 4]})
    conv = {"kernel_sizes": [2, 2], "strides": [1, 1], "paddings": [0, 0, 0, 0], "dilations": [1, 1]}
    conv2 = {"kernel_sizes": [3, 1], "strides": [2, 1], "paddings": [1, 0, 1, 0], "dilations": [1, 2]}
    assert key("unfold_grad", {"x": _n(1, 1, 3, 3), "out_grad": _n(1, 4, 4)}, conv) == \
        key("unfold_grad", {"x": _n(2, 2, 5, 4), "out_grad": _n(2, 6, 12)}, conv2)
    assert key("fill_diagonal_grad", {"out_grad": _n(5, 3)}, {"value": 1.0, "offset": 0, "wrap": True}) == \
        key("fill_diagonal_grad", {"out_grad": _n(4, 4, 4)}, {"value": 2.0, "offset": -1, "wrap": False})


# ------------------------------------------------------------------------------------------
# CUDA builds of the kernel variants the generic sample-based build test does not reach

def _variant_calls():
    f16, f32, bf = np.float16, np.float32, ml_dtypes.bfloat16
    conv = {"kernel_sizes": [3, 2], "strides": [2, 1], "paddings": [1, 0, 1, 0], "dilations": [1, 2]}
    return [
        ("view_dtype_grad", {"input": _n(2, 3).astype(f32), "out_grad": _n(2, 6).astype(f16)}, {"dtype": "float16"}),
        ("view_dtype_grad", {"input": _n(2, 6).astype(f16), "out_grad": _n(2, 3).astype(f32)}, {"dtype": "float32"}),
        ("view_dtype_grad", {"input": _n(2, 4).astype(bf), "out_grad": _n(2, 1)}, {"dtype": "float64"}),
        ("view_dtype_grad", {"input": _n(4).astype(f16), "out_grad": _n(4).astype(bf)}, {"dtype": "bfloat16"}),
        ("view_dtype_grad", {"input": _n(2, 3).astype(f32), "out_grad": np.zeros((2, 3), np.int32)}, {"dtype": "int32"}),
        ("view_dtype_grad", {"input": np.zeros((2, 4), bool), "out_grad": np.zeros((2, 4), np.uint8)}, {"dtype": "uint8"}),
        ("view_dtype_grad", {"input": _n(2, 3).astype(np.complex64), "out_grad": _n(2, 6).astype(f32)}, {"dtype": "float32"}),
        ("view_dtype_grad", {"input": np.zeros((2, 16), np.int8), "out_grad": np.zeros((2, 1), np.complex128)},
         {"dtype": "complex128"}),
        ("as_strided_grad", {"input": _n(12).astype(f16), "out_grad": _n(3, 2).astype(f16)},
         {"dims": [3, 2], "stride": [1, 4], "offset": 2}),
        ("as_strided_grad", {"input": _n(12).astype(bf), "out_grad": _n(0, 2).astype(bf)},
         {"dims": [0, 2], "stride": [1, 4], "offset": 0}),
        ("as_strided_grad", {"input": _n(4), "out_grad": np.float64(1.0)}, {"dims": [], "stride": [], "offset": 8}),
        ("roll_grad", {"x": _n(3, 4), "out_grad": _n(3, 4)}, {"shifts": [5], "axis": []}),
        ("fold_grad", {"x": _n(1, 12, 6), "out_grad": _n(1, 2, 5, 4)},
         {**conv, "paddings": [1, 0, 1, 0], "output_sizes": [5, 4]}),
        ("frame_grad", {"x": _n(9, 2).astype(f16), "out_grad": _n(4, 3, 2).astype(f16)},
         {"frame_length": 3, "hop_length": 2, "axis": 0}),
        ("temporal_shift_grad", {"out_grad": _n(4, 2, 3, 8).astype(bf)}, {"seg_num": 2, "shift_ratio": 0.25, "data_format": "NHWC"}),
        ("pixel_shuffle_grad", {"out_grad": _n(2, 4, 6, 3)}, {"upscale_factor": 2, "data_format": "NHWC"}),
        ("pixel_unshuffle_grad", {"out_grad": _n(2, 2, 3, 12)}, {"downscale_factor": 2, "data_format": "NHWC"}),
        ("diag_grad", {"x": _n(3, 5), "out_grad": _n(3)}, {"offset": 2}),
        ("fill_diagonal_grad", {"out_grad": _n(3, 3, 3).astype(f16)}, {"value": 0.0, "offset": 1, "wrap": False}),
        ("fill_diagonal_tensor_grad", {"out_grad": _n(2, 3, 4).astype(bf)}, {"offset": 1, "dim1": 0, "dim2": 2}),
        ("crop_grad", {"x": _n(4, 5, 6).astype(bf), "out_grad": _n(2, 3, 4).astype(bf)}, {"offsets": [1, 0, 2]}),
    ] + [("pad3d_grad", {"x": _n(2, 3, 4, 3, 2).astype(dt), "out_grad": _n(*_np_pad(_n(2, 3, 4, 3, 2), p, m, "NDHWC").shape).astype(dt)},
          {"paddings": p, "mode": m, "pad_value": 0.0, "data_format": "NDHWC"})
         for m, p, dt in (("constant", [1, 2, 0, 3, 2, 1], f32), ("replicate", [2, 1, 3, 0, 1, 2], bf),
                          ("circular", [5, 4, 0, 0, 1, 0], f16))] + \
        [("pad3d_double_grad", {"grad_x_grad": _n(2, 2, 3, 4, 3).astype(dt)},
          {"paddings": [1, 1, 2, 0, 1, 2], "mode": m, "pad_value": 0.5, "data_format": "NCDHW"})
         for m, dt in (("constant", bf), ("replicate", f16), ("circular", f32))]


@pytest.mark.slow
@pytest.mark.cuda
def test_variant_kernels_compile_to_cubin_without_spills():
    from tvmgrad import registry
    from tvmgrad.build import compile_lowered, lower
    from tvmgrad.call import bind
    from tvmgrad.cuda import compile_cubin, device_source, nvcc_path
    from tvmgrad.targets import resolve
    if nvcc_path() is None:
        pytest.fail("nvcc is not installed")
    target = resolve({"kind": "cuda", "arch": "sm_80"})
    funcs, symbols = {}, []
    for op, inputs, attrs in _variant_calls():
        entry = registry.get(op)
        call = bind(entry.spec, inputs, attrs)
        plan = entry.impl.plan(call, registry.infer_outputs(entry, call))
        assert plan.make is not None, op
        funcs.setdefault(plan.symbol, lower(plan, target)["main"])
        symbols.append((op, plan.symbol))
    source = device_source(compile_lowered(funcs, target))
    for arch in ("sm_80", "sm_90"):
        stats = compile_cubin(source, arch).kernels
        for op, symbol in symbols:
            kernels = [s for name, s in stats.items() if name.startswith(symbol + "_kernel")]
            assert kernels, f"{op}: no kernel {symbol} on {arch}"
            for k in kernels:
                assert k.registers > 0 and not k.spills, f"{op} on {arch}: {k}"
