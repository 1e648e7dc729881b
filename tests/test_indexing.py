"""Indexing, scatter and graph grads against Paddle 3.3.1 (te_defs/indexing.py).

Every op runs in every dtype; indices repeat (scatter-adds accumulate), count from the end where
Paddle allows it, and are rejected cleanly where they are out of range. The deterministic=False
(atomic) variants are compared with the deterministic kernels; linear grads satisfy the adjoint
identity against their forward in float64. Where Paddle is wrong the comparison is with numpy and
the comment says why.
"""

import math

import numpy as np
import pytest

import tvmgrad
from harness import CPLX, FLOATS, INTLIKE, agree, extra_dtypes, c_ops, cast, check, data, from_paddle, rng, to_paddle
from tvmgrad.infer_meta import TensorMeta


def normal(*shape, seed=0):
    return rng(seed).standard_normal(shape)


def run(op, inputs, attrs=None, dtype="float64", **options):
    return tvmgrad.run(op, {k: cast(v, dtype) for k, v in inputs.items()}, attrs, **options)


def adjoint(forward, grad_op, x, idx_inputs, attrs, out_shape, wrt="x_grad", extra=None, seed=3):
    """<A x, y> == <x, A^T y> in float64 with A = ``forward`` (numpy) and A^T our grad."""
    y = normal(*out_shape, seed=seed)
    got = run(grad_op, {**idx_inputs, **(extra or {}), "out_grad": y}, attrs)[wrt]
    lhs = float(np.sum(forward(x) * y))
    rhs = float(np.sum(x * got))
    assert abs(lhs - rhs) <= 1e-10 * (1 + abs(lhs)), (lhs, rhs)


# ------------------------------------------------------------------------------------------
# gather / index_select

GATHER_CASES = {
    "axis1": ((4, 6), np.array([1, 3, 1, -1, 5]), 1),
    "axis0": ((5, 3), np.array([4, 0, 4, 4]), 0),
    "neg_axis_3d": ((2, 3, 4), np.array([0, 3, -4]), -1),
    "mid_axis": ((2, 5, 3), np.array([2, 2, 0]), 1),
    "size1": ((1, 4, 1), np.array([3, 3]), 1),
    "rank1": ((6,), np.array([5, -1, 0]), 0),
}


def _gather_inputs(shape, index, axis, seed=0, op="gather_grad"):
    ax = axis % len(shape)
    if op == "index_select_grad":
        index = index % shape[ax]          # see test_index_select_negative_index
    g_shape = shape[:ax] + index.shape + shape[ax + 1:]
    return {"x": normal(*shape, seed=seed), "index": index, "out_grad": normal(*g_shape, seed=seed + 1)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["gather_grad", "index_select_grad"])
def test_gather_like_dtypes(op, dtype):
    shape, index, axis = GATHER_CASES["axis1"]
    check(op, _gather_inputs(shape, index, axis, op=op), {"axis": axis}, dtype)


@pytest.mark.parametrize("case", sorted(GATHER_CASES))
@pytest.mark.parametrize("op", ["gather_grad", "index_select_grad"])
def test_gather_like_axes(op, case):
    shape, index, axis = GATHER_CASES[case]
    check(op, _gather_inputs(shape, index, axis, op=op), {"axis": axis}, "float64")


def test_index_select_negative_index():
    """index_select wraps a negative index by the axis size (so does our grad); Paddle 3.3.1's
    index_select_grad wraps it by the number of indices instead (index [1, -1] sends the second
    column's grad to column 1), which is not the forward's adjoint: the reference is the call with
    the indices wrapped."""
    inputs = _gather_inputs((4, 6), np.array([1, -1, -6, 5]), 1)
    got = run("index_select_grad", inputs, {"axis": 1})["x_grad"]
    want = run("index_select_grad", dict(inputs, index=inputs["index"] % 6), {"axis": 1})["x_grad"]
    np.testing.assert_array_equal(got, want)
    x = normal(4, 6)
    adjoint(lambda a: np.take(a, inputs["index"], axis=1), "index_select_grad", x,
            {"x": x, "index": inputs["index"]}, {"axis": 1}, (4, 4))


def test_gather_index_forms():
    """0-d index (the axis is dropped), [N, 1] index, int32 index, no index at all."""
    x = normal(4, 3)
    check("gather_grad", {"x": x, "index": np.array(2), "out_grad": normal(3)}, {"axis": 0})
    check("gather_grad", {"x": x, "index": np.array(1), "out_grad": normal(4)}, {"axis": 1})
    check("gather_grad", {"x": x, "index": np.array([[1], [2], [1]]), "out_grad": normal(3, 3)},
          {"axis": 0})
    check("gather_grad", {"x": x, "index": np.array([2, 0, 2], "int32"), "out_grad": normal(4, 3)},
          {"axis": 1})
    got = run("gather_grad", {"x": x, "index": np.zeros(0, "int64"), "out_grad": normal(0, 3)},
              {"axis": 0})["x_grad"]
    np.testing.assert_array_equal(got, np.zeros((4, 3)))


def test_gather_x_is_shape_only():
    """x is no_need_buffer: a TensorMeta will do."""
    g = normal(3, 4)
    got = tvmgrad.run("gather_grad", {"x": TensorMeta((5, 4), "float64"), "index": np.array([4, 0, 4]),
                                      "out_grad": g}, {"axis": 0})["x_grad"]
    want = np.zeros((5, 4))
    np.add.at(want, [4, 0, 4], g)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["gather_grad", "index_select_grad"])
def test_gather_like_adjoint(op):
    x = normal(3, 7, 2, seed=5)
    index = np.array([6, 0, 6, -7, 3])
    adjoint(lambda a: np.take(a, index, axis=1), op, x, {"x": x, "index": index}, {"axis": 1},
            (3, 5, 2))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["gather_grad", "index_select_grad"])
def test_gather_like_atomic_variant(op, dtype):
    """deterministic=False (atomics on CUDA; a serial loop here) agrees with the default kernel,
    which is bit-identical from run to run."""
    idx = rng(1).integers(-6, 6, 200)
    inputs = _gather_inputs((3, 6, 5), idx, 1)
    first = run(op, inputs, {"axis": 1}, dtype)["x_grad"]
    again = run(op, inputs, {"axis": 1}, dtype)["x_grad"]
    np.testing.assert_array_equal(first, again)
    racy = run(op, inputs, {"axis": 1}, dtype, deterministic=False)["x_grad"]
    np.testing.assert_allclose(racy, first, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)


@pytest.mark.parametrize("op", ["gather_grad", "index_select_grad"])
def test_gather_like_bad_input(op):
    inputs = _gather_inputs((4, 6), np.array([1, 6]), 1)
    with pytest.raises(ValueError, match=rf"{op}: input 'index' holds 6 at \[1\], out of range"):
        run(op, inputs, {"axis": 1})
    inputs["index"] = np.array([1, -7])
    with pytest.raises(ValueError, match=rf"{op}: input 'index' holds -7"):
        run(op, inputs, {"axis": 1})
    inputs["index"] = np.array([1, 2])
    with pytest.raises(ValueError, match=rf"{op}: out_grad has shape \[4, 2\], expected \[2, 6\]"):
        run(op, inputs, {"axis": 0})
    with pytest.raises(ValueError, match=rf"{op}: attribute 'axis' = 2 is out of range"):
        run(op, inputs, {"axis": 2})
    inputs["index"] = np.array([1.0, 2.0])
    with pytest.raises(TypeError, match=rf"{op}: input 'index' has dtype float64"):
        run(op, inputs, {"axis": 1})


# ------------------------------------------------------------------------------------------
# gather_nd / scatter_nd_add

def _gather_nd(x, index):
    k = index.shape[-1]
    flat = index.reshape(-1, k)
    rows = [x[tuple(i)] for i in flat]
    return np.array(rows).reshape(index.shape[:-1] + x.shape[k:])


GATHER_ND = {
    "rows": ((4, 3, 2), np.array([[1], [3], [-4], [1]])),
    "pairs": ((4, 3, 2), np.array([[[1, 2], [3, 0]], [[1, 2], [0, -1]]])),
    "full": ((4, 3), np.array([[1, 2], [3, 0], [1, 2]])),
    "none": ((4, 3), np.zeros((3, 0), "int64")),
    "one_index": ((4, 3), np.array([2])),
}


@pytest.mark.parametrize("dtype", FLOATS)
def test_gather_nd_dtypes(dtype):
    shape, index = GATHER_ND["pairs"]
    g = normal(*(index.shape[:-1] + shape[index.shape[-1]:]))
    check("gather_nd_grad", {"x": normal(*shape), "index": index, "out_grad": g}, {}, dtype)


@pytest.mark.parametrize("case", sorted(GATHER_ND))
def test_gather_nd_forms(case):
    shape, index = GATHER_ND[case]
    g = normal(*(index.shape[:-1] + shape[index.shape[-1]:]))
    check("gather_nd_grad", {"x": normal(*shape), "index": index, "out_grad": g}, {}, "float64")


def test_gather_nd_adjoint_and_atomic():
    x = normal(5, 4, 3, seed=2)
    index = rng(4).integers(-4, 4, (30, 2))
    adjoint(lambda a: _gather_nd(a, index), "gather_nd_grad", x, {"x": x, "index": index}, {},
            (30, 3))
    g = normal(30, 3)
    det = run("gather_nd_grad", {"x": x, "index": index, "out_grad": g}, {}, "float32")["x_grad"]
    racy = run("gather_nd_grad", {"x": x, "index": index, "out_grad": g}, {}, "float32",
               deterministic=False)["x_grad"]
    np.testing.assert_allclose(racy, det, rtol=1e-5, atol=1e-6)


def test_gather_nd_bad_input():
    x, g = normal(4, 3), normal(2)
    with pytest.raises(ValueError, match=r"gather_nd_grad: input 'index' holds 3 at \[1\], out of "
                                         r"range in column 1"):
        run("gather_nd_grad", {"x": x, "index": np.array([[1, 0], [2, 3]]), "out_grad": g})
    with pytest.raises(ValueError, match=r"gather_nd_grad: out_grad has shape \[3\], expected \[2\]"):
        run("gather_nd_grad", {"x": x, "index": np.array([[1, 0], [2, 2]]), "out_grad": normal(3)})
    with pytest.raises(ValueError, match=r"gather_nd_grad: index's last dim \(3\) exceeds"):
        run("gather_nd_grad", {"x": x, "index": np.array([[1, 0, 0]]), "out_grad": normal(1)})


@pytest.mark.parametrize("dtype", FLOATS)
def test_scatter_nd_add_dtypes(dtype):
    index = np.array([[1, 0], [3, -1], [1, 0]])
    check("scatter_nd_add_grad", {"index": index, "updates": normal(3, 5), "out_grad": normal(4, 2, 5)},
          {}, dtype)


def test_scatter_nd_add_forms_and_alias():
    g = normal(4, 3)
    check("scatter_nd_add_grad", {"index": np.array([[2], [0]]), "updates": normal(2, 3),
                                  "out_grad": g}, {}, "float64")
    check("scatter_nd_add_grad", {"index": np.zeros((2, 0), "int64"), "updates": normal(2, 4, 3),
                                  "out_grad": g}, {}, "float64")
    # x_grad is out_grad itself: no kernel, a view when aliasing is allowed
    res = tvmgrad.run("scatter_nd_add_grad", {"index": np.array([[1, 1]]),
                                              "updates": TensorMeta((1,), "float64"), "out_grad": g},
                      alias=True)
    assert np.shares_memory(res["x_grad"], g)
    np.testing.assert_array_equal(res["updates_grad"], [g[1, 1]])
    with pytest.raises(ValueError, match=r"scatter_nd_add_grad: input 'index' holds 4"):
        run("scatter_nd_add_grad", {"index": np.array([[4]]), "updates": normal(1, 3), "out_grad": g})
    with pytest.raises(ValueError, match=r"scatter_nd_add_grad: updates has shape \[2\]"):
        run("scatter_nd_add_grad", {"index": np.array([[1]]), "updates": normal(2), "out_grad": g})


# ------------------------------------------------------------------------------------------
# index_add / index_sample / index_select_strided

@pytest.mark.parametrize("dtype", FLOATS)
def test_index_add_dtypes(dtype):
    check("index_add_grad", {"index": np.array([0, 2, -1, 0]), "add_value": normal(3, 4, 2),
                             "out_grad": normal(3, 5, 2)}, {"axis": 1}, dtype)


def test_index_add_forms():
    check("index_add_grad", {"index": np.array([4, 4]), "add_value": normal(2, 3),
                             "out_grad": normal(5, 3)}, {"axis": 0}, "float64")
    check("index_add_grad", {"index": np.array([1], "int32"), "add_value": normal(2, 1),
                             "out_grad": normal(2, 3)}, {"axis": -1}, "float64")
    g = normal(4, 3)
    got = tvmgrad.run("index_add_grad", {"index": np.array([1, 3]), "add_value": normal(2, 3),
                                         "out_grad": g}, {"axis": 0}, alias=True)
    assert np.shares_memory(got["x_grad"], g)
    with pytest.raises(ValueError, match=r"index_add_grad: input 'index' holds 4"):
        run("index_add_grad", {"index": np.array([4]), "add_value": normal(1, 3), "out_grad": g},
            {"axis": 0})
    with pytest.raises(ValueError, match=r"index_add_grad: add_value has shape \[2, 3\], expected"):
        run("index_add_grad", {"index": np.array([1]), "add_value": normal(2, 3), "out_grad": g},
            {"axis": 0})


def test_index_add_inplace():
    g = normal(4, 3).astype("float32")
    value = normal(2, 3).astype("float32")
    expected = tvmgrad.run("index_add_grad", {"index": np.array([1, 3]), "add_value": value,
                                              "out_grad": g.copy()}, {"axis": 0})
    buf = g.copy()
    got = tvmgrad.run("index_add_grad", {"index": np.array([1, 3]), "add_value": value,
                                         "out_grad": buf}, {"axis": 0}, inplace=True)
    assert got["x_grad"] is buf
    np.testing.assert_array_equal(got["add_value_grad"], expected["add_value_grad"])
    np.testing.assert_array_equal(buf, g)


@pytest.mark.parametrize("dtype", FLOATS)
def test_index_sample_dtypes(dtype):
    index = np.array([[0, 0, 4, 4], [1, 2, 1, 1], [3, 3, 3, 0]])
    check("index_sample_grad", {"x": normal(3, 5), "index": index, "out_grad": normal(3, 4)}, {},
          dtype)


def test_index_sample_more():
    index = rng(2).integers(0, 7, (4, 30))
    x = normal(4, 7)
    check("index_sample_grad", {"x": x, "index": index.astype("int32"), "out_grad": normal(4, 30)})
    check("index_sample_grad", {"x": normal(2, 3), "index": np.zeros((2, 0), "int64"),
                                "out_grad": normal(2, 0)})
    adjoint(lambda a: np.take_along_axis(a, index, axis=1), "index_sample_grad", x,
            {"x": x, "index": index}, {}, (4, 30))
    g = normal(4, 30)
    det = run("index_sample_grad", {"x": x, "index": index, "out_grad": g}, None, "float32")["x_grad"]
    racy = run("index_sample_grad", {"x": x, "index": index, "out_grad": g}, None, "float32",
               deterministic=False)["x_grad"]
    np.testing.assert_allclose(racy, det, rtol=1e-5, atol=1e-6)
    # Paddle rejects negative indices here too (no wrapping)
    with pytest.raises(ValueError, match=r"index_sample_grad: input 'index' holds -1"):
        run("index_sample_grad", {"x": x, "index": -np.ones((4, 1), "int64"), "out_grad": normal(4, 1)})
    with pytest.raises(ValueError, match=r"index_sample_grad: index has 3 rows but x has 4"):
        run("index_sample_grad", {"x": x, "index": np.zeros((3, 1), "int64"), "out_grad": normal(3, 1)})


@pytest.mark.parametrize("dtype", FLOATS)
def test_index_select_strided_dtypes(dtype):
    check("index_select_strided_grad", {"x": normal(3, 4, 2), "out_grad": normal(3, 2)},
          {"index": 2, "axis": 1}, dtype)


def test_index_select_strided_axes_and_errors():
    for shape, index, axis in (((5,), 4, 0), ((2, 3, 4), 0, -1), ((2, 3, 4), 1, 0)):
        g_shape = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
        check("index_select_strided_grad", {"x": normal(*shape), "out_grad": normal(*g_shape)},
              {"index": index, "axis": axis}, "float64")
    # Paddle 3.3.1 reads out of bounds for a negative index (the forward returns garbage): rejected
    with pytest.raises(ValueError, match=r"index_select_strided_grad: attribute 'index' is -1"):
        run("index_select_strided_grad", {"x": normal(3, 4), "out_grad": normal(3)},
            {"index": -1, "axis": 1})
    with pytest.raises(ValueError, match=r"index_select_strided_grad: attribute 'index' is 4"):
        run("index_select_strided_grad", {"x": normal(3, 4), "out_grad": normal(3)},
            {"index": 4, "axis": 1})


# ------------------------------------------------------------------------------------------
# masked_select / where / multiplex

MASKED = {"same": ((4, 5), (4, 5)), "mask_row": ((3, 4), (4,)), "x_row": ((4,), (3, 4)),
          "both": ((5, 1, 3), (4, 1)), "empty": ((0, 3), (3,)), "scalar_mask": ((2, 3), ())}


@pytest.mark.parametrize("dtype", FLOATS)
def test_masked_select_dtypes(dtype):
    mask = rng(3).random((6, 7)) > 0.4
    check("masked_select_grad", {"x": normal(6, 7), "mask": mask,
                                 "out_grad": normal(int(mask.sum()))}, {}, dtype)


@pytest.mark.parametrize("case", sorted(MASKED))
def test_masked_select_broadcast(case):
    xs, ms = MASKED[case]
    mask = rng(4).random(ms) > 0.5 if ms else np.array(True)
    n = int(np.broadcast_to(mask, np.broadcast_shapes(xs, ms)).sum())
    check("masked_select_grad", {"x": normal(*xs), "mask": mask, "out_grad": normal(n)})


def test_masked_select_long_and_adjoint():
    """A long mask walks many scan chunks (and their carries)."""
    mask = rng(5).random(20011) > 0.3
    x = normal(20011, seed=6)
    check("masked_select_grad", {"x": x, "mask": mask, "out_grad": normal(int(mask.sum()))})
    adjoint(lambda a: a[mask], "masked_select_grad", x, {"x": x, "mask": mask}, {},
            (int(mask.sum()),))


def test_masked_select_bad_input():
    mask = np.array([True, False, True])
    with pytest.raises(ValueError, match=r"masked_select_grad: mask selects 2 elements but out_grad "
                                         r"has 3"):
        run("masked_select_grad", {"x": normal(3), "mask": mask, "out_grad": normal(3)})
    with pytest.raises(ValueError, match=r"masked_select_grad: shapes do not broadcast"):
        run("masked_select_grad", {"x": normal(4), "mask": mask, "out_grad": normal(2)})
    with pytest.raises(TypeError, match=r"masked_select_grad: input 'mask' has dtype int64"):
        run("masked_select_grad", {"x": normal(3), "mask": np.array([1, 0, 1]), "out_grad": normal(2)})


@pytest.mark.parametrize("dtype", FLOATS)
def test_where_dtypes(dtype):
    cond = rng(2).random((4, 5)) > 0.5
    g = normal(4, 5)
    g[0, 0], g[1, 1], g[2, 2] = np.inf, -np.inf, np.nan
    check("where_grad", {"condition": cond, "x": normal(4, 5), "y": normal(4, 5), "out_grad": g},
          {}, dtype)


WHERE_BCAST = {"x_row": ((3, 4), (4,), (3, 4)), "y_col": ((3, 4), (3, 4), (3, 1)),
               "cond_row": ((4,), (3, 4), (3, 4)), "all": ((2, 1, 4), (3, 1), (1,))}


@pytest.mark.parametrize("case", sorted(WHERE_BCAST))
def test_where_broadcast(case):
    """Paddle 3.3.1's where_grad reads past its buffers when condition/x/y differ in shape (the x
    grad of a broadcast x is just the first elements); the reference is numpy: the grads summed
    over the broadcast dims."""
    cs, xs, ys = WHERE_BCAST[case]
    cond = rng(7).random(cs) > 0.5
    full = np.broadcast_shapes(cs, xs, ys)
    g = normal(*full)
    got = run("where_grad", {"condition": cond, "x": normal(*xs), "y": normal(*ys), "out_grad": g})
    c = np.broadcast_to(cond, full)
    for name, shape, part in (("x_grad", xs, np.where(c, g, 0)), ("y_grad", ys, np.where(c, 0, g))):
        lead = len(full) - len(shape)
        axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(shape) if n == 1 and full[lead + d] != 1)
        want = part.sum(axis=axes).reshape(shape) if axes else part
        np.testing.assert_allclose(got[name], want, rtol=1e-12, err_msg=name)


def test_where_bad_input():
    cond = np.array([True, False])
    with pytest.raises(ValueError, match=r"where_grad: out_grad has shape \[3\], expected"):
        run("where_grad", {"condition": cond, "x": normal(2), "y": normal(2), "out_grad": normal(3)})
    with pytest.raises(ValueError, match=r"where_grad: shapes do not broadcast"):
        run("where_grad", {"condition": cond, "x": normal(3), "y": normal(2), "out_grad": normal(2)})
    with pytest.raises(TypeError, match=r"where_grad: input 'condition' has dtype float64"):
        run("where_grad", {"condition": normal(2), "x": normal(2), "y": normal(2), "out_grad": normal(2)})


def multiplex_oracle(inputs, attrs):
    """_C_ops.multiplex_grad(inputs, index, out_grad) fails in Paddle 3.3.1 ("Output(X@GRAD)
    should not be null"): differentiate the forward multiplex instead."""
    import paddle
    ins = [to_paddle(a) for a in inputs["inputs"]]
    for t in ins:
        t.stop_gradient = False
    out = paddle.multiplex(ins, to_paddle(inputs["index"]))
    grads = paddle.grad([out], ins, [to_paddle(inputs["out_grad"])], allow_unused=True)
    return {"inputs_grad": [from_paddle(g) if g is not None else np.zeros_like(a)
                            for g, a in zip(grads, inputs["inputs"])]}


def run_list_outputs(op, inputs, attrs=None):
    """Run an op with a Tensor[] output through its prepared kernel (the runtime's Launch does not
    allocate Tensor[] outputs yet)."""
    from tvmgrad.dtypes import dtype as as_dtype
    from tvmgrad.runtime import aligned_empty, to_tvm
    launch = tvmgrad.prepare(op, inputs, attrs)
    outs = {o.name: ([aligned_empty(m.shape, m.dtype.numpy) for m in meta] if isinstance(meta, list)
                     else aligned_empty(meta.shape, meta.dtype.numpy))
            for o, meta in zip(launch.op.spec.outputs, launch.outputs)}
    args = []
    for a in launch.plan.args:
        if a.kind == "scalar":
            args.append(a.value)
            continue
        arr = launch.call.tensors[a.name] if a.kind == "input" else outs[a.name]
        if a.index is not None:
            arr = arr[a.index]
        args.append(to_tvm(arr, a.shape, as_dtype(arr.dtype)))
    launch.function(*args)
    return outs


@pytest.mark.parametrize("dtype", FLOATS)
def test_multiplex(dtype):
    inputs = {"inputs": [normal(5, 2, 3, seed=i) for i in range(3)],
              "index": np.array([[2], [0], [2], [1], [0]], "int32"), "out_grad": normal(5, 2, 3)}
    cast_inputs = {k: cast(v, dtype) for k, v in inputs.items()}
    got = run_list_outputs("multiplex_grad", cast_inputs)["inputs_grad"]
    want = multiplex_oracle({k: cast(v, "float32" if dtype in ("float16", "bfloat16") else dtype)
                             for k, v in inputs.items()}, {})["inputs_grad"]
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.astype("float64"), cast(w, dtype).astype("float64"))


def test_multiplex_bad_input():
    ins = [normal(2, 3), normal(2, 3)]
    with pytest.raises(ValueError, match=r"multiplex_grad: input 'index' holds 2 at \[1, 0\]"):
        tvmgrad.prepare("multiplex_grad", {"inputs": ins, "index": np.array([[0], [2]]),
                                           "out_grad": normal(2, 3)})
    with pytest.raises(ValueError, match=r"multiplex_grad: index has 3 rows but out_grad has 2"):
        tvmgrad.prepare("multiplex_grad", {"inputs": ins, "index": np.array([[0], [1], [0]]),
                                           "out_grad": normal(2, 3)})


# ------------------------------------------------------------------------------------------
# take_along_axis / put_along_axis

TAKE = {"last": ((3, 4), np.array([[0, 0], [3, 1], [2, -2]]), 1),
        "first": ((4, 3), np.array([[0, 2, 1], [3, 3, 3]]), 0),
        "shorter": ((3, 4), np.array([[0, 3], [3, 1]]), 1),
        "shorter0": ((3, 4, 2), np.array([[[0], [2]], [[1], [1]]]), 0),
        "mid": ((2, 5, 3), np.array([[[4, 0, 4]] * 6] * 2), 1)}


@pytest.mark.parametrize("dtype", FLOATS)
def test_take_along_axis_dtypes(dtype):
    shape, idx, axis = TAKE["last"]
    check("take_along_axis_grad", {"arr": normal(*shape), "indices": idx,
                                   "out_grad": normal(*idx.shape)}, {"axis": axis}, dtype)


@pytest.mark.parametrize("case", sorted(TAKE))
def test_take_along_axis_forms(case):
    shape, idx, axis = TAKE[case]
    check("take_along_axis_grad", {"arr": normal(*shape), "indices": idx,
                                   "out_grad": normal(*idx.shape)}, {"axis": axis})


@pytest.mark.parametrize("shape, idx_shape, axis", [((2, 7, 70), (2, 9, 70), 1),
                                                    ((3, 6), (3, 0), 1), ((2, 5, 3), (2, 0, 3), 1)])
def test_take_along_axis_own_columns(shape, idx_shape, axis):
    """Each column zeroes its own destination: a strip of whole vectors and a tail (70 columns
    after the axis), and an empty axis, where nothing walks a column (numpy's add.at)."""
    idx = rng(5).integers(-shape[axis], shape[axis], idx_shape)
    g = normal(*idx_shape)
    want = np.zeros(shape)
    grid = np.indices(idx_shape)
    grid[axis] = np.where(idx < 0, idx + shape[axis], idx)
    np.add.at(want, tuple(grid), g)
    got = run("take_along_axis_grad", {"arr": normal(*shape), "indices": idx, "out_grad": g},
              {"axis": axis})["arr_grad"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_take_along_axis_adjoint_atomic_errors():
    arr = normal(4, 9, 3)
    idx = rng(6).integers(-9, 9, (4, 20, 3))
    adjoint(lambda a: np.take_along_axis(a, idx, axis=1), "take_along_axis_grad", arr,
            {"arr": arr, "indices": idx}, {"axis": 1}, (4, 20, 3), wrt="arr_grad")
    g = normal(4, 20, 3)
    det = run("take_along_axis_grad", {"arr": arr, "indices": idx, "out_grad": g}, {"axis": 1},
              "float32")["arr_grad"]
    racy = run("take_along_axis_grad", {"arr": arr, "indices": idx, "out_grad": g}, {"axis": 1},
               "float32", deterministic=False)["arr_grad"]
    np.testing.assert_allclose(racy, det, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"take_along_axis_grad: input 'indices' holds 9"):
        run("take_along_axis_grad", {"arr": arr[:, :, 0], "indices": np.array([[9]]),
                                     "out_grad": normal(1, 1)}, {"axis": 1})
    with pytest.raises(ValueError, match=r"take_along_axis_grad: indices has shape \[5, 1\]; dim 0 "
                                         r"exceeds"):
        run("take_along_axis_grad", {"arr": arr[:, :, 0], "indices": np.zeros((5, 1), "int64"),
                                     "out_grad": normal(5, 1)}, {"axis": 1})


PUT_MODES = [(r, inc) for r in ("assign", "add", "mean", "mul", "amin", "amax") for inc in (True, False)]


def _put_inputs(reduce, include_self, seed=0, shape=(3, 5), idx=None):
    import paddle
    arr = np.round(normal(*shape, seed=seed) * 2) / 2         # ties between values and arr
    idx = np.array([[0, 0, 4], [3, 1, 3], [2, 2, 2]]) if idx is None else idx
    values = np.round(normal(*idx.shape, seed=seed + 1) * 2) / 2
    out = paddle._C_ops.put_along_axis(to_paddle(arr), to_paddle(idx), to_paddle(values), 1,
                                       reduce, include_self).numpy()
    return {"arr": arr, "indices": idx, "values": values, "out": out,
            "out_grad": normal(*shape, seed=seed + 2)}


@pytest.mark.parametrize("reduce,include_self", PUT_MODES)
def test_put_along_axis_modes(reduce, include_self):
    attrs = {"axis": 1, "reduce": reduce, "include_self": include_self}
    check("put_along_axis_grad", _put_inputs(reduce, include_self), attrs, "float64")


@pytest.mark.parametrize("dtype", FLOATS)
def test_put_along_axis_dtypes(dtype):
    attrs = {"axis": 1, "reduce": "mean", "include_self": True}
    check("put_along_axis_grad", _put_inputs("mean", True), attrs, dtype)


def test_put_along_axis_shorter_index():
    attrs = {"axis": 1, "reduce": "assign", "include_self": True}
    check("put_along_axis_grad", _put_inputs("assign", True, idx=np.array([[0, 4], [4, 4]])), attrs)


def test_put_along_axis_negative_index():
    """Negative indices count from the end, as in the forward; Paddle 3.3.1's grad kernel does not
    wrap them (it zeroes/reads the element before the row), so the reference is the same call with
    the indices wrapped."""
    attrs = {"axis": 1, "reduce": "add", "include_self": False}
    inputs = _put_inputs("add", False)
    wrapped = run("put_along_axis_grad", inputs, attrs)
    neg = dict(inputs, indices=inputs["indices"] - 5)
    got = run("put_along_axis_grad", neg, attrs)
    for k in wrapped:
        np.testing.assert_array_equal(got[k], wrapped[k])
    assert got["values_grad"].dtype == np.float64


def test_put_along_axis_bad_input():
    inputs = _put_inputs("add", True)
    with pytest.raises(ValueError, match=r"put_along_axis_grad: attribute 'reduce' is 'max'"):
        run("put_along_axis_grad", inputs, {"axis": 1, "reduce": "max", "include_self": True})
    with pytest.raises(ValueError, match=r"put_along_axis_grad: values has shape \[3, 2\]"):
        run("put_along_axis_grad", dict(inputs, values=normal(3, 2)),
            {"axis": 1, "reduce": "add", "include_self": True})
    with pytest.raises(ValueError, match=r"put_along_axis_grad: input 'indices' holds 5"):
        run("put_along_axis_grad", dict(inputs, indices=inputs["indices"] + 1),
            {"axis": 1, "reduce": "add", "include_self": True})


# ------------------------------------------------------------------------------------------
# scatter / index_put

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("overwrite", [True, False])
def test_scatter_dtypes(overwrite, dtype):
    check("scatter_grad", {"index": np.array([1, 3, 1, -1]), "updates": normal(4, 2, 3),
                           "out_grad": normal(5, 2, 3)}, {"overwrite": overwrite}, dtype)


def test_scatter_forms_and_errors():
    check("scatter_grad", {"index": np.array([[2], [0]]), "updates": normal(2, 3),
                           "out_grad": normal(4, 3)}, {"overwrite": True})
    check("scatter_grad", {"index": np.array([2, 2], "int32"), "updates": normal(2),
                           "out_grad": normal(4)}, {"overwrite": False})
    with pytest.raises(ValueError, match=r"scatter_grad: input 'index' holds 4"):
        run("scatter_grad", {"index": np.array([4]), "updates": normal(1, 3), "out_grad": normal(4, 3)},
            {"overwrite": True})
    with pytest.raises(ValueError, match=r"scatter_grad: updates has shape \[2, 2\], expected \[2, 3\]"):
        run("scatter_grad", {"index": np.array([1, 0]), "updates": normal(2, 2),
                             "out_grad": normal(4, 3)}, {"overwrite": True})


INDEX_PUT = {
    "rows": ((4, 3, 5), [np.array([1, 3, 1])], (3, 3, 5)),
    "rows_bvalue": ((4, 3, 5), [np.array([1, -1, 1])], (5,)),
    "pairs": ((4, 3, 5), [np.array([1, 3, 1]), np.array([0, 2, 0])], (3, 5)),
    "bcast_index": ((4, 3, 5), [np.array([[1], [3]]), np.array([0, 2, 0])], (2, 3, 1)),
    "full_scalar": ((4, 3, 5), [np.array([[1], [3]]), np.array([0, 2, 0]), np.array([4])], (1,)),
    "full": ((4, 3, 5), [np.array([[1], [3]]), np.array([0, 2, -3]), np.array([4])], (2, 3)),
}


@pytest.mark.parametrize("dtype", FLOATS)
def test_index_put_dtypes(dtype):
    x, ind, v = INDEX_PUT["pairs"]
    check("index_put_grad", {"x": normal(*x), "indices": ind, "value": normal(*v),
                             "out_grad": normal(*x)}, {"accumulate": False}, dtype)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("case", sorted(INDEX_PUT))
def test_index_put_forms(case, accumulate):
    x, ind, v = INDEX_PUT[case]
    check("index_put_grad", {"x": normal(*x), "indices": ind, "value": normal(*v),
                             "out_grad": normal(*x)}, {"accumulate": accumulate})


def test_index_put_bad_input():
    x = normal(4, 3)
    with pytest.raises(ValueError, match=r"index_put_grad: input 'indices\[1\]' holds 3"):
        run("index_put_grad", {"x": x, "indices": [np.array([1]), np.array([3])], "value": normal(1),
                               "out_grad": x}, {"accumulate": False})
    with pytest.raises(ValueError, match=r"index_put_grad: value has shape \[2\], which does not "
                                         r"broadcast"):
        run("index_put_grad", {"x": x, "indices": [np.array([1, 2, 3])], "value": normal(2),
                               "out_grad": x}, {"accumulate": False})


MASK = np.zeros((4, 3), bool)
MASK[[1, 3, 0, 3], [2, 0, 1, 1]] = True
INDEX_PUT_MASKS = {
    # x (4, 3, 5) throughout; the value shapes broadcast to x[mask]'s (nnz, 5) etc.
    "mask2d_rows": ([MASK], (4, 5)),
    "mask2d_bvalue": ([MASK], (5,)),
    "mask2d_scalar": ([MASK], (1,)),
    "mask2d_col": ([MASK], (4, 1)),
    "mask1d": ([np.array([True, False, True, True])], (3, 3, 5)),
    "mask1d_bvalue": ([np.array([True, False, True, True])], (3, 1, 5)),
    "mask3d": ([rng(3).random((4, 3, 5)) > 0.5], (1,)),
    "mask_then_int": ([np.array([True, False, True, True]), np.array([0, 2, -1])], (3, 5)),
    "int_then_mask": ([np.array([1, 2]), np.array([True, False, True])], (2, 5)),
    "smaller_mask": ([np.array([[True, False], [False, True]])], (5,)),    # Paddle allows it
    "all_false": ([np.zeros((4, 3), bool)], (5,)),
    "all_false_odd_value": ([np.zeros((4, 3), bool)], (2, 7)),             # nothing is checked then
}


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("case", sorted(INDEX_PUT_MASKS))
def test_index_put_bool_masks(case, accumulate):
    """Bool mask indices, converted to their nonzero() indices on the host as Paddle's
    DealWithBoolIndices does (a mask of rank r addresses r dims; masks and int indices mix); a
    mask without a True gives x_grad = out_grad and a zero value_grad, as in Paddle."""
    ind, v = INDEX_PUT_MASKS[case]
    check("index_put_grad", {"x": normal(4, 3, 5), "indices": ind, "value": normal(*v, seed=1),
                             "out_grad": normal(4, 3, 5, seed=2)}, {"accumulate": accumulate})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_bool_mask_dtypes(accumulate, dtype):
    for case in ("mask2d_rows", "mask1d_bvalue"):
        ind, v = INDEX_PUT_MASKS[case]
        check("index_put_grad", {"x": normal(4, 3, 5), "indices": ind, "value": normal(*v, seed=1),
                                 "out_grad": normal(4, 3, 5, seed=2)}, {"accumulate": accumulate}, dtype)


def test_index_put_bool_mask_errors():
    x = normal(4, 3)
    base = {"x": x, "value": normal(1), "out_grad": x}
    with pytest.raises(ValueError, match=r"index_put_grad: input 'indices\[0\]' is a 0-d bool mask"):
        run("index_put_grad", {**base, "indices": [np.array(True)]}, {"accumulate": False})
    big = np.zeros((5, 3), bool)
    big[4, 1] = True
    with pytest.raises(ValueError, match=r"index_put_grad: input 'indices\[0\]' \(a bool mask of shape "
                                         r"\[5, 3\]\) is True at \[4, 1\], outside x's dim 0 of size 4"):
        run("index_put_grad", {**base, "indices": [big]}, {"accumulate": False})
    run("index_put_grad", {**base, "indices": [big[:4]]}, {"accumulate": False})
    with pytest.raises(ValueError, match=r"index_put_grad: input 'indices\[1\]' \(a bool mask of shape "
                                         r"\[3, 2\]\) and the indices before it address 3 dims"):
        run("index_put_grad", {**base, "indices": [np.array([0]), np.ones((3, 2), bool)]},
            {"accumulate": False})
    meta = {"x": TensorMeta((4, 3), "float32"), "indices": [TensorMeta((4,), "bool")],
            "value": TensorMeta((1,), "float32"), "out_grad": TensorMeta((4, 3), "float32")}
    from tvmgrad import registry
    from tvmgrad.call import bind
    entry = registry.get("index_put_grad")
    call = bind(entry.spec, meta, {"accumulate": False}, metas_only=True)
    with pytest.raises(ValueError, match=r"index_put_grad: a bool mask index needs its values"):
        entry.impl.plan(call, registry.infer_outputs(entry, call))


# ------------------------------------------------------------------------------------------
# graph message passing

SRC = np.array([0, 1, 2, 0, 4, 4, 3])
DST = np.array([1, 2, 1, 0, 1, 3, 1])


def _graph_oracle(op):
    """Paddle's bindings take out and dst_count (its forward binding returns only out); both are
    always passed (dst_count=None with MEAN segfaults in 3.3.1)."""
    def oracle(inputs, attrs):
        import paddle
        spec_args = {"send_u_recv_grad": ("x", "src_index", "dst_index", "out", "dst_count", "out_grad"),
                     "send_ue_recv_grad": ("x", "y", "src_index", "dst_index", "out", "dst_count",
                                           "out_grad")}[op]
        args = [to_paddle(inputs[n]) for n in spec_args]
        names = ("message_op", "reduce_op") if op == "send_ue_recv_grad" else ("reduce_op",)
        res = getattr(paddle._C_ops, op)(*args, *[attrs[n] for n in names])
        res = res if isinstance(res, (list, tuple)) else [res]
        outs = ("x_grad", "y_grad") if op == "send_ue_recv_grad" else ("x_grad",)
        return {k: from_paddle(v) for k, v in zip(outs, res)}
    return oracle


def _u_recv_inputs(reduce, feats=(3,), seed=0):
    import paddle
    x = np.round(normal(5, *feats, seed=seed) * 2) / 2
    x[4] = x[2]                                                    # tied messages
    out = paddle._C_ops.send_u_recv(to_paddle(x), to_paddle(SRC), to_paddle(DST), reduce, [4]).numpy()
    return {"x": x, "src_index": SRC, "dst_index": DST, "out": out,
            "dst_count": np.bincount(DST, minlength=4).astype("int32"),
            "out_grad": normal(*out.shape, seed=seed + 1)}


@pytest.mark.parametrize("reduce", ["SUM", "MEAN", "MIN", "MAX"])
def test_send_u_recv_reduce(reduce):
    check("send_u_recv_grad", _u_recv_inputs(reduce, (2, 3)), {"reduce_op": reduce}, "float64",
          oracle=_graph_oracle("send_u_recv_grad"))


@pytest.mark.parametrize("dtype", FLOATS)
def test_send_u_recv_dtypes(dtype):
    check("send_u_recv_grad", _u_recv_inputs("MEAN"), {"reduce_op": "MEAN"}, dtype,
          oracle=_graph_oracle("send_u_recv_grad"))


def test_send_u_recv_atomic_and_errors():
    inputs = _u_recv_inputs("MAX")
    det = run("send_u_recv_grad", inputs, {"reduce_op": "MAX"}, "float32")["x_grad"]
    racy = run("send_u_recv_grad", inputs, {"reduce_op": "MAX"}, "float32", deterministic=False)["x_grad"]
    np.testing.assert_allclose(racy, det, rtol=1e-6)
    with pytest.raises(ValueError, match=r"send_u_recv_grad: reduce_op MEAN needs input 'dst_count'"):
        run("send_u_recv_grad", dict(inputs, dst_count=None), {"reduce_op": "MEAN"})
    with pytest.raises(ValueError, match=r"send_u_recv_grad: reduce_op MIN needs input 'out'"):
        run("send_u_recv_grad", dict(inputs, out=None), {"reduce_op": "MIN"})
    with pytest.raises(ValueError, match=r"send_u_recv_grad: input 'dst_index' holds 4 at \[0\]"):
        run("send_u_recv_grad", dict(inputs, dst_index=DST + 3 - DST.min()), {"reduce_op": "SUM"})
    with pytest.raises(ValueError, match=r"send_u_recv_grad: attribute 'reduce_op' is 'PROD'"):
        run("send_u_recv_grad", inputs, {"reduce_op": "PROD"})
    with pytest.raises(ValueError, match=r"send_u_recv_grad: dst_count has shape \[3\], expected \[4\]"):
        run("send_u_recv_grad", dict(inputs, dst_count=inputs["dst_count"][:3]), {"reduce_op": "MEAN"})
    sum_only = dict(inputs, out=None, dst_count=None)
    np.testing.assert_allclose(run("send_u_recv_grad", sum_only, {"reduce_op": "SUM"})["x_grad"],
                               run("send_u_recv_grad", inputs, {"reduce_op": "SUM"})["x_grad"])


@pytest.mark.parametrize("op", ["send_u_recv_grad", "send_ue_recv_grad"])
def test_graph_dst_count_is_validated(op):
    """dst_count is the forward's count of edges per destination node (the MEAN divisor): any
    other value (negative, -1, 0 for a node with edges, huge, off by one) would change the
    result silently in Paddle; it is a ValueError naming the input and the node."""
    inputs = _u_recv_inputs("MEAN") if op == "send_u_recv_grad" else _ue_recv_inputs("MUL", "MEAN", (3,))
    attrs = {"reduce_op": "MEAN"} if op == "send_u_recv_grad" else {"message_op": "MUL", "reduce_op": "MEAN"}
    good = inputs["dst_count"]
    run(op, inputs, attrs)
    for node, value in ((1, -1), (0, -7), (1, 0), (3, 2 ** 31 - 1), (2, good[2] + 1)):
        bad = good.copy()
        bad[node] = value
        with pytest.raises(ValueError, match=rf"{op}: input 'dst_count' holds {value} at \[{node}\], but "
                                             rf"{good[node]} edges have dst_index {node}"):
            run(op, dict(inputs, dst_count=bad), attrs)
        with pytest.raises(ValueError, match=rf"{op}: input 'dst_count' holds {value}"):
            run(op, dict(inputs, dst_count=bad), {**attrs, "reduce_op": "SUM"})
    with pytest.raises(TypeError, match=rf"{op}: input 'dst_count' has dtype float64"):
        run(op, dict(inputs, dst_count=good.astype(np.float64)), attrs)
    run(op, dict(inputs, dst_count=good.astype(np.int64)), attrs)


def _ue_recv_inputs(message, reduce, y_feats, seed=0):
    import paddle
    x = np.round(normal(5, 2, 3, seed=seed) * 2) / 2
    y = np.round(normal(len(SRC), *y_feats, seed=seed + 1) * 2) / 2
    out = paddle._C_ops.send_ue_recv(to_paddle(x), to_paddle(y), to_paddle(SRC), to_paddle(DST),
                                     message, reduce, [4]).numpy()
    return {"x": x, "y": y, "src_index": SRC, "dst_index": DST, "out": out,
            "dst_count": np.bincount(DST, minlength=4).astype("int32"),
            "out_grad": normal(*out.shape, seed=seed + 2)}


@pytest.mark.parametrize("y_feats", [(2, 3), (1,)])
@pytest.mark.parametrize("message", ["ADD", "MUL"])
@pytest.mark.parametrize("reduce", ["SUM", "MEAN", "MIN", "MAX"])
@pytest.mark.sweep
def test_send_ue_recv(reduce, message, y_feats):
    check("send_ue_recv_grad", _ue_recv_inputs(message, reduce, y_feats),
          {"message_op": message, "reduce_op": reduce}, "float64",
          oracle=_graph_oracle("send_ue_recv_grad"))


@pytest.mark.parametrize("dtype", FLOATS)
def test_send_ue_recv_dtypes(dtype):
    check("send_ue_recv_grad", _ue_recv_inputs("MUL", "MEAN", (3,)),
          {"message_op": "MUL", "reduce_op": "MEAN"}, dtype,
          oracle=_graph_oracle("send_ue_recv_grad"))


@pytest.mark.parametrize("feats", [((3,), (3,)), ((2, 3), (1, 3)), ((1,), (4,))])
@pytest.mark.parametrize("message", ["ADD", "MUL"])
def test_send_uv(message, feats):
    xf, yf = feats
    e = len(SRC)
    out_f = np.broadcast_shapes(xf, yf)
    check("send_uv_grad", {"x": normal(5, *xf), "y": normal(4, *yf), "src_index": SRC,
                           "dst_index": DST, "out_grad": normal(e, *out_f)},
          {"message_op": message}, "float64")


@pytest.mark.parametrize("dtype", FLOATS)
def test_send_uv_dtypes(dtype):
    check("send_uv_grad", {"x": normal(5, 3), "y": normal(4, 3), "src_index": SRC, "dst_index": DST,
                           "out_grad": normal(len(SRC), 3)}, {"message_op": "MUL"}, dtype)


def test_send_uv_atomic_and_errors():
    inputs = {"x": normal(5, 3), "y": normal(4, 1), "src_index": SRC, "dst_index": DST,
              "out_grad": normal(len(SRC), 3)}
    det = run("send_uv_grad", inputs, {"message_op": "MUL"}, "float64")
    racy = run("send_uv_grad", inputs, {"message_op": "MUL"}, "float64", deterministic=False)
    for k in det:
        np.testing.assert_allclose(racy[k], det[k], rtol=1e-12)
    with pytest.raises(ValueError, match=r"send_uv_grad: input 'src_index' holds 5"):
        run("send_uv_grad", dict(inputs, src_index=SRC + 1), {"message_op": "ADD"})
    with pytest.raises(ValueError, match=r"send_uv_grad: src_index and dst_index must be 1-d of one "
                                         r"length"):
        run("send_uv_grad", dict(inputs, dst_index=DST[:3]), {"message_op": "ADD"})


# ------------------------------------------------------------------------------------------
# CUDA: the racy variants use atomics, the default kernels none; both compile without spills

@pytest.mark.cuda
def test_cuda_atomic_and_deterministic_variants():
    import re

    from cubins import cuda_source, kernels_of, plans_of
    from samples import FACTORIES, sample
    from tvmgrad import registry
    from tvmgrad.cuda import compile_cubin
    ops = [op for op in FACTORIES if registry.get(op).state == "implemented"
           and registry.get(op).impl.family in ("indexing", "scan", "sort")
           and getattr(registry.get(op).impl, "atomic", False)]
    assert len(ops) >= 10
    plans = []
    for op in ops:
        inputs, attrs = sample(op)
        calls = [(op, {k: cast(v, "float32") for k, v in inputs.items()}, attrs)]
        plans += [(op, det, plan) for det in (True, False)
                  for _, plan in plans_of(calls, deterministic=det)]
    source = cuda_source([(op, plan) for op, _, plan in plans])
    kernels = {}
    heads = list(re.finditer(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^)]*\)\s*\{',
                             source))
    for m, nxt in zip(heads, heads[1:] + [None]):
        kernels[m.group(1)] = source[m.end():nxt.start() if nxt else len(source)]
    for op, det, plan in plans:
        mine = [text for name, text in kernels.items() if name.startswith(plan.symbol + "_kernel")]
        assert mine, (op, det)
        atomics = sum("atomic_add" in text for text in mine)
        assert (atomics == 0) == det, f"{op} deterministic={det}: {atomics} kernels with atomics"
    stats = compile_cubin(source, "sm_90").kernels
    for op, det, plan in plans:
        for name, k in kernels_of(stats, plan.symbol).items():
            assert not k.spills, f"{name} ({op}, deterministic={det}) spills: {k}"


# ------------------------------------------------------------------------------------------
# Complex, integer and bool data: every such dtype Paddle registers for the op (CPU or GPU; see
# tests/test_paddle_dtypes.py). The references are Paddle's CPU kernel in that dtype where it has
# one and numpy's same math (often both: they must agree); complex values have nonzero imaginary
# parts (both parts move and sum alike), integer sums wrap as Paddle's and numpy's do, a sum of
# bools is their OR (Paddle's ``bool +=``, numpy's add).



def _paddle_cpu_dtypes(op):
    import json
    import pathlib
    table = json.loads((pathlib.Path(tvmgrad.__file__).parent / "paddle_dtypes.json").read_text())
    return set(table["ops"][op]["cpu"])


def xcheck(op, dtype, inputs, attrs=None, want=None, oracle=None, got=None):
    """tvmgrad's outputs against numpy's ``want`` and Paddle's CPU kernel (``oracle``, default
    ``_C_ops.<op>``) where Paddle's CPU has ``dtype``; at least one of them."""
    got = tvmgrad.run(op, inputs, attrs) if got is None else got
    refs = [("numpy", want)] if want is not None else []
    if dtype in _paddle_cpu_dtypes(op) and oracle is not False:
        refs.append(("paddle", (oracle or (lambda i, a: c_ops(op, i, a or {})))(inputs, attrs or {})))
    assert refs, f"{op} [{dtype}]: no reference"
    for who, ref in refs:
        for k, w in ref.items():
            agree(f"{op}.{k} [{dtype}] vs {who}", got[k], w)
    return got


def zeros(dtype, *shape):
    return np.zeros(shape, dtype)


def _gather_extra(op, dtype, shape, axis):
    idx = np.array([1, 3, 1, 5, 0, 1]) if op == "index_select_grad" else np.array([1, 3, 1, -1, 5, 1])
    g_shape = shape[:axis] + (len(idx),) + shape[axis + 1:]
    g = data(dtype, *g_shape, seed=1)
    want = zeros(dtype, *shape)
    np.add.at(want, (slice(None),) * axis + (idx,), g)
    return {"x": data(dtype, *shape), "index": idx, "out_grad": g}, {"axis": axis}, {"x_grad": want}


@pytest.mark.parametrize("shape,axis", [((3, 6, 2), 1), ((4, 6), 1), ((6, 3), 0)])
@pytest.mark.parametrize("op,dtype", [(op, d) for op in ("gather_grad", "index_select_grad")
                                      for d in extra_dtypes(op)])
def test_gather_like_extra_dtypes(op, dtype, shape, axis):
    inputs, attrs, want = _gather_extra(op, dtype, shape, axis)
    xcheck(op, dtype, inputs, attrs, want)


@pytest.mark.parametrize("dtype", extra_dtypes("gather_nd_grad"))
@pytest.mark.parametrize("xs", [(4, 3, 2), (4, 3)])
def test_gather_nd_extra_dtypes(dtype, xs):
    idx = np.array([[1, 2], [3, 0], [1, 2], [-1, 1]])
    g = data(dtype, *((4,) + xs[2:]), seed=1)
    want = zeros(dtype, *xs)
    np.add.at(want, (idx[:, 0], idx[:, 1]), g)
    xcheck("gather_nd_grad", dtype, {"x": data(dtype, *xs), "index": idx, "out_grad": g}, {},
           {"x_grad": want})


@pytest.mark.parametrize("dtype", extra_dtypes("index_sample_grad"))
def test_index_sample_extra_dtypes(dtype):
    idx = np.array([[0, 0, 4], [1, 2, 1], [3, 3, 3]])
    g = data(dtype, 3, 3, seed=1)
    want = zeros(dtype, 3, 5)
    for b in range(3):
        np.add.at(want[b], idx[b], g[b])
    xcheck("index_sample_grad", dtype, {"x": data(dtype, 3, 5), "index": idx, "out_grad": g}, {},
           {"x_grad": want})


@pytest.mark.parametrize("dtype", extra_dtypes("index_select_strided_grad"))
def test_index_select_strided_extra_dtypes(dtype):
    g = data(dtype, 3, 2, seed=1)
    want = zeros(dtype, 3, 4, 2)
    want[:, 2] = g
    xcheck("index_select_strided_grad", dtype, {"x": data(dtype, 3, 4, 2), "out_grad": g},
           {"index": 2, "axis": 1}, {"x_grad": want})


@pytest.mark.parametrize("dtype", extra_dtypes("multiplex_grad"))
def test_multiplex_extra_dtypes(dtype):
    """(Paddle differentiates complex multiplex; its integer tensors take no gradient: numpy.)"""
    ins = [data(dtype, 5, 2, 3, seed=i) for i in range(3)]
    idx = np.array([[2], [0], [2], [1], [0]], "int32")
    g = data(dtype, 5, 2, 3, seed=5)
    inputs = {"inputs": ins, "index": idx, "out_grad": g}
    got = run_list_outputs("multiplex_grad", inputs)
    want = {"inputs_grad": [np.where((idx[:, 0] == k)[:, None, None], g, zeros(dtype)) for k in range(3)]}
    xcheck("multiplex_grad", dtype, inputs, None, want, got=got,
           oracle=multiplex_oracle if dtype in CPLX else False)


def _where_np(cond, xs, ys, g):
    full = g.shape
    c = np.broadcast_to(cond, full)
    out = {}
    for name, shape, part in (("x_grad", xs, np.where(c, g, zeros(g.dtype))),
                              ("y_grad", ys, np.where(c, zeros(g.dtype), g))):
        lead = len(full) - len(shape)
        axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(shape) if n == 1 and full[lead + d] != 1)
        out[name] = part.sum(axis=axes, dtype=g.dtype).reshape(shape) if axes else part
    return out


@pytest.mark.parametrize("dtype", extra_dtypes("where_grad"))
@pytest.mark.parametrize("case", ["same", "x_row", "all"])
@pytest.mark.sweep
def test_where_extra_dtypes(dtype, case):
    """Paddle only without broadcasting (it reads past its buffers otherwise: test_where_broadcast)."""
    cs, xs, ys = {"same": ((4, 5), (4, 5), (4, 5)), "x_row": ((3, 4), (4,), (3, 4)),
                  "all": ((2, 1, 4), (3, 1), (1,))}[case]
    cond = rng(7).random(cs) > 0.5
    full = np.broadcast_shapes(cs, xs, ys)
    g = data(dtype, *full, seed=3)
    xcheck("where_grad", dtype, {"condition": cond, "x": data(dtype, *xs), "y": data(dtype, *ys, seed=1),
                                 "out_grad": g}, {}, _where_np(cond, xs, ys, g),
           oracle=None if case == "same" else False)


@pytest.mark.parametrize("dtype", extra_dtypes("masked_select_grad"))
@pytest.mark.parametrize("xs,ms", [((4, 5), (4, 5)), ((4,), (3, 4)), ((3, 4), (4,))])
@pytest.mark.sweep
def test_masked_select_extra_dtypes(dtype, xs, ms):
    mask = rng(4).random(ms) > 0.4
    full = np.broadcast_shapes(xs, ms)
    m = np.broadcast_to(mask, full)
    g = data(dtype, int(m.sum()), seed=1)
    whole = zeros(dtype, *full)
    whole[m] = g
    lead = len(full) - len(xs)
    axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(xs) if n == 1 and full[lead + d] != 1)
    want = whole.sum(axis=axes, dtype=whole.dtype).reshape(xs) if axes else whole
    xcheck("masked_select_grad", dtype, {"x": data(dtype, *xs), "mask": mask, "out_grad": g}, {},
           {"x_grad": want})


@pytest.mark.parametrize("dtype", extra_dtypes("index_put_grad"))
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("case", ["pairs", "broadcast_value", "bool_mask"])
@pytest.mark.sweep
def test_index_put_extra_dtypes(dtype, accumulate, case):
    x = data(dtype, 4, 3)
    g = data(dtype, 4, 3, seed=1)
    if case == "bool_mask":
        mask = np.array([True, False, True, True])
        indices, rows, value = [mask], (np.nonzero(mask)[0],), data(dtype, 1, 3, seed=2)
    elif case == "broadcast_value":
        rows = (np.array([1, 3, 1]),)
        indices, value = list(rows), data(dtype, 1, 3, seed=2)
    else:
        rows = (np.array([1, 3, 1]), np.array([0, 2, 0]))
        indices, value = list(rows), data(dtype, 3, seed=2)
    xg = g.copy()
    if not accumulate:
        xg[rows] = 0
    picked = g[rows]
    vg = picked.sum(axis=0, keepdims=True, dtype=g.dtype) if value.shape != picked.shape else picked
    xcheck("index_put_grad", dtype, {"x": x, "indices": indices, "value": value, "out_grad": g},
           {"accumulate": accumulate}, {"x_grad": xg, "value_grad": vg})


@pytest.mark.parametrize("dtype", extra_dtypes("index_add_grad"))
def test_index_add_extra_dtypes(dtype):
    idx = np.array([0, 2, 0, 4])
    g = data(dtype, 3, 5, seed=1)
    xcheck("index_add_grad", dtype, {"index": idx, "add_value": data(dtype, 3, 4), "out_grad": g},
           {"axis": 1}, {"x_grad": g, "add_value_grad": g[:, idx]})


@pytest.mark.parametrize("dtype", extra_dtypes("scatter_grad"))
@pytest.mark.parametrize("overwrite", [True, False])
def test_scatter_extra_dtypes(dtype, overwrite):
    idx = np.array([1, 3, 1])
    g = data(dtype, 4, 2, seed=1)
    xg = g.copy()
    xg[idx] = 0
    xcheck("scatter_grad", dtype, {"index": idx, "updates": data(dtype, 3, 2), "out_grad": g},
           {"overwrite": overwrite}, {"x_grad": xg, "updates_grad": g[idx]})


@pytest.mark.parametrize("dtype", extra_dtypes("scatter_nd_add_grad"))
def test_scatter_nd_add_extra_dtypes(dtype):
    idx = np.array([[1, 0], [3, 1], [1, 0]])
    g = data(dtype, 4, 2, 3, seed=1)
    xcheck("scatter_nd_add_grad", dtype, {"index": idx, "updates": data(dtype, 3, 3), "out_grad": g}, {},
           {"x_grad": g, "updates_grad": g[idx[:, 0], idx[:, 1]]})


@pytest.mark.parametrize("dtype", extra_dtypes("take_along_axis_grad"))
@pytest.mark.parametrize("case", ["last", "mid"])
def test_take_along_axis_extra_dtypes(dtype, case):
    arr_shape, idx = {"last": ((3, 4), np.array([[0, 0], [3, 1], [2, 2]])),
                      "mid": ((2, 5, 3), np.array([[[4, 0, 4]] * 6] * 2))}[case]
    g = data(dtype, *idx.shape, seed=1)
    want = zeros(dtype, *arr_shape)
    grid = np.indices(idx.shape)
    grid[1] = idx
    np.add.at(want, tuple(grid), g)
    xcheck("take_along_axis_grad", dtype, {"arr": data(dtype, *arr_shape), "indices": idx, "out_grad": g},
           {"axis": 1}, {"arr_grad": want})


def _put_int_inputs(dtype, reduce, include_self):
    import paddle
    arr = np.array([[5, 7, 9, 11], [2, -3, 4, 6]])
    idx = np.array([[0, 0, 2], [3, 3, 1]])
    vals = np.array([[3, 5, 9], [6, -2, 7]])
    g = np.array([[10, -7, 13, 9], [5, -11, 3, 17]])
    if dtype == "uint8":
        arr, vals, g = np.abs(arr), np.abs(vals), np.abs(g) * 9      # g·out overflows uint8
    arr, vals, g = (a.astype(dtype) for a in (arr, vals, g))
    out = paddle._C_ops.put_along_axis(to_paddle(arr), to_paddle(idx), to_paddle(vals), 1, reduce,
                                       include_self).numpy()
    return {"arr": arr, "indices": idx, "values": vals, "out": out, "out_grad": g}


@pytest.mark.parametrize("dtype", extra_dtypes("put_along_axis_grad"))
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["assign", "add", "mean", "mul", "amin", "amax"])
@pytest.mark.sweep
def test_put_along_axis_extra_dtypes(dtype, reduce, include_self):
    """Integer grads divide as C++ does (truncating, after the promotion to int of narrow
    types: g·out/arr does not wrap in uint8), as Paddle's CPU kernels (the reference)."""
    xcheck("put_along_axis_grad", dtype, _put_int_inputs(dtype, reduce, include_self),
           {"axis": 1, "reduce": reduce, "include_self": include_self})


def test_put_along_axis_integer_mul_zero_divisor_is_an_error():
    """Integer reduce mul divides by arr (where something lands) and by the values: a zero there
    kills Paddle's kernel with SIGFPE; here it is a ValueError naming the input and position (a
    float zero gives inf/NaN, as Paddle's)."""
    inputs = _put_int_inputs("int32", "mul", True)
    arr = inputs["arr"].copy()
    arr[1, 3] = 0
    with pytest.raises(ValueError, match=r"put_along_axis_grad: input 'arr' holds 0 at \[1, 3\], where a "
                                         r"value lands"):
        tvmgrad.run("put_along_axis_grad", dict(inputs, arr=arr), {"axis": 1, "reduce": "mul", "include_self": True})
    arr[1, 3], arr[1, 0] = 6, 0             # nothing lands on [1, 0]: fine
    tvmgrad.run("put_along_axis_grad", dict(inputs, arr=arr), {"axis": 1, "reduce": "mul", "include_self": True})
    vals = inputs["values"].copy()
    vals[0, 1] = 0
    for incl in (True, False):
        with pytest.raises(ValueError, match=r"put_along_axis_grad: input 'values' holds 0 at \[0, 1\]"):
            tvmgrad.run("put_along_axis_grad", dict(inputs, values=vals),
                        {"axis": 1, "reduce": "mul", "include_self": incl})
    tvmgrad.run("put_along_axis_grad", dict(inputs, values=vals), {"axis": 1, "reduce": "add", "include_self": True})


def _int_graph(dtype):
    x = np.array([[3, -4], [5, 6], [7, 8], [9, 10], [-2, 1]]).astype(dtype)
    g = np.array([[7, -9], [11, 5], [-13, 8], [4, 4]]).astype(dtype)
    return x, g


@pytest.mark.parametrize("dtype", extra_dtypes("send_u_recv_grad"))
@pytest.mark.parametrize("reduce", ["SUM", "MEAN", "MIN", "MAX"])
def test_send_u_recv_extra_dtypes(dtype, reduce):
    """MEAN divides each edge's grad by its count, truncating (as Paddle's integer kernel)."""
    import paddle
    x, g = _int_graph(dtype)
    out = paddle._C_ops.send_u_recv(to_paddle(x), to_paddle(SRC), to_paddle(DST), reduce, [4]).numpy()
    inputs = {"x": x, "src_index": SRC, "dst_index": DST, "out": out,
              "dst_count": np.bincount(DST, minlength=4).astype("int32"), "out_grad": g}
    xcheck("send_u_recv_grad", dtype, inputs, {"reduce_op": reduce}, oracle=_graph_oracle("send_u_recv_grad"))


@pytest.mark.parametrize("dtype", extra_dtypes("send_ue_recv_grad"))
@pytest.mark.parametrize("y_feats", [(2,), (1,)])
@pytest.mark.parametrize("message", ["ADD", "MUL"])
@pytest.mark.parametrize("reduce", ["SUM", "MEAN", "MIN", "MAX"])
@pytest.mark.sweep
def test_send_ue_recv_extra_dtypes(dtype, reduce, message, y_feats):
    """MEAN divides each message's product by the count (out_grad·y / count, truncating), as
    Paddle's integer kernel."""
    import paddle
    x, g = _int_graph(dtype)
    y = (np.arange(len(SRC) * math.prod(y_feats)).reshape(len(SRC), *y_feats) % 7 - 3).astype(dtype)
    out = paddle._C_ops.send_ue_recv(to_paddle(x), to_paddle(y), to_paddle(SRC), to_paddle(DST),
                                     message, reduce, [4]).numpy()
    inputs = {"x": x, "y": y, "src_index": SRC, "dst_index": DST, "out": out,
              "dst_count": np.bincount(DST, minlength=4).astype("int32"), "out_grad": g}
    xcheck("send_ue_recv_grad", dtype, inputs, {"message_op": message, "reduce_op": reduce},
           oracle=_graph_oracle("send_ue_recv_grad"))


@pytest.mark.parametrize("dtype", extra_dtypes("send_uv_grad"))
@pytest.mark.parametrize("message", ["ADD", "MUL"])
def test_send_uv_extra_dtypes(dtype, message):
    x, _ = _int_graph(dtype)
    y = np.array([[2, 1], [3, 2], [-1, 5], [4, 4]]).astype(dtype)
    g = (np.arange(2 * len(SRC)).reshape(len(SRC), 2) - 3).astype(dtype)
    xcheck("send_uv_grad", dtype, {"x": x, "y": y, "src_index": SRC, "dst_index": DST, "out_grad": g},
           {"message_op": message})


def test_extra_dtypes_are_what_paddle_registers():
    """The dtypes tested above are exactly the complex/integer/bool ones Paddle registers (CPU or
    GPU), and none of them is tested here without a reference."""
    import json
    import pathlib
    table = json.loads((pathlib.Path(tvmgrad.__file__).parent / "paddle_dtypes.json").read_text())["ops"]
    for op in ("gather_grad", "index_select_grad", "gather_nd_grad", "index_sample_grad",
               "index_select_strided_grad", "multiplex_grad", "where_grad", "masked_select_grad",
               "index_put_grad", "index_add_grad", "scatter_grad", "scatter_nd_add_grad",
               "take_along_axis_grad", "put_along_axis_grad", "send_u_recv_grad",
               "send_ue_recv_grad", "send_uv_grad"):
        registered = set(table[op]["cpu"]) | set(table[op]["gpu"] or [])
        assert set(extra_dtypes(op)) == registered & set(CPLX + INTLIKE), op


EXTRA_SLOW = ("complex128", "bool", "int8", "uint8", "int16", "int64")     # (the other dtypes' paths are the same)



@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [pytest.param(d, marks=[pytest.mark.slow] if d in EXTRA_SLOW else [])
                                   for d in CPLX + INTLIKE])
@pytest.mark.sweep
def test_extra_dtype_kernels_compile_to_cubin_without_spills(dtype):
    """Every indexing op's kernel in each complex/integer/bool dtype it takes (its example call
    in that dtype) compiles for CUDA."""
    from cubins import assert_compiles_without_spills, plans_of
    from samples import implemented_ops, sample
    calls = []
    for op in implemented_ops():
        impl = tvmgrad.registry.get(op).implementation
        if impl.family == "indexing" and dtype in impl.dtypes:
            inputs, attrs = sample(op)
            calls.append((op, {k: cast(v, dtype) for k, v in inputs.items()}, attrs))
    assert_compiles_without_spills(plans_of(calls))
