"""The runtime: in-place pairs, output buffers, views, no_need_buffer, dtypes at the boundary."""

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from harness import cast
from samples import implemented_ops, sample
from tvmgrad import registry
from tvmgrad.spec import load_specs


def _inplace_ops():
    return [op for op in implemented_ops() if registry.get(op).spec.inplace]


@pytest.mark.parametrize("op", _inplace_ops())
def test_inplace_writes_into_the_input_and_matches(op):
    """Every YAML inplace pair: same values as out-of-place, written into the input's buffer,
    even when other outputs read that input (aliased outputs are written last)."""
    inputs, attrs = sample(op, seed=5)
    inputs = {k: cast(v, "float32") for k, v in inputs.items()}

    def fresh():
        return {k: [a.copy() for a in v] if isinstance(v, list) else v.copy() for k, v in inputs.items()}

    def each(v):                         # a Tensor[] pair is written element by element
        return v if isinstance(v, list) else [v]

    expected = tvmgrad.run(op, fresh(), attrs)
    copies = fresh()
    got = tvmgrad.run(op, copies, attrs, inplace=True)
    for src, dst in registry.get(op).spec.inplace:
        for a, b in zip(each(copies[src]), each(got[dst])):
            if a.size == b.size:
                assert np.shares_memory(b, a), f"{op}: {dst} is not written into {src}"
    for name, value in expected.items():
        for g, w in zip(each(got[name]), each(value)):
            np.testing.assert_array_equal(g, w, err_msg=f"{op}.{name}")


def test_inplace_needs_a_matching_buffer():
    x = np.linspace(-1, 1, 6).astype("float32")
    with pytest.raises(ValueError, match="relu_grad: output 'x_grad' must be a writable"):
        tvmgrad.run("relu_grad", {"out": x, "out_grad": np.broadcast_to(x, (6,))}, inplace=True)


def test_prepared_launch_writes_given_outputs():
    x = np.linspace(-1, 1, 10).astype("float32")
    launch = tvmgrad.prepare("relu_grad", {"out": x, "out_grad": x * 3})
    buf = np.full(10, np.nan, dtype="float32")
    result = launch(out={"x_grad": buf})
    assert result["x_grad"] is buf
    np.testing.assert_array_equal(buf, np.where(x > 0, x * 3, 0))


def test_given_outputs_are_checked_every_call():
    """The same out arrays reused call after call are written each time; one made unfit since
    (read-only, reshaped) is refused as at its first use; a misaligned one is written through a
    scratch buffer; another dtype, or byte order, is refused."""
    x = np.linspace(-1, 1, 12).astype("float32")
    launch = tvmgrad.prepare("relu_grad", {"out": x, "out_grad": x * 3})
    want = np.where(x > 0, x * 3, 0)
    buf = np.full(12, np.nan, dtype="float32")
    for _ in range(3):
        buf[:] = np.nan
        assert launch(out={"x_grad": buf})["x_grad"] is buf
        np.testing.assert_array_equal(buf, want)
    assert launch({"out": x.copy(), "out_grad": x * 3}, out={"x_grad": buf})["x_grad"] is buf
    buf.flags.writeable = False
    with pytest.raises(ValueError, match="writable C-contiguous"):
        launch(out={"x_grad": buf})
    buf.flags.writeable = True
    buf.shape = (3, 4)
    with pytest.raises(ValueError, match=r"must have shape \[12\]"):
        launch(out={"x_grad": buf})
    with pytest.raises(ValueError, match="dtype float32"):
        launch(out={"x_grad": np.empty(12, "float64")})
    with pytest.raises(TypeError, match="must be an array"):
        launch(out={"x_grad": None})
    odd = np.zeros(12 * 4 + 1, np.uint8)[1:].view("float32")       # not element-aligned
    assert not odd.flags.aligned
    assert launch(out={"x_grad": odd})["x_grad"] is odd
    np.testing.assert_array_equal(odd, want)
    with pytest.raises(ValueError, match="dtype float32"):             # DLPack: native order
        launch(out={"x_grad": np.zeros(12, ">f4")})


def test_repeated_calls_take_strided_and_read_only_inputs():
    """A cached run and a launch on new arrays (the same signature) copy a strided input and take
    a read-only one, call after call, with the values of each call's arrays."""
    x = np.linspace(-1, 1, 24).astype("float32")
    launch = tvmgrad.prepare("sigmoid_grad", {"out": x[:12], "out_grad": x[12:]})
    for step in range(3):
        out = (x * (step + 1))[::2]                  # strided: the prepared signature's shape
        g = np.ascontiguousarray(x[::-2])
        g.flags.writeable = False
        want = g * out * (1 - out)
        for call in (lambda: tvmgrad.run("sigmoid_grad", {"out": out, "out_grad": g}),
                     lambda: launch({"out": out, "out_grad": g})):
            np.testing.assert_allclose(call()["x_grad"], want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "complex64", "strided"])
def test_a_prepared_launch_reads_its_arrays_anew_each_call(dtype):
    """launch() keeps its prepared arrays' kernel arguments (views of their memory): every call
    sees what the arrays hold now (a strided array, copied in, too), and returns a new output."""
    npd = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(
        "float32" if dtype == "strided" else dtype)
    out = np.linspace(-1, 1, 8).astype(npd)
    if dtype == "strided":
        out = np.linspace(-1, 1, 16).astype(npd)[::2]
    if dtype == "complex64":
        out = out * (1 + 2j)                   # abs_grad: complex x, real out_grad
        npd = np.float32
    g = np.arange(1, 9).astype(npd)
    launch = tvmgrad.prepare("abs_grad", {"x": out, "out_grad": g}) if dtype == "complex64" \
        else tvmgrad.prepare("relu_grad", {"out": out, "out_grad": g})
    first = launch()
    for step in range(1, 3):
        g[:] = (np.arange(1, 9) * (step + 1)).astype(npd)
        out[::2] = -out[::2]
        got = launch()
        want = tvmgrad.run("abs_grad", {"x": out, "out_grad": g}) if dtype == "complex64" \
            else tvmgrad.run("relu_grad", {"out": out, "out_grad": g})
        name = "x_grad"
        assert got[name] is not first[name]
        np.testing.assert_array_equal(got[name], want[name])
        assert not np.array_equal(got[name], first[name])


def test_views_and_odd_layouts():
    base = np.random.default_rng(0).standard_normal((6, 5))
    out, g = base.T, base[::-1].T            # non-contiguous views are copied in
    got = tvmgrad.run("relu_grad", {"out": out, "out_grad": g})["x_grad"]
    np.testing.assert_array_equal(got, np.where(out > 0, g, 0))
    scalar = tvmgrad.run("relu_grad", {"out": np.float64(2.0), "out_grad": np.float64(-3.0)})["x_grad"]
    assert scalar.shape == () and scalar == -3.0
    lists = tvmgrad.run("relu_grad", {"out": [1.0, -1.0], "out_grad": [5.0, 6.0]})["x_grad"]
    np.testing.assert_array_equal(lists, [5.0, 0.0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_round_trip(dtype):
    npd = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    x = np.linspace(-2, 2, 9).astype(npd)
    got = tvmgrad.run("relu_grad", {"out": x, "out_grad": x})["x_grad"]
    assert got.dtype == np.dtype(npd)
    np.testing.assert_array_equal(got.astype(np.float32), np.maximum(x.astype(np.float32), 0))


def test_no_need_buffer_inputs_never_reach_the_kernel():
    """A builder may use a no_need_buffer input's shape but not its data."""
    from tvm import te

    from tvmgrad.families.tensor import TensorOp
    spec = load_specs()["argsort_grad"]           # no_need_buffer: x
    assert spec.no_need_buffer == {"x"}
    n = te.var("n", "int64")
    x = te.placeholder((n,), "float32", name="x")
    g = te.placeholder((n,), "float32", name="g")
    shape_only = te.compute(x.shape, lambda i: g[i], name="dx")
    func = TensorOp.prim_func(spec, [g, shape_only])
    assert [p.name for p in func.params] == ["g", "dx"]
    reads_data = te.compute(x.shape, lambda i: g[i] * x[i], name="dx")
    with pytest.raises(RuntimeError, match="argsort_grad: the kernel reads an input the YAML marks "
                                           "no_need_buffer"):
        TensorOp.prim_func(spec, [g, reads_data])
