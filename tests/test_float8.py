"""float8 (e4m3fn, e5m2): storage only, for the data-movement grads Paddle registers it for.

tvmgrad stores float8 as its uint8 bits (tvmgrad/dtypes.py), so each float8 call is checked bit for
bit against the same op on the uint8 view of its arrays and against Paddle 3.3.1's CPU kernel on
the same bits (concat_grad through autograd: its ``_C_ops`` binding is unusable). The arrays hold
every byte value, so NaNs (with their payloads), ±inf (e5m2), -0.0, the largest values and the
subnormals must all survive. An op accepts float8 only by listing ``FLOAT8``: the set of such ops
is pinned here, and an arithmetic op rejects it.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from tvmgrad import registry
from tvmgrad.dtypes import FLOAT8, dtype

paddle = pytest.importorskip("paddle")
paddle.set_device("cpu")
warnings.filterwarnings("ignore")

C = paddle._C_ops

# every op that takes float8: Paddle's float8 registrations (and the forward ops the double grads
# invoke); each only moves data
FLOAT8_OPS = {"index_select_strided_grad", "concat_grad", "concat_double_grad", "as_strided_grad",
              "diagonal_grad", "flatten_grad", "squeeze_grad", "squeeze_double_grad",
              "tensor_unfold_grad", "unsqueeze_grad", "unsqueeze_double_grad", "view_dtype_grad",
              "view_shape_grad", "concat", "squeeze", "unsqueeze"}

# the bytes that matter, at the front of every array: 0, -0.0, NaN / +inf / max (e4m3fn 0x7f NaN,
# 0x7e 448; e5m2 0x7c inf, 0x7d NaN, 0x7b 57344), their negatives, the smallest subnormal
SPECIAL = np.array([0x00, 0x80, 0x7F, 0xFF, 0x7E, 0xFE, 0x7C, 0xFC, 0x7D, 0x7B, 0x01, 0x81],
                   np.uint8)


def _bits(shape, seed=0):
    """uint8 bits of ``shape``: the SPECIAL bytes first, then random ones."""
    flat = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)), dtype=np.uint8)
    flat[:min(flat.size, SPECIAL.size)] = SPECIAL[:flat.size]
    return flat.reshape(shape)


def _f8(bits, name):
    return bits.view(getattr(ml_dtypes, name))


def _paddle(bits, name):
    """A Paddle float8 tensor holding ``bits`` (paddle.to_tensor takes no float8 numpy array)."""
    return paddle.to_tensor(bits).view(getattr(paddle, name))


def _paddle_bits(t):
    return t.view(paddle.uint8).numpy()


def _tree(value, fn):
    return [fn(v) for v in value] if isinstance(value, list) else fn(value)


def _check(op, bits: dict, attrs: dict, name: str, want: dict):
    """tvmgrad's float8 call keeps the dtype and gives the bits of its uint8 call and ``want``."""
    got = tvmgrad.run(op, {k: _tree(v, lambda b: _f8(b, name)) for k, v in bits.items()}, attrs)
    ref = tvmgrad.run(op, bits, attrs)
    for out, w in want.items():
        g, r = got[out], ref[out]
        for gi, ri, wi in zip(*(v if isinstance(v, list) else [v] for v in (g, r, w))):
            assert gi.dtype == np.dtype(getattr(ml_dtypes, name)), (op, out, gi.dtype)
            np.testing.assert_array_equal(gi.view(np.uint8), ri, err_msg=f"{op} {out} (uint8)")
            np.testing.assert_array_equal(gi.view(np.uint8), wi, err_msg=f"{op} {out} (paddle)")


@pytest.fixture(params=FLOAT8)
def f8(request):
    return request.param


def test_reshapes(f8):
    g, x = _bits((3, 1, 4), 1), _bits((3, 4), 2)
    P = lambda b: _paddle(b, f8)  # noqa: E731
    _check("flatten_grad", {"xshape": x, "out_grad": g.reshape(12)}, {}, f8,
           {"x_grad": _paddle_bits(C.flatten_grad(P(x), P(g.reshape(12))))})
    _check("squeeze_grad", {"xshape": g, "out_grad": x}, {"axis": [1]}, f8,
           {"x_grad": _paddle_bits(C.squeeze_grad(P(g), P(x), [1]))})
    _check("unsqueeze_grad", {"xshape": x, "out_grad": g}, {"axis": [1]}, f8,
           {"x_grad": _paddle_bits(C.unsqueeze_grad(P(x), P(g), [1]))})
    _check("squeeze_double_grad", {"grad_x_grad": g}, {"axis": [1]}, f8,
           {"grad_out_grad": _paddle_bits(C.squeeze(P(g), [1]))})
    _check("unsqueeze_double_grad", {"grad_x_grad": x}, {"axis": [1]}, f8,
           {"grad_out_grad": _paddle_bits(C.unsqueeze(P(x), [1]))})
    _check("view_shape_grad", {"input": x.reshape(12), "out_grad": x}, {"dims": [3, 4]}, f8,
           {"input_grad": _paddle_bits(C.view_shape_grad(P(x.reshape(12)), P(x), [3, 4]))})
    out = tvmgrad.run("flatten_grad", {"xshape": _f8(x, f8), "out_grad": _f8(g.reshape(12), f8)},
                      alias=True)["x_grad"]                    # the zero-copy view keeps float8
    assert out.dtype == np.dtype(getattr(ml_dtypes, f8))
    np.testing.assert_array_equal(out.view(np.uint8), g.reshape(3, 4))


@pytest.mark.parametrize("other", ["uint8", "int8", "other_float8", "float16", "float32"])
def test_view_dtype_grad(f8, other):
    """input_grad = out_grad's bytes as input's dtype, both ways between float8 and ``other``."""
    other = next(d for d in FLOAT8 if d != f8) if other == "other_float8" else other
    for src, dst in ((other, f8), (f8, other)):
        g = _bits((2, 8), 3)                        # 8 bytes a row: 8 // itemsize elements of each
        gv, xv = g.view(dtype(src).numpy), np.zeros((2, 8), np.uint8).view(dtype(dst).numpy)
        got = tvmgrad.run("view_dtype_grad", {"input": xv, "out_grad": gv},
                          {"dtype": src})["input_grad"]
        assert got.dtype == xv.dtype and got.shape == xv.shape, (src, dst, got.dtype, got.shape)
        np.testing.assert_array_equal(got.view(np.uint8), g)
        pt = lambda a: (_paddle(a.view(np.uint8), a.dtype.name) if a.dtype.name in FLOAT8  # noqa: E731
                        else paddle.to_tensor(a))
        want = C.view_dtype_grad(pt(xv), pt(gv), getattr(paddle, src))
        assert str(want.dtype) == f"paddle.{dst}"
        np.testing.assert_array_equal(got.view(np.uint8), _paddle_bits(want).reshape(2, 8))


def test_diagonal_and_index_select_strided(f8):
    P = lambda b: _paddle(b, f8)  # noqa: E731
    x, g = _bits((2, 4, 5), 4), _bits((2, 4), 5)
    want = C.diagonal_grad(P(x), P(g), 1, 1, 2)
    _check("diagonal_grad", {"x": x, "out_grad": g}, {"offset": 1, "axis1": 1, "axis2": 2}, f8,
           {"x_grad": _paddle_bits(want)})
    x, g = _bits((3, 2, 4), 6), _bits((3, 4), 7)
    want = C.index_select_strided_grad(P(x), P(g), 1, 1)
    _check("index_select_strided_grad", {"x": x, "out_grad": g}, {"index": 1, "axis": 1}, f8,
           {"x_grad": _paddle_bits(want)})


def test_concat(f8):
    P = lambda b: _paddle(b, f8)  # noqa: E731
    a, b, g = _bits((3, 1), 8), _bits((3, 3), 9), _bits((3, 4), 10)
    pa, pb = P(a), P(b)
    pa.stop_gradient = pb.stop_gradient = False
    want = paddle.grad(paddle.concat([pa, pb], 1), [pa, pb], P(g))
    _check("concat_grad", {"x": [a, b], "out_grad": g}, {"axis": 1}, f8,
           {"x_grad": [_paddle_bits(w) for w in want]})
    _check("concat_double_grad", {"grad_x_grad": [a, b]}, {"axis": 1}, f8,
           {"grad_out_grad": _paddle_bits(paddle.concat([P(a), P(b)], 1))})


def test_strided_views(f8):
    """Views without overlap (as_strided injective, also where the greedy test cannot tell;
    tensor_unfold with gaps) match Paddle; overlapping ones would sum and are rejected."""
    P = lambda b: _paddle(b, f8)  # noqa: E731
    x = _bits((13,), 11)
    for dims, stride, offset in (([3, 4], [4, 1], 1), ([3, 2], [2, 3], 0)):
        g = _bits(tuple(dims), 12)
        want = C.as_strided_grad(P(x), P(g), dims, stride, offset)
        _check("as_strided_grad", {"input": x, "out_grad": g},
               {"dims": dims, "stride": stride, "offset": offset}, f8,
               {"input_grad": _paddle_bits(want)})
    x, g = _bits((2, 9), 13), _bits((2, 3, 2), 14)
    want = C.tensor_unfold_grad(P(x), P(g), 1, 2, 3)
    _check("tensor_unfold_grad", {"input": x, "out_grad": g}, {"axis": 1, "size": 2, "step": 3},
           f8, {"input_grad": _paddle_bits(want)})
    overlapping = [("as_strided_grad", {"input": x.reshape(-1), "out_grad": g},
                    {"dims": [2, 3, 2], "stride": [3, 1, 1], "offset": 0}),
                   ("tensor_unfold_grad", {"input": x, "out_grad": _bits((2, 4, 3), 15)},
                    {"axis": 1, "size": 3, "step": 2})]
    for op, bits, attrs in overlapping:
        tvmgrad.run(op, bits, attrs)                            # uint8 sums
        with pytest.raises(TypeError, match="overlap"):
            tvmgrad.run(op, {k: _f8(v, f8) for k, v in bits.items()}, attrs)


def test_only_data_movement_ops_take_float8():
    takes = {name for name, e in registry.ops().items()
             if set(FLOAT8) & set(e.implementation.dtypes)}
    assert takes == FLOAT8_OPS
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        tvmgrad.run("scale_grad", {"out_grad": _f8(_bits((4,)), "float8_e4m3fn")}, {"scale": 2.0})


def test_dtype_spellings_and_frameworks(f8):
    import torch
    import tvm_ffi
    for spelling in (f8, getattr(ml_dtypes, f8), getattr(torch, f8), getattr(paddle, f8),
                     tvm_ffi.dtype(f8), np.zeros(2, getattr(ml_dtypes, f8))):
        dt = dtype(spelling)
        assert (dt.name, dt.storage, dt.kind) == (f8, "uint8", "float8"), spelling
    g = _bits((4,), 16)
    zeros = np.zeros((4, 4), np.uint8)
    want = np.diag(g)
    t = tvmgrad.run("diagonal_grad", {"x": torch.from_numpy(zeros).view(getattr(torch, f8)),
                                      "out_grad": torch.from_numpy(g).view(getattr(torch, f8))},
                    {"offset": 0, "axis1": 0, "axis2": 1})["x_grad"]
    assert t.dtype == getattr(torch, f8)
    np.testing.assert_array_equal(t.view(torch.uint8).numpy(), want)
    p = tvmgrad.run("diagonal_grad", {"x": _paddle(zeros, f8), "out_grad": _paddle(g, f8)},
                    {"offset": 0, "axis1": 0, "axis2": 1})["x_grad"]
    assert p.dtype == getattr(paddle, f8)
    np.testing.assert_array_equal(_paddle_bits(p), want)
    p = tvmgrad.run("view_shape_grad", {"input": _paddle(g, f8),
                                        "out_grad": _paddle(g.reshape(2, 2), f8)},
                    {"dims": [2, 2]})["input_grad"]            # an alias op's copy
    assert p.dtype == getattr(paddle, f8)
    np.testing.assert_array_equal(_paddle_bits(p), g)
