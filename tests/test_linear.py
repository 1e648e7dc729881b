"""Joining, splitting and broadcasting grads (te_defs/linear.py) against Paddle 3.3.1.

Every op runs in every float dtype against Paddle, on odd shapes (size-1 and empty dims, rank
variety, negative axes), and every linear pair is checked with the adjoint identity
<A x, y> = <x, A^T y> in float64 (forward op vs its grad, ours or Paddle's).

Oracles: Paddle 3.3.1's list-output grad bindings are unusable — ``_C_ops.concat_grad`` and
``broadcast_tensors_grad`` raise "Input's size should be equal to the output's size",
``stack_grad``, ``meshgrid_grad``, ``partial_concat_grad`` and ``partial_sum_grad`` segfault —
so those grads come from Paddle's autograd through the forward op (``paddle.grad``), which runs
the same backward kernels through the graph. The double grads that invoke a forward op are
compared with Paddle's forward op.
"""

import numpy as np
import pytest

import tvmgrad
from adjoint import assert_adjoint
from harness import FLOATS, check, from_paddle, leaf, pgrad, rng, to_paddle


def _n(*shape, seed=0):
    return rng(seed).standard_normal(shape)


def _paddle():
    import paddle
    paddle.set_device("cpu")
    return paddle


def autograd_list(forward, name_in, name_out, grad_name):
    """Oracle: Paddle's grads of ``forward(list of leaves, attrs)`` w.r.t. the list input."""
    def oracle(inputs, attrs):
        xs = [leaf(a) for a in inputs[name_in]]
        out = forward(xs, attrs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        cots = inputs[grad_name]
        cots = [to_paddle(c) for c in (cots if isinstance(cots, list) else [cots])]
        return {name_out: [from_paddle(g) for g in pgrad(outs, xs, cots)]}
    return oracle


def _concat_fwd(xs, attrs):
    return _paddle().concat(xs, axis=attrs.get("axis", 0))


def _stack_fwd(xs, attrs):
    return _paddle().stack(xs, axis=attrs.get("axis", 0))


CONCAT_ORACLE = autograd_list(_concat_fwd, "x", "x_grad", "out_grad")
STACK_ORACLE = autograd_list(_stack_fwd, "x", "x_grad", "out_grad")


# ------------------------------------------------------------------------------------------
# concat

CONCAT_CASES = [
    ([(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1),
    ([(2, 3, 4), (2, 3, 2)], -1),
    ([(3,), (4,), (1,)], 0),
    ([(2, 3), (0, 3), (1, 3)], 0),           # an empty piece
    ([(1, 1, 2), (1, 1, 2)], -3),
    ([(4, 2)], 1),                            # a single piece
]


@pytest.mark.parametrize("dtype", FLOATS)
def test_concat_grad_dtypes(dtype):
    shapes, axis = CONCAT_CASES[0]
    xs = [_n(*s, seed=i) for i, s in enumerate(shapes)]
    g = _n(2, 9, 4, seed=9)
    check("concat_grad", {"x": xs, "out_grad": g}, {"axis": axis}, dtype, oracle=CONCAT_ORACLE)


@pytest.mark.parametrize("shapes,axis", CONCAT_CASES)
def test_concat_grad_shapes(shapes, axis):
    xs = [_n(*s, seed=i) for i, s in enumerate(shapes)]
    g = np.concatenate([_n(*s, seed=10 + i) for i, s in enumerate(shapes)], axis)
    got = check("concat_grad", {"x": xs, "out_grad": g}, {"axis": axis}, "float64",
                oracle=CONCAT_ORACLE)
    splits = np.cumsum([s[axis] for s in shapes])[:-1]
    for a, b in zip(got["x_grad"], np.split(g, splits, axis)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", FLOATS)
def test_concat_double_grad_is_concat(dtype):
    xs = [_n(2, 3, seed=1), _n(2, 4, seed=2)]
    check("concat_double_grad", {"grad_x_grad": xs}, {"axis": 1}, dtype,
          oracle=lambda i, a: {"grad_out_grad": from_paddle(_concat_fwd(to_paddle(i["grad_x_grad"]), a))})


@pytest.mark.parametrize("shapes,axis", CONCAT_CASES)
def test_concat_adjoint(shapes, axis):
    xs = [_n(*s, seed=i) for i, s in enumerate(shapes)]
    y = np.concatenate([_n(*s, seed=20 + i) for i, s in enumerate(shapes)], axis)
    assert_adjoint(lambda v: tvmgrad.run("concat", {"x": v}, {"axis": axis})["out"],
                   lambda w: tvmgrad.run("concat_grad", {"x": xs, "out_grad": w}, {"axis": axis})["x_grad"],
                   xs, y)


def test_concat_grad_takes_x_shapes_only():
    from tvmgrad.infer_meta import TensorMeta
    g = _n(2, 5)
    got = tvmgrad.run("concat_grad", {"x": [TensorMeta((2, 2), "float64"), TensorMeta((2, 3), "float64")],
                                      "out_grad": g}, {"axis": 1})["x_grad"]
    np.testing.assert_array_equal(got[1], g[:, 2:])


def test_concat_errors():
    a, b = _n(2, 3), _n(2, 4)
    with pytest.raises(ValueError, match=r"concat_grad: out_grad has shape \[2, 6\], expected \[2, 7\]"):
        tvmgrad.run("concat_grad", {"x": [a, b], "out_grad": _n(2, 6)}, {"axis": 1})
    with pytest.raises(ValueError, match=r"concat_grad: .*'axis' = 2 is out of range"):
        tvmgrad.run("concat_grad", {"x": [a, b], "out_grad": _n(2, 7)}, {"axis": 2})
    with pytest.raises(ValueError, match=r"concat_grad: .*x\[1\] of shape \[2, 4\] does not match"):
        tvmgrad.run("concat_grad", {"x": [a, b], "out_grad": _n(4, 3)}, {"axis": 0})
    with pytest.raises(TypeError, match=r"concat_grad: attribute 'axis' must be an integer"):
        tvmgrad.run("concat_grad", {"x": [a, b], "out_grad": _n(2, 7)}, {"axis": 1.5})
    with pytest.raises(ValueError, match=r"^concat_double_grad: grad_x_grad\[1\] has rank 1"):
        tvmgrad.run("concat_double_grad", {"grad_x_grad": [a, _n(3)]}, {"axis": 0})
    with pytest.raises(TypeError, match=r"concat_grad: input 'x\[1\]' has dtype float32"):
        tvmgrad.run("concat_grad", {"x": [a, b.astype("float32")], "out_grad": _n(2, 7)}, {"axis": 1})


# ------------------------------------------------------------------------------------------
# stack / unstack / unbind

STACK_CASES = [((2, 3), 1, 3), ((2, 3), -1, 2), ((4,), 0, 3), ((), 0, 2), ((2, 0, 3), 1, 2),
               ((1, 1), -3, 1)]


@pytest.mark.parametrize("dtype", FLOATS)
def test_stack_grad_dtypes(dtype):
    x = [_n(2, 3, seed=i) for i in range(3)]
    check("stack_grad", {"x": x, "out_grad": _n(2, 3, 3, seed=5)}, {"axis": 2}, dtype,
          oracle=STACK_ORACLE)


@pytest.mark.parametrize("shape,axis,n", STACK_CASES)
def test_stack_grad_shapes(shape, axis, n):
    x = [_n(*shape, seed=i) for i in range(n)]
    g = np.stack([_n(*shape, seed=10 + i) for i in range(n)], axis)
    got = check("stack_grad", {"x": x, "out_grad": g}, {"axis": axis}, "float64", oracle=STACK_ORACLE)
    for k, a in enumerate(got["x_grad"]):
        np.testing.assert_array_equal(a, np.take(g, k, axis=axis))


@pytest.mark.parametrize("dtype", FLOATS)
def test_unstack_and_unbind_grads(dtype):
    pieces = [_n(2, 3, seed=i) for i in range(3)]
    for axis in (0, 2, -1):
        check("unstack_grad", {"out_grad": pieces}, {"axis": axis}, dtype)
    check("unbind_grad", {"out_grad": pieces}, {"axis": 1}, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_stack_double_grad_is_stack(dtype):
    xs = [_n(2, 3, seed=1), _n(2, 3, seed=2)]
    check("stack_double_grad", {"grad_x_grad": xs}, {"axis": -2}, dtype,
          oracle=lambda i, a: {"grad_out_grad": from_paddle(_stack_fwd(to_paddle(i["grad_x_grad"]), a))})


@pytest.mark.parametrize("shape,axis,n", STACK_CASES)
def test_stack_adjoint(shape, axis, n):
    xs = [_n(*shape, seed=i) for i in range(n)]
    y = np.stack([_n(*shape, seed=20 + i) for i in range(n)], axis)
    assert_adjoint(lambda v: tvmgrad.run("stack", {"x": v}, {"axis": axis})["out"],
                   lambda w: tvmgrad.run("stack_grad", {"x": xs, "out_grad": w}, {"axis": axis})["x_grad"],
                   xs, y)
    assert_adjoint(lambda v: tvmgrad.run("unstack_grad", {"out_grad": v}, {"axis": axis})["x_grad"],
                   lambda w: tvmgrad.run("stack_grad", {"x": xs, "out_grad": w}, {"axis": axis})["x_grad"],
                   xs, y)


def test_stack_errors():
    a = _n(2, 3)
    with pytest.raises(ValueError, match=r"stack_grad: x has 3 tensors but out_grad has 2"):
        tvmgrad.run("stack_grad", {"x": [a, a, a], "out_grad": _n(2, 2, 3)}, {"axis": 1})
    with pytest.raises(ValueError, match=r"stack_grad: .*'axis' = 3 is out of range"):
        tvmgrad.run("stack_grad", {"x": [a, a], "out_grad": _n(2, 2, 3)}, {"axis": 3})
    with pytest.raises(ValueError, match=r"unstack_grad: .*out_grad\[1\] has shape \[3, 2\]"):
        tvmgrad.run("unstack_grad", {"out_grad": [a, _n(3, 2)]}, {"axis": 0})
    # invoke ops report errors under the forward op they invoke (the registry's InvokeImpl)
    with pytest.raises(ValueError, match=r"(unbind_grad|stack): .*'axis' = 3 is out of range"):
        tvmgrad.run("unbind_grad", {"out_grad": [a, a]}, {"axis": 3})
    with pytest.raises(ValueError, match=r"unstack_grad: .*out_grad must be a non-empty list"):
        tvmgrad.run("unstack_grad", {"out_grad": []}, {"axis": 0})
    with pytest.raises(TypeError, match=r"stack_grad: input 'out_grad' is a single Tensor"):
        tvmgrad.run("stack_grad", {"x": [a, a], "out_grad": [a, a]}, {"axis": 0})


# ------------------------------------------------------------------------------------------
# expand / expand_as / broadcast_tensors / meshgrid

EXPAND_CASES = [((3, 1), (2, 3, 4)), ((1, 4), (3, 4)), ((3, 1, 5), (3, 2, 5)), ((2, 3), (2, 3)),
                ((), (3, 2)), ((1,), (5,)), ((1, 1), (2, 0)), ((4, 1, 1), (2, 4, 3, 2))]


@pytest.mark.parametrize("dtype", FLOATS)
def test_expand_grads_dtypes(dtype):
    x, g = _n(3, 1), _n(2, 3, 4, seed=3) * 4
    check("expand_grad", {"x": x, "out_grad": g}, {"shape": [2, 3, 4]}, dtype)
    check("expand_as_grad", {"x": x, "out_grad": g}, {"target_shape": [2, 3, 4]}, dtype)
    check("expand_double_grad", {"grad_x_grad": x}, {"shape": [2, -1, 4]}, dtype,
          oracle=lambda i, a: {"grad_out_grad": from_paddle(
              _paddle()._C_ops.expand(to_paddle(i["grad_x_grad"]), a["shape"]))})


@pytest.mark.parametrize("xs,out", EXPAND_CASES)
def test_expand_grad_shapes(xs, out):
    x, g = _n(*xs), _n(*out, seed=4)
    got = check("expand_grad", {"x": x, "out_grad": g}, {"shape": list(out)}, "float64")
    lead = len(out) - len(xs)
    want = g.sum(axis=tuple(range(lead))) if lead else g
    want = want.sum(axis=tuple(d for d, n in enumerate(xs) if n == 1), keepdims=True).reshape(xs)
    np.testing.assert_allclose(got["x_grad"], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("xs,out", EXPAND_CASES)
def test_expand_adjoint(xs, out):
    x, y = _n(*xs), _n(*out, seed=5)
    assert_adjoint(lambda v: tvmgrad.run("expand", {"x": v}, {"shape": list(out)})["out"],
                   lambda w: tvmgrad.run("expand_grad", {"x": x, "out_grad": w}, {"shape": list(out)})["x_grad"],
                   x, y)


def test_expand_grad_checks_out_grad_against_the_shape_attribute():
    """Paddle's kernel ignores ``shape``/``target_shape`` and sums whatever out_grad it gets; an
    out_grad that is not the expansion the attribute describes is refused here."""
    x, g = _n(3, 1), _n(2, 3, 4)
    with pytest.raises(ValueError, match=r"expand_grad: attribute 'shape' = \[5, 5\]"):
        tvmgrad.run("expand_grad", {"x": x, "out_grad": g}, {"shape": [5, 5]})
    with pytest.raises(ValueError, match=r"expand_grad: input 'out_grad' has shape \[2, 3, 5\], "
                                         r"but expanding 'x' \[3, 1\] to attribute 'shape'"):
        tvmgrad.run("expand_grad", {"x": x, "out_grad": _n(2, 3, 5)}, {"shape": [2, 3, 4]})
    with pytest.raises(ValueError, match=r"expand_as_grad: input 'out_grad' has shape \[3, 4\]"):
        tvmgrad.run("expand_as_grad", {"x": x, "out_grad": _n(3, 4)}, {"target_shape": [2, 3, 4]})
    a = tvmgrad.run("expand_grad", {"x": x, "out_grad": g}, {"shape": [2, -1, 4]})["x_grad"]
    b = tvmgrad.run("expand_grad", {"x": x, "out_grad": g}, {"shape": [2, 3, 4]})["x_grad"]
    np.testing.assert_array_equal(a, b)


def test_expand_half_accumulates_in_float32():
    g = np.full((4096, 1), 0.1, dtype=np.float16)
    got = tvmgrad.run("expand_grad", {"x": np.zeros((1, 1), np.float16), "out_grad": g},
                      {"shape": [4096, 1]})["x_grad"]
    # a float16 running sum would stall far below (spacing 0.25 at 256); float32 then rounds once
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), np.float16(0.1) * 4096.0, rtol=1e-3)


def test_expand_errors():
    with pytest.raises(ValueError, match=r"expand_grad: .*out_grad"):
        tvmgrad.run("expand_grad", {"x": _n(3, 2), "out_grad": _n(3, 4)}, {"shape": [3, 4]})
    with pytest.raises(ValueError, match=r"(expand_double_grad|expand): attribute 'shape' = \[5, 5\] does not"):
        tvmgrad.run("expand_double_grad", {"grad_x_grad": _n(3, 1)}, {"shape": [5, 5]})
    with pytest.raises(ValueError, match=r"(expand_double_grad|expand): attribute 'shape' = \[-1, 3\]: -1 is"):
        tvmgrad.run("expand_double_grad", {"grad_x_grad": _n(3)}, {"shape": [-1, 3]})
    with pytest.raises(ValueError, match=r"(expand_double_grad|expand): attribute 'shape' = \[4\] has fewer"):
        tvmgrad.run("expand_double_grad", {"grad_x_grad": _n(2, 4)}, {"shape": [4]})
    with pytest.raises(ValueError, match=r"expand_as_grad: .*x\[3, 2\].*out_grad\[4, 3, 5\]"):
        tvmgrad.run("expand_as_grad", {"x": _n(3, 2), "out_grad": _n(4, 3, 5)}, {"target_shape": [4, 3, 5]})


def _bt_oracle(inputs, attrs):
    paddle = _paddle()
    xs = [leaf(a) for a in inputs["input"]]
    outs = paddle.broadcast_tensors(xs)
    grads = pgrad(outs, xs, [to_paddle(g) for g in inputs["out_grad"]])
    return {"input_grad": [from_paddle(g) for g in grads]}


@pytest.mark.parametrize("dtype", FLOATS)
def test_broadcast_tensors_grad_dtypes(dtype):
    shapes = [(3, 1), (4,), (2, 3, 4), (1, 1, 1)]
    check("broadcast_tensors_grad", {"input": [_n(*s, seed=i) for i, s in enumerate(shapes)],
                                     "out_grad": [_n(2, 3, 4, seed=10 + i) for i in range(4)]},
          None, dtype, oracle=_bt_oracle)


@pytest.mark.parametrize("shapes", [[(2, 3), (2, 3)], [(1,), (0,)], [(), (2, 2)], [(5, 1, 3), (1, 4, 1)]])
def test_broadcast_tensors_grad_shapes_and_adjoint(shapes):
    xs = [_n(*s, seed=i) for i, s in enumerate(shapes)]
    out = np.broadcast_shapes(*shapes)
    gs = [_n(*out, seed=10 + i) for i in range(len(shapes))]
    check("broadcast_tensors_grad", {"input": xs, "out_grad": gs}, None, "float64", oracle=_bt_oracle)
    assert_adjoint(lambda v: [np.broadcast_to(a, out) for a in v],
                   lambda w: tvmgrad.run("broadcast_tensors_grad", {"input": xs, "out_grad": w})["input_grad"],
                   xs, gs)


def test_broadcast_tensors_grad_errors():
    with pytest.raises(ValueError, match=r"broadcast_tensors_grad: out_grad\[1\] has shape \[3\], "
                                         r"expected the broadcast shape \[2, 3\]"):
        tvmgrad.run("broadcast_tensors_grad", {"input": [_n(2, 3), _n(3)], "out_grad": [_n(2, 3), _n(3)]})
    with pytest.raises(ValueError, match=r"broadcast_tensors_grad: shapes do not broadcast"):
        tvmgrad.run("broadcast_tensors_grad", {"input": [_n(2, 3), _n(4)], "out_grad": [_n(2, 3), _n(2, 3)]})
    with pytest.raises(ValueError, match=r"broadcast_tensors_grad: out_grad has 1 tensors but input has 2"):
        tvmgrad.run("broadcast_tensors_grad", {"input": [_n(2, 3), _n(3)], "out_grad": [_n(2, 3)]})


def _meshgrid_oracle(inputs, attrs):
    paddle = _paddle()
    xs = [leaf(a) for a in inputs["inputs"]]
    outs = paddle.meshgrid(xs)
    grads = pgrad(list(outs), xs, [to_paddle(g) for g in inputs["outputs_grad"]])
    return {"inputs_grad": [from_paddle(g) for g in grads]}


@pytest.mark.parametrize("dtype", FLOATS)
def test_meshgrid_grad_dtypes(dtype):
    sizes = (2, 3, 4)
    check("meshgrid_grad", {"inputs": [_n(n, seed=n) for n in sizes],
                            "outputs_grad": [_n(*sizes, seed=10 + k) for k in range(3)]},
          None, dtype, oracle=_meshgrid_oracle)


@pytest.mark.parametrize("sizes", [(1, 3), (3, 0), (2, 1, 2, 3)])
def test_meshgrid_grad_shapes_and_adjoint(sizes):
    xs = [_n(n, seed=k) for k, n in enumerate(sizes)]
    gs = [_n(*sizes, seed=10 + k) for k in range(len(sizes))]
    check("meshgrid_grad", {"inputs": xs, "outputs_grad": gs}, None, "float64", oracle=_meshgrid_oracle)
    assert_adjoint(lambda v: np.meshgrid(*v, indexing="ij"),
                   lambda w: tvmgrad.run("meshgrid_grad", {"inputs": xs, "outputs_grad": w})["inputs_grad"],
                   xs, gs)


def test_meshgrid_grad_0d_input_and_errors():
    got = tvmgrad.run("meshgrid_grad", {"inputs": [np.float64(1.0), _n(3)],
                                        "outputs_grad": [np.ones((1, 3)), np.ones((1, 3))]})["inputs_grad"]
    assert got[0].shape == () and got[0] == 3.0
    with pytest.raises(ValueError, match=r"meshgrid_grad: outputs_grad\[1\] has shape \[3, 2\], expected \[2, 3\]"):
        tvmgrad.run("meshgrid_grad", {"inputs": [_n(2), _n(3)], "outputs_grad": [_n(2, 3), _n(3, 2)]})
    with pytest.raises(ValueError, match=r"meshgrid_grad: inputs\[0\] has rank 2"):
        tvmgrad.run("meshgrid_grad", {"inputs": [_n(2, 1), _n(3)], "outputs_grad": [_n(2, 3), _n(2, 3)]})
    with pytest.raises(ValueError, match=r"meshgrid_grad: meshgrid_grad needs at least 2 inputs"):
        tvmgrad.run("meshgrid_grad", {"inputs": [_n(2)], "outputs_grad": [_n(2)]})
    with pytest.raises(ValueError, match=r"meshgrid_grad: outputs_grad has 1 tensors but inputs has 2"):
        tvmgrad.run("meshgrid_grad", {"inputs": [_n(2), _n(3)], "outputs_grad": [_n(2, 3)]})


# ------------------------------------------------------------------------------------------
# partial_concat / partial_sum

def _partial_oracle(name):
    def forward(xs, attrs):
        return getattr(_paddle()._C_ops, name)(xs, attrs["start_index"], attrs["length"])
    return autograd_list(forward, "x", "x_grad", "out_grad")


PARTIAL_CASES = [(0, -1), (1, 2), (-3, 2), (4, 1), (2, 0), (-5, -1)]


@pytest.mark.parametrize("dtype", FLOATS)
def test_partial_grads_dtypes(dtype):
    x = [_n(3, 5, seed=1), _n(3, 5, seed=2)]
    attrs = {"start_index": 1, "length": 3}
    check("partial_concat_grad", {"x": x, "out_grad": _n(3, 6, seed=3)}, attrs, dtype,
          oracle=_partial_oracle("partial_concat"))
    check("partial_sum_grad", {"x": x, "out_grad": _n(3, 3, seed=4)}, attrs, dtype,
          oracle=_partial_oracle("partial_sum"))


@pytest.mark.parametrize("start,length", PARTIAL_CASES)
def test_partial_grads_ranges_and_adjoint(start, length):
    x = [_n(2, 5, seed=k) for k in range(3)]
    attrs = {"start_index": start, "length": length}
    s = start % 5
    n = 5 - s if length < 0 else length
    gc, gs = _n(2, 3 * n, seed=7), _n(2, n, seed=8)
    check("partial_concat_grad", {"x": x, "out_grad": gc}, attrs, "float64",
          oracle=_partial_oracle("partial_concat"))
    if start >= 0:
        check("partial_sum_grad", {"x": x, "out_grad": gs}, attrs, "float64",
              oracle=_partial_oracle("partial_sum"))
    else:
        # Paddle's partial_sum kernels use a negative start_index unnormalised: the forward reads
        # before each row and the grad writes before its buffer (heap corruption, "malloc():
        # invalid next size"). Here start counts from the end, as in partial_concat.
        got = tvmgrad.run("partial_sum_grad", {"x": x, "out_grad": gs}, attrs)["x_grad"]
        want = np.zeros((2, 5))
        want[:, s:s + n] = gs
        for a in got:
            np.testing.assert_array_equal(a, want)
    assert_adjoint(lambda v: np.concatenate([a[:, s:s + n] for a in v], 1),
                   lambda w: tvmgrad.run("partial_concat_grad", {"x": x, "out_grad": w}, attrs)["x_grad"],
                   x, gc)
    assert_adjoint(lambda v: sum(a[:, s:s + n] for a in v),
                   lambda w: tvmgrad.run("partial_sum_grad", {"x": x, "out_grad": w}, attrs)["x_grad"],
                   x, gs)


def test_partial_errors():
    x = [_n(2, 5), _n(2, 5)]
    with pytest.raises(ValueError, match=r"partial_concat_grad: attribute 'start_index' = 5 is out of range"):
        tvmgrad.run("partial_concat_grad", {"x": x, "out_grad": _n(2, 2)}, {"start_index": 5, "length": 1})
    with pytest.raises(ValueError, match=r"partial_sum_grad: attributes start_index = 3 and length = 3 exceed"):
        tvmgrad.run("partial_sum_grad", {"x": x, "out_grad": _n(2, 3)}, {"start_index": 3, "length": 3})
    with pytest.raises(ValueError, match=r"partial_sum_grad: out_grad has shape \[2, 3\], expected \[2, 2\]"):
        tvmgrad.run("partial_sum_grad", {"x": x, "out_grad": _n(2, 3)}, {"start_index": 3, "length": 2})
    with pytest.raises(ValueError, match=r"partial_concat_grad: x\[1\] has rank 3"):
        tvmgrad.run("partial_concat_grad", {"x": [_n(2, 5), _n(2, 5, 1)], "out_grad": _n(2, 2)},
                    {"start_index": 0, "length": 1})


# ------------------------------------------------------------------------------------------
# fill

@pytest.mark.parametrize("dtype", FLOATS)
def test_fill_grad(dtype):
    g = _n(3, 4)
    g[0, 0], g[1, 1] = np.nan, np.inf
    got = check("fill_grad", {"out_grad": g}, {"value": 2.5}, dtype)
    assert not got["x_grad"].astype(np.float64).any()
    assert tvmgrad.run("fill_grad", {"out_grad": np.zeros((0, 3))}, {"value": 1})["x_grad"].shape == (0, 3)


# ------------------------------------------------------------------------------------------
# kernels are shared and index math is int64

def test_one_kernel_serves_every_rank_axis_and_size():
    from tvmgrad import registry
    from tvmgrad.call import bind

    def key(op, inputs, attrs):
        entry = registry.get(op)
        call = bind(entry.spec, inputs, attrs)
        return entry.impl.plan(call, registry.infer_outputs(entry, call)).key

    k1 = key("concat_grad", {"x": [_n(2, 3), _n(2, 4)], "out_grad": _n(2, 7)}, {"axis": 1})
    k2 = key("concat_grad", {"x": [_n(5, 2, 6, 1), _n(5, 3, 6, 1)], "out_grad": _n(5, 5, 6, 1)}, {"axis": -3})
    assert k1 == k2
    k3 = key("expand_grad", {"x": _n(3, 1), "out_grad": _n(2, 3, 4)}, {"shape": [2, 3, 4]})
    k4 = key("expand_grad", {"x": _n(7, 1), "out_grad": _n(9, 7, 2)}, {"shape": [9, 7, 2]})
    assert k3 == k4
    k5 = key("partial_sum_grad", {"x": [_n(2, 5)], "out_grad": _n(2, 2)}, {"start_index": 1, "length": 2})
    k6 = key("partial_sum_grad", {"x": [_n(4, 9)], "out_grad": _n(4, 3)}, {"start_index": -4, "length": 3})
    assert k5 == k6


def test_index_math_is_int64():
    from tvmgrad import registry
    from tvmgrad.call import bind
    entry = registry.get("concat_grad")
    call = bind(entry.spec, {"x": [_n(2, 3), _n(2, 4)], "out_grad": _n(2, 7)}, {"axis": 1})
    func = entry.impl.plan(call, registry.infer_outputs(entry, call)).make()
    for buf in func.buffer_map.values() if hasattr(func, "buffer_map") else []:
        for d in buf.shape:
            assert str(d.ty) == "int64"
    text = func.script()
    assert "int32" not in text.replace("T.int32(", "")


# ------------------------------------------------------------------------------------------
# complex, integer and bool dtypes (what Paddle registers for each op, CPU or GPU)

from test_complex import check_as_given, crand, ints  # noqa: E402

CPLX = ("complex64", "complex128")
ALL_INTS = ("bool", "int8", "uint8", "int16", "int32", "int64")


def _data(shape, dtype, seed=0):
    return crand(shape, seed).astype(dtype) if dtype.startswith("complex") else ints(shape, dtype, seed)


def _bigints(shape, dtype, seed=0):
    """Integers large enough that sums wrap around in the narrow dtypes (as Paddle's do)."""
    if dtype == "bool":
        return ints(shape, dtype, seed)
    info = np.iinfo(dtype)
    return rng(seed).integers(max(info.min, -2**40), min(info.max, 2**40), shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", CPLX + ALL_INTS)
@pytest.mark.sweep
def test_concat_and_stack_grads_complex_and_ints(dtype):
    xs = [_data(s, dtype, seed=i) for i, s in enumerate([(2, 3, 4), (2, 1, 4), (2, 5, 4)])]
    g = _data((2, 9, 4), dtype, seed=9)
    check_as_given("concat_grad", {"x": xs, "out_grad": g}, {"axis": 1}, oracle=CONCAT_ORACLE)
    ours = tvmgrad.run("concat_double_grad", {"grad_x_grad": xs}, {"axis": -2})["grad_out_grad"]
    np.testing.assert_array_equal(ours, from_paddle(_concat_fwd(to_paddle(xs), {"axis": -2})))
    x = [_data((2, 3), dtype, seed=i) for i in range(3)]
    gs = _data((2, 3, 3), dtype, seed=5)
    check_as_given("stack_grad", {"x": x, "out_grad": gs}, {"axis": 2}, oracle=STACK_ORACLE)
    for op in ("stack_double_grad",):
        ours = tvmgrad.run(op, {"grad_x_grad": x}, {"axis": -2})["grad_out_grad"]
        np.testing.assert_array_equal(ours, from_paddle(_stack_fwd(to_paddle(x), {"axis": -2})))
    check_as_given("unbind_grad", {"out_grad": x}, {"axis": 1}, oracle=lambda i, a: {
        "input_grad": from_paddle(_unbind_grad_paddle(i["out_grad"], a["axis"]))})
    if dtype in CPLX + ("int32", "int64"):
        check_as_given("unstack_grad", {"out_grad": x}, {"axis": -1})


def _unbind_grad_paddle(pieces, axis):
    """Paddle's grad of unbind by autograd (its unbind_grad is stack(out_grad, axis))."""
    x = leaf(np.stack(pieces, axis))
    return pgrad(list(_paddle().unbind(x, axis)), [x], [to_paddle(p) for p in pieces])[0]



@pytest.mark.parametrize("dtype", CPLX + ALL_INTS)
@pytest.mark.sweep
def test_expand_and_broadcast_grads_complex_and_ints(dtype):
    """Sums over broadcast dims: complex both parts, integers wrapping as Paddle's kernels
    (large values), bool as an OR."""
    big = _data if dtype.startswith("complex") else _bigints
    x, g = _data((3, 1), dtype), big((2, 3, 4), dtype, seed=3)
    check_as_given("expand_grad", {"x": x, "out_grad": g}, {"shape": [2, 3, 4]})
    ours = tvmgrad.run("expand_double_grad", {"grad_x_grad": x}, {"shape": [2, -1, 4]})["grad_out_grad"]
    np.testing.assert_array_equal(ours, from_paddle(_paddle()._C_ops.expand(to_paddle(x), [2, -1, 4])))
    if dtype in ("int32", "int64"):
        check_as_given("expand_as_grad", {"x": x, "out_grad": g}, {"target_shape": [2, 3, 4]})
    if dtype in CPLX + ("bool", "int32", "int64"):
        shapes = [(3, 1), (4,), (2, 3, 4), (1, 1, 1)]
        inputs = {"input": [_data(s, dtype, seed=i) for i, s in enumerate(shapes)],
                  "out_grad": [big((2, 3, 4), dtype, seed=10 + i) for i in range(4)]}
        # Paddle registers bool broadcast_tensors_grad on the GPU only: its CPU autograd cannot
        # run it, so bool is checked against numpy's OR over the broadcast dims
        oracle = _bt_oracle if dtype != "bool" else lambda i, a: {"input_grad": [
            np.logical_or.reduce(g, axis=tuple(d for d in range(3) if d < 3 - len(s) or s[d - 3 + len(s)] == 1),
                                 keepdims=True).reshape(s) for s, g in zip(shapes, i["out_grad"])]}
        check_as_given("broadcast_tensors_grad", inputs, None, oracle=oracle)
    if dtype in CPLX + ("int32", "int64"):
        sizes = (2, 3, 4)
        check_as_given("meshgrid_grad", {"inputs": [_data((n,), dtype, seed=n) for n in sizes],
                                         "outputs_grad": [big(sizes, dtype, seed=10 + k) for k in range(3)]},
                       None, oracle=_meshgrid_oracle)


@pytest.mark.parametrize("dtype", CPLX + ("int32", "int64"))
def test_partial_grads_complex_and_ints(dtype):
    x = [_data((3, 5), dtype, seed=1), _data((3, 5), dtype, seed=2)]
    attrs = {"start_index": 1, "length": 3}
    check_as_given("partial_concat_grad", {"x": x, "out_grad": _data((3, 6), dtype, seed=3)}, attrs,
                   oracle=_partial_oracle("partial_concat"))
    if dtype in ("int32", "int64"):
        check_as_given("partial_sum_grad", {"x": x, "out_grad": _data((3, 3), dtype, seed=4)}, attrs,
                       oracle=_partial_oracle("partial_sum"))


@pytest.mark.parametrize("dtype", ("bool", "int32", "int64"))
def test_fill_grad_ints(dtype):
    check_as_given("fill_grad", {"out_grad": _data((3, 4), dtype)}, {"value": 2.5})
