"""Sort/select grads against Paddle 3.3.1 (te_defs/sort.py): argsort, topk, kthvalue, mode,
nanmedian.

The indices come from Paddle's own forward (its tie rules: kthvalue's pick among equal values,
mode's last occurrence, nanmedian's two middles and NaN handling); repeated indices follow the CPU
kernels' last-wins assignment; negative or too large indices are rejected (Paddle 3.3.1 corrupts
memory on a negative one).
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, cast, check, from_paddle, rng, to_paddle


def normal(*shape, seed=0):
    return rng(seed).standard_normal(shape)


def ties(*shape, seed=0):
    """Small integers: plenty of equal values."""
    return np.round(normal(*shape, seed=seed) * 1.5)


def run(op, inputs, attrs=None, dtype="float64", **options):
    return tvmgrad.run(op, {k: cast(v, dtype) for k, v in inputs.items()}, attrs, **options)


def _c(name):
    import paddle
    return getattr(paddle._C_ops, name)


# ------------------------------------------------------------------------------------------
# argsort / topk

def _argsort_inputs(x, axis, descending, seed=1):
    idx = _c("argsort")(to_paddle(x), axis, descending, True)[1].numpy()
    return {"indices": idx, "x": x, "out_grad": normal(*x.shape, seed=seed)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_dtypes(descending, dtype):
    attrs = {"axis": 1, "descending": descending, "stable": True}
    check("argsort_grad", _argsort_inputs(ties(4, 9), 1, descending), attrs, dtype)


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 0), ((2, 3, 4), -2), ((7,), 0), ((1, 5), -1),
                                        ((3, 0), 1)])
def test_argsort_shapes(shape, axis):
    attrs = {"axis": axis, "descending": False, "stable": True}
    check("argsort_grad", _argsort_inputs(normal(*shape), axis, False), attrs)


def test_argsort_repeated_index_and_errors():
    """Not a permutation: Paddle's CPU kernel assigns in order, so the last duplicate wins (and a
    slot nobody points at stays 0); so does the deterministic kernel here."""
    x = normal(3, 4)
    idx = np.array([[1, 1, 0, 2], [0, 1, 3, 2], [3, 3, 3, 3]])
    attrs = {"axis": -1, "descending": False, "stable": False}
    check("argsort_grad", {"indices": idx, "x": x, "out_grad": normal(3, 4, seed=1)}, attrs)
    with pytest.raises(ValueError, match=r"argsort_grad: input 'indices' holds -1 at \[0, 2\]"):
        run("argsort_grad", {"indices": idx - 1, "x": x, "out_grad": normal(3, 4)}, attrs)
    with pytest.raises(ValueError, match=r"argsort_grad: input 'indices' holds 4"):
        run("argsort_grad", {"indices": idx + 1, "x": x, "out_grad": normal(3, 4)}, attrs)
    with pytest.raises(ValueError, match=r"argsort_grad: indices has shape \[3, 3\], expected x's"):
        run("argsort_grad", {"indices": idx[:, :3], "x": x, "out_grad": normal(3, 3)}, attrs)


def _topk_inputs(x, k, axis, largest, seed=1):
    out, idx = _c("topk")(to_paddle(x), k, axis, largest, True)
    return {"x": x, "indices": idx.numpy(), "out_grad": normal(*out.shape, seed=seed)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_dtypes(largest, dtype):
    attrs = {"k": 3, "axis": -1, "largest": largest, "sorted": True}
    check("topk_grad", _topk_inputs(ties(5, 8), 3, -1, largest), attrs, dtype)


@pytest.mark.parametrize("shape,k,axis", [((2, 6, 3), 2, 1), ((6,), 6, 0), ((4, 5), 1, 0),
                                          ((3, 4), 0, 1)])
def test_topk_shapes(shape, k, axis):
    x = normal(*shape)
    if k:
        inputs = _topk_inputs(x, k, axis, True)
    else:
        g_shape = list(shape)
        g_shape[axis] = 0
        inputs = {"x": x, "indices": np.zeros(g_shape, "int64"), "out_grad": normal(*g_shape)}
    check("topk_grad", inputs, {"k": k, "axis": axis, "largest": True, "sorted": True})


def test_topk_repeated_index_and_errors():
    x = normal(3, 4)
    idx = np.array([[0, 2], [2, 3], [1, 1]])
    attrs = {"k": 2, "axis": -1, "largest": True, "sorted": True}
    check("topk_grad", {"x": x, "indices": idx, "out_grad": normal(3, 2, seed=1)}, attrs)
    # Paddle 3.3.1: "double free or corruption" on a negative index
    with pytest.raises(ValueError, match=r"topk_grad: input 'indices' holds -1 at \[0, 1\]"):
        run("topk_grad", {"x": x, "indices": np.array([[0, -1], [2, 3], [1, 1]]),
                          "out_grad": normal(3, 2)}, attrs)
    with pytest.raises(ValueError, match=r"topk_grad: out_grad has shape \[3, 3\], expected"):
        run("topk_grad", {"x": x, "indices": idx, "out_grad": normal(3, 3)}, attrs)


# ------------------------------------------------------------------------------------------
# kthvalue / mode

def _kth_inputs(x, k, axis, keepdim, seed=1):
    out, idx = _c("kthvalue")(to_paddle(x), k, axis, keepdim)
    return {"x": x, "indices": idx.numpy(), "out_grad": normal(*out.shape, seed=seed)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue_dtypes(keepdim, dtype):
    check("kthvalue_grad", _kth_inputs(ties(4, 7), 3, 1, keepdim),
          {"k": 3, "axis": 1, "keepdim": keepdim}, dtype)


@pytest.mark.parametrize("shape,k,axis", [((2, 5, 3), 2, 1), ((2, 5, 3), 1, -1), ((6,), 6, 0),
                                          ((4, 1), 1, 1)])
def test_kthvalue_shapes(shape, k, axis):
    check("kthvalue_grad", _kth_inputs(ties(*shape), k, axis, False),
          {"k": k, "axis": axis, "keepdim": False})


def _mode_inputs(x, axis, keepdim, seed=1):
    out, idx = _c("mode")(to_paddle(x), axis, keepdim)
    return {"x": x, "indices": idx.numpy(), "out_grad": normal(*out.shape, seed=seed)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_mode_dtypes(keepdim, dtype):
    check("mode_grad", _mode_inputs(ties(4, 9), -1, keepdim), {"axis": -1, "keepdim": keepdim}, dtype)


@pytest.mark.parametrize("shape,axis", [((2, 5, 3), 1), ((2, 5, 3), 0), ((6,), 0), ((3, 1), 1)])
def test_mode_shapes(shape, axis):
    check("mode_grad", _mode_inputs(ties(*shape), axis, False), {"axis": axis, "keepdim": False})


@pytest.mark.parametrize("op", ["kthvalue_grad", "mode_grad"])
def test_select_bad_input(op):
    attrs = {"axis": 1, "keepdim": False, **({"k": 1} if op == "kthvalue_grad" else {})}
    x = normal(3, 4)
    with pytest.raises(ValueError, match=rf"{op}: input 'indices' holds -1 at \[0\]"):
        run(op, {"x": x, "indices": np.array([-1, 0, 1]), "out_grad": normal(3)}, attrs)
    with pytest.raises(ValueError, match=rf"{op}: input 'indices' holds 4 at \[2\]"):
        run(op, {"x": x, "indices": np.array([0, 0, 4]), "out_grad": normal(3)}, attrs)
    with pytest.raises(ValueError, match=rf"{op}: indices has shape \[4\], expected \[3\]"):
        run(op, {"x": x, "indices": np.array([0, 0, 0, 0]), "out_grad": normal(3)}, attrs)


# ------------------------------------------------------------------------------------------
# nanmedian

def nanmedian_oracle(inputs, attrs):
    """Paddle 3.3.1's binding is nanmedian_grad(x, out, medians, out_grad, axis, keepdim, mode)
    (the YAML has no ``out``): the forward supplies out; the grad spreads out_grad evenly over
    the elements equal to out (index-based only for one axis and mode 'min')."""
    x = to_paddle(inputs["x"])
    out, med = _c("nanmedian")(x, list(attrs["axis"]), attrs["keepdim"], attrs["mode"])
    r = _c("nanmedian_grad")(x, out, to_paddle(inputs["medians"]), to_paddle(inputs["out_grad"]),
                             list(attrs["axis"]), attrs["keepdim"], attrs["mode"])
    return {"x_grad": from_paddle(r)}


def _nanmedian_inputs(x, axis, keepdim, mode, seed=1):
    out, med = _c("nanmedian")(to_paddle(x), list(axis), keepdim, mode)
    return {"x": x, "medians": med.numpy(), "out_grad": normal(*out.shape, seed=seed)}


def _with_nans(shape, seed=0):
    x = ties(*shape, seed=seed)
    flat = x.reshape(-1)
    flat[rng(seed + 7).permutation(flat.size)[: flat.size // 5]] = np.nan
    return x


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["avg", "min"])
def test_nanmedian_dtypes(mode, dtype):
    x = _with_nans((5, 8))
    x[3] = np.nan                                   # a row of NaN only
    attrs = {"axis": [1], "keepdim": False, "mode": mode}
    check("nanmedian_grad", _nanmedian_inputs(x, [1], False, mode), attrs, dtype,
          oracle=nanmedian_oracle)


NANMEDIAN = [((3, 4), [1], True), ((3, 4), [0], False), ((2, 4), [], False),
             ((2, 3, 4), [0, 2], False), ((2, 3, 4), [-1, 0], True), ((2, 3, 4), [1], False),
             ((2, 3, 4), [], True), ((7,), [0], False), ((2, 3, 4), [0, 1, 2], False)]


@pytest.mark.parametrize("mode", ["avg", "min"])
@pytest.mark.parametrize("shape,axis,keepdim", NANMEDIAN)
def test_nanmedian_axes(shape, axis, keepdim, mode):
    x = _with_nans(shape, seed=len(shape) + len(axis))
    attrs = {"axis": axis, "keepdim": keepdim, "mode": mode}
    check("nanmedian_grad", _nanmedian_inputs(x, axis, keepdim, mode), attrs, oracle=nanmedian_oracle)


def test_nanmedian_bad_input():
    x = normal(3, 4)
    inputs = _nanmedian_inputs(x, [1], False, "avg")
    attrs = {"axis": [1], "keepdim": False, "mode": "avg"}
    with pytest.raises(ValueError, match=r"nanmedian_grad: input 'medians' holds 4"):
        run("nanmedian_grad", dict(inputs, medians=inputs["medians"] * 0 + 4), attrs)
    with pytest.raises(ValueError, match=r"nanmedian_grad: input 'medians' holds -2"):
        run("nanmedian_grad", dict(inputs, medians=inputs["medians"] * 0 - 2), attrs)
    with pytest.raises(ValueError, match=r"nanmedian_grad: medians has shape \[3\], expected 3 "
                                         r"pairs of indices"):
        run("nanmedian_grad", dict(inputs, medians=inputs["medians"][:, 0]), attrs)
    with pytest.raises(ValueError, match=r"nanmedian_grad: attribute 'mode' is 'max'"):
        run("nanmedian_grad", inputs, dict(attrs, mode="max"))
    with pytest.raises(ValueError, match=r"nanmedian_grad: out_grad has 4 elements, expected 3"):
        run("nanmedian_grad", dict(inputs, out_grad=normal(4)), attrs)
