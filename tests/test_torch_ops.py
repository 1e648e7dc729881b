"""tvmgrad's backward ops as torch operators (``torch.ops.tvmgrad.<op>``), checked against
torch's own backward kernels, torch.library.opcheck and torch.compile."""

import numpy as np
import pytest

import tvmgrad
from tvmgrad import registry

torch = pytest.importorskip("torch")
tt = pytest.importorskip("tvmgrad.torch")

OPS = ["gelu_grad", "tanh_grad", "log_softmax_grad", "layer_norm_grad", "concat_grad"]


@pytest.fixture(scope="module", autouse=True)
def ops():
    tt.register(OPS)
    return torch.ops.tvmgrad


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_grad_matches_aten(ops, approximate):
    x, g = _randn(4, 33, seed=1), _randn(4, 33, seed=2)
    got = ops.gelu_grad(x, g, approximate)
    want = torch.ops.aten.gelu_backward(g, x, approximate="tanh" if approximate else "none")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tanh_grad_matches_aten(ops, dtype):
    out, g = torch.tanh(_randn(7, 9, seed=3, dtype=dtype)), _randn(7, 9, seed=4, dtype=dtype)
    got = ops.tanh_grad(out, g)
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.ops.aten.tanh_backward(g, out))


@pytest.mark.parametrize("axis", [-1, 0])
def test_log_softmax_grad_matches_aten(ops, axis):
    out = torch.log_softmax(_randn(5, 12, seed=5), axis)
    g = _randn(5, 12, seed=6)
    got = ops.log_softmax_grad(out, g, axis)
    want = torch.ops.aten._log_softmax_backward_data(g, out, axis, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ops.log_softmax_grad(out, g, axis=axis), got)   # keyword attributes


def _layer_norm_case(affine: bool):
    x, g = _randn(6, 4, 10, seed=7), _randn(6, 4, 10, seed=8)
    w = _randn(40, seed=9) if affine else None
    b = _randn(40, seed=10) if affine else None
    mean = x.reshape(6, 40).mean(1)
    var = x.reshape(6, 40).var(1, unbiased=False)
    return x, g, w, b, mean, var


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_grad_matches_aten_with_and_without_its_optional_inputs(ops, affine):
    x, g, w, b, mean, var = _layer_norm_case(affine)
    eps = 1e-5
    x_grad, w_grad, b_grad = ops.layer_norm_grad(x, w, b, mean, var, g, epsilon=eps, begin_norm_axis=1)
    rstd = (var + eps).rsqrt().reshape(6, 1, 1)
    want = torch.ops.aten.native_layer_norm_backward(
        g, x, [4, 10], mean.reshape(6, 1, 1), rstd,
        w.reshape(4, 10) if affine else None, b.reshape(4, 10) if affine else None,
        [True, affine, affine])
    torch.testing.assert_close(x_grad, want[0], rtol=1e-4, atol=1e-5)
    if affine:
        torch.testing.assert_close(w_grad, want[1].reshape(40), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b_grad, want[2].reshape(40), rtol=1e-4, atol=1e-5)
    else:
        assert w_grad is None and b_grad is None


def test_concat_grad_takes_and_returns_tensor_lists(ops):
    xs = [_randn(3, n, seed=n) for n in (2, 5, 1)]
    g = _randn(3, 8, seed=11)
    got = ops.concat_grad(xs, g, 1)
    assert isinstance(got, list) and len(got) == 3
    for a, b in zip(got, torch.split(g, [2, 5, 1], dim=1)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_ops_agree_with_tvmgrad_run(ops):
    x, g = _randn(16, seed=12), _randn(16, seed=13)
    want = tvmgrad.run("gelu_grad", {"x": x.numpy(), "out_grad": g.numpy()}, {"approximate": False})
    np.testing.assert_array_equal(ops.gelu_grad(x, g, False).numpy(), want["x_grad"])


@pytest.mark.parametrize("op", ["gelu_grad", "concat_grad", "layer_norm_grad"])
def test_opcheck_fake_agrees_with_real(ops, op):
    if op == "gelu_grad":
        args = (_randn(3, 8, seed=1), _randn(3, 8, seed=2), True)
    elif op == "concat_grad":
        args = ([_randn(2, 3, seed=1), _randn(2, 4, seed=2)], _randn(2, 7, seed=3), 1)
    else:
        x, g, w, b, mean, var = _layer_norm_case(True)
        args = (x, w, b, mean, var, g, 1e-5, 1)
    torch.library.opcheck(getattr(ops, op).default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static",
                                      "test_aot_dispatch_dynamic"))


def test_an_op_inside_torch_compile_fullgraph(ops):
    x, g = _randn(4, 16, seed=14), _randn(4, 16, seed=15)

    def step(x, g):
        return ops.gelu_grad(x * 2.0, g, False).sum(0) + 1.0

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, g), step(x, g), rtol=0, atol=0)


def test_the_schema_follows_the_yaml():
    assert tt.schema("gelu_grad") == "(Tensor x, Tensor out_grad, bool approximate) -> Tensor"
    assert tt.schema("concat_grad") == "(Tensor[] x, Tensor out_grad, Scalar axis=0) -> Tensor[]"
    assert tt.schema("layer_norm_grad") == (
        "(Tensor x, Tensor? scale, Tensor? bias, Tensor mean, Tensor variance, Tensor out_grad, "
        "float epsilon=1e-05, int begin_norm_axis=1) -> (Tensor?, Tensor?, Tensor?)")
    # a default the schema cannot spell (a dtype) is an optional argument: None = the YAML default
    assert tt.schema("cummax_grad").endswith("int axis=-1, ScalarType? dtype=None) -> Tensor")


def test_every_implemented_op_registers():
    tt.register()
    backward = [n for n, op in registry.ops().items() if op.available and not op.is_forward]
    done, skipped = tt.registered(), tt.skipped()
    assert set(done) | set(skipped) == set(backward) and not set(done) & set(skipped)
    assert not skipped, skipped
    for name in backward:
        assert hasattr(torch.ops.tvmgrad, name)
    print(f"\n{len(done)} ops registered, {len(skipped)} skipped")
    assert tt.register() == []                       # idempotent


def _torch_args(op):
    """Every YAML argument of ``op``'s sample call, by keyword, as the torch op takes it."""
    from samples import sample
    from tvmgrad import rt
    inputs, attrs = sample(op, seed=0)
    spec = registry.get(op).spec
    kwargs = {}
    for p in spec.args:
        if p.is_tensor:
            v = inputs.get(p.name)
            as_torch = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
            kwargs[p.name] = None if v is None else [as_torch(a) for a in v] if isinstance(v, list) \
                else as_torch(v)
        elif p.name in attrs:
            v = attrs[p.name]
            kwargs[p.name] = rt.torch_dtype(v) if p.base_type == "DataType" else \
                list(v) if isinstance(v, tuple) else v
    return kwargs


def test_every_fake_kernel_runs_on_its_sample():
    """The fake kernel (our InferMeta on fake tensors) of every registered op, on the op's sample
    call passed by keyword: the schema's argument mapping holds for all of them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    tt.register()
    failures = {}
    for op in tt.registered():
        kwargs = _torch_args(op)
        try:
            with FakeTensorMode() as mode:
                fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor)
                        else [mode.from_tensor(a) for a in v]
                        if isinstance(v, list) and v and isinstance(v[0], torch.Tensor) else v
                        for k, v in kwargs.items()}
                getattr(torch.ops.tvmgrad, op)(**fake)
        except Exception as exc:  # noqa: BLE001 - collect them all
            failures[op] = f"{type(exc).__name__}: {exc}"[:300]
    assert not failures, failures


@pytest.mark.parametrize("op", ["cummax_grad", "bilinear_interp_grad", "flatten_grad", "p_norm_grad"])
def test_sample_calls_match_tvmgrad_run(op):
    """Ops with dtype, optional-list, reshaping and many attributes, real kernel vs run."""
    tt.register([op])
    kwargs = _torch_args(op)
    got = getattr(torch.ops.tvmgrad, op)(**kwargs)
    from samples import sample
    inputs, attrs = sample(op, seed=0)
    want = tvmgrad.run(op, inputs, attrs)
    got = got if isinstance(got, tuple) else (got,)
    for name, value in zip(registry.get(op).spec.output_names, got):
        if want[name] is None:
            assert value is None
        elif isinstance(want[name], list):
            for a, b in zip(value, want[name]):
                np.testing.assert_array_equal(a.numpy(), b)
        else:
            np.testing.assert_array_equal(value.numpy(), want[name], err_msg=f"{op}.{name}")
