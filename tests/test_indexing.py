"""Indexing, scatter and graph grads against Paddle 3.3.1 (te_defs/indexing.py).

Every op runs in every dtype; indices repeat (scatter-adds accumulate), count from the end where
Paddle allows it, and are rejected cleanly where they are out of range. The deterministic=False
(atomic) variants are compared with the deterministic kernels; linear grads satisfy the adjoint
identity against their forward in float64. Where Paddle is wrong the comparison is with numpy and
the comment says why.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, cast, check, from_paddle, rng, to_paddle
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
    with pytest.raises(ValueError, match=rf"{op}: attribute 'axis' is 2, out of range"):
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
    with pytest.raises(TypeError, match=r"index_put_grad: input 'indices\[0\]' is a bool mask"):
        run("index_put_grad", {"x": x, "indices": [np.array([True, False, True, False])],
                               "value": normal(3), "out_grad": x}, {"accumulate": False})


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
    sum_only = dict(inputs, out=None, dst_count=None)
    np.testing.assert_allclose(run("send_u_recv_grad", sum_only, {"reduce_op": "SUM"})["x_grad"],
                               run("send_u_recv_grad", inputs, {"reduce_op": "SUM"})["x_grad"])


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
    from samples import FACTORIES, sample
    from tvmgrad import registry
    from tvmgrad.build import compile_plans
    from tvmgrad.call import bind
    from tvmgrad.cuda import compile_cubin, device_source, nvcc_path
    from tvmgrad.targets import resolve
    if nvcc_path() is None:
        pytest.fail("nvcc is needed for the CUDA build checks (the cuda marker deselects them)")
    ops = [op for op in FACTORIES if registry.get(op).state == "implemented"
           and registry.get(op).impl.family in ("indexing", "scan", "sort")
           and getattr(registry.get(op).impl, "atomic", False)]
    assert len(ops) >= 10
    plans = []
    for op in ops:
        entry = registry.get(op)
        inputs, attrs = sample(op)
        for det in (True, False):
            call = bind(entry.spec, {k: cast(v, "float32") for k, v in inputs.items()}, attrs,
                        deterministic=det)
            plans.append((op, det, entry.impl.plan(call, registry.infer_outputs(entry, call))))
    source = device_source(compile_plans([p for _, _, p in plans], resolve({"kind": "cuda", "arch": "sm_80"})))
    import re
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
        for k in (s for n, s in stats.items() if n.startswith(plan.symbol + "_kernel")):
            assert not k.spills, f"{k.name} ({op}, deterministic={det}) spills: {k}"
