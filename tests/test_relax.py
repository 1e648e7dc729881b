"""tvmgrad inside TVM Relax: emitted kernels with symbolic shapes, and Relax's Gradient pass using
tvmgrad kernels for whole training steps that match Paddle."""

import numpy as np
import pytest

import tvmgrad.relax as tr
from tvmgrad.cuda import nvcc_path

tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def gradients():
    return tr.register_gradients()


def _vm(mod, target="llvm"):
    return relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())


def test_emit_keeps_relax_shape_variables_symbolic():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 6), "float32"))
    y = relax.Var("y", relax.TensorType((6,), "float32"))
    g = relax.Var("g", relax.TensorType((n, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y, g]):
        with bb.dataflow():
            dx, dy = tr.emit(bb, "atan2_grad", {"x": x, "y": y, "out_grad": g}, target="llvm")
            h = tr.emit(bb, "leaky_relu_grad", {"x": x, "out_grad": g}, {"negative_slope": 0.2})
            out = bb.emit_output(relax.Tuple([dx, dy, h]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert str(mod["main"].ret_ty.fields[0].shape.values[0]) == "n"      # stays symbolic
    vm = _vm(mod)
    rng = np.random.default_rng(0)
    for rows in (3, 7):                                                 # one compiled graph, any n
        X, G = rng.standard_normal((2, rows, 6)).astype("float32")
        Y = rng.standard_normal(6).astype("float32")
        # (TVM kernels assume 64-byte aligned buffers: hand the VM TVM tensors, not numpy views)
        args = [tvm.runtime.tensor(a) for a in (X, Y, G)]
        a, b, c = (t.numpy() for t in vm["main"](*args))
        d = X * X + Y * Y
        np.testing.assert_allclose(a, G * Y / d, rtol=1e-5)
        np.testing.assert_allclose(b, (-G * X / d).sum(0), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(c, np.where(X > 0, G, np.float32(0.2) * G), rtol=1e-6)


def test_coverage_adds_gradients_tvm_lacks(gradients):
    rows = {name: (ours, theirs) for name, ours, theirs in tr.coverage()}
    for op in ("relax.nn.gelu", "relax.erf", "relax.rsqrt", "relax.square", "relax.clip"):
        assert rows[op] == (gradients[op], False), op
    for op in ("relax.nn.rms_norm", "relax.nn.group_norm", "relax.gather_elements", "relax.cumprod"):
        assert rows[op] == (gradients[op], False), op
    assert rows["relax.nn.relu"] == ("relu_grad", True)            # ours shadows TVM's
    assert rows["relax.matmul"] == ("bmm_grad", True)
    for op in ("relax.nn.batch_norm", "relax.strided_slice", "relax.nn.adaptive_avg_pool2d", "relax.nn.conv1d",
               "relax.nn.conv2d_transpose", "relax.max", "relax.nn.pad", "relax.tile"):
        assert rows[op] == (gradients[op], False), op             # no gradient in TVM or backward.yaml
    assert rows["relax.nn.batch_norm"][0] == "batch_norm_grad"
    for op in ("relax.logical_not", "relax.argmax", "relax.isnan"):
        assert rows[op] == ("no_grad", False), op
    assert len([r for r in rows.values() if r[0]]) == len(gradients) >= 100
    assert len([r for r in rows.values() if r[0] and r[0] != "no_grad" and not r[1]]) >= 53


def _adjoint(build_body, arrays):
    """Gradient pass over main(*arrays) = sum(body(...)); returns (tvmgrad ops used, grads)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"a{i}", relax.TensorType(a.shape, str(a.dtype))) for i, a in enumerate(arrays)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.sum(build_body(*params))))
        bb.emit_func_output(out)
    float_args = [p for p, a in zip(params, arrays) if a.dtype.kind == "f"]
    grad_mod = relax.transform.Gradient("main", require_grads=float_args)(bb.get())
    _, grads = _vm(grad_mod)["main_adjoint"](*map(tvm.runtime.tensor, arrays))
    return _tvmgrad_kernels(grad_mod), [g.numpy() for g in grads]


@pytest.mark.parametrize("axis,exclusive", [(1, False), (-3, True), (None, False)])
def test_cumsum_gradient_uses_tvmgrad(axis, exclusive):
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 5, 4)).astype("float32")
    def body(a, b):                 # axis None: cumsum of the flattened data
        weights = relax.op.reshape(b, [-1]) if axis is None else b
        return relax.op.multiply(relax.op.cumsum(a, axis=axis, exclusive=exclusive), weights)

    used, (gx, _) = _adjoint(body, [x, w])
    assert "cumsum_grad" in used
    flat = w.reshape(-1) if axis is None else np.moveaxis(w, axis, -1)
    want = np.flip(np.cumsum(np.flip(flat, -1), -1), -1) - (flat if exclusive else 0)
    want = want.reshape(x.shape) if axis is None else np.moveaxis(want, -1, axis)
    np.testing.assert_allclose(gx, want, rtol=1e-5, atol=1e-5)


def test_broadcast_to_gradient_uses_expand_grad():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 1)).astype("float32")
    w = rng.standard_normal((2, 3, 5)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, b: relax.op.multiply(relax.op.broadcast_to(a, (2, 3, 5)), b), [x, w])
    assert "expand_grad" in used
    np.testing.assert_allclose(gx, w.sum(axis=(0, 2))[:, None], rtol=1e-5, atol=1e-6)


def test_where_gradient_broadcasts_back():
    rng = np.random.default_rng(3)
    cond = rng.random((4, 1, 5)) > 0.5
    x = rng.standard_normal((3, 5)).astype("float32")
    y = rng.standard_normal((4, 3, 1)).astype("float32")
    w = rng.standard_normal((4, 3, 5)).astype("float32")
    used, (gx, gy, gw) = _adjoint(lambda c, a, b, ww: relax.op.multiply(relax.op.where(c, a, b), ww),
                                  [cond, x, y, w])
    assert "where_grad" in used
    c = np.broadcast_to(cond, w.shape)
    np.testing.assert_allclose(gx, np.where(c, w, 0).sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gy, np.where(c, 0, w).sum(2, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw, np.where(c, x, y), rtol=1e-6)


def test_concat_gradient_splits_with_concat_grad():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((2, 3)).astype("float32"), rng.standard_normal((2, 4)).astype("float32")
    w = rng.standard_normal((2, 7)).astype("float32")
    used, (gx, gy, _) = _adjoint(lambda a, b, c: relax.op.multiply(relax.op.concat([a, b], axis=-1), c),
                                 [x, y, w])
    assert "concat_grad" in used
    np.testing.assert_array_equal(gx, w[:, :3])
    np.testing.assert_array_equal(gy, w[:, 3:])


def test_expand_dims_gradient_is_unsqueeze_grad(gradients):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3)).astype("float32")
    w = rng.standard_normal((2, 1, 3, 1)).astype("float32")
    _, (gx, _) = _adjoint(lambda a, c: relax.op.multiply(relax.op.expand_dims(a, [1, -1]), c), [x, w])
    assert gradients["relax.expand_dims"] == "unsqueeze_grad"      # a reshape: no kernel of its own
    np.testing.assert_array_equal(gx, w[:, 0, :, 0])


@pytest.mark.parametrize("mode", ["fast", "clip", "wrap"])
def test_take_gradient_scatters_with_index_select_grad(mode):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3)).astype("float32")
    idx = np.array([0, 2, 2, 1, -3] if mode == "fast" else [-1, 5, 2, 2, 0], dtype="int64")
    w = rng.standard_normal((2, 5)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, i, c: relax.op.multiply(relax.op.take(a, i, axis=-1, mode=mode), c),
                                [x, idx, w])
    assert "index_select_grad" in used
    mapped = {"fast": idx % 3, "clip": np.clip(idx, 0, 2), "wrap": idx % 3}[mode]
    want = np.zeros_like(x)
    np.add.at(want, (slice(None), mapped), w)          # repeated indices add up
    np.testing.assert_allclose(gx, want, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, -1])
def test_take_with_nd_indices_flattens_them(axis):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3)).astype("float32")
    idx = np.array([[0, 7], [3, -2]], dtype="int64")
    w = rng.standard_normal((2, 2, 3) if axis == 0 else (4, 2, 2)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, i, c: relax.op.multiply(relax.op.take(a, i, axis=axis, mode="wrap"), c),
                             [x, idx, w])
    assert "index_select_grad" in used               # TVM's take_backward has no N-d indices
    want = np.zeros_like(x)
    if axis == 0:
        np.add.at(want, idx.reshape(-1) % 4, w.reshape(-1, 3))
    else:
        np.add.at(want, (slice(None), idx.reshape(-1) % 3), w.reshape(4, -1))
    np.testing.assert_allclose(gx, want, rtol=1e-6)


def _take_concat_graph():
    """sum(concat([take(x, i, axis=1, mode='wrap'), y], axis=1) * w) over a symbolic batch n."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 3, 4), "float32"))
    i = relax.Var("i", relax.TensorType((5,), "int64"))
    y = relax.Var("y", relax.TensorType((n, 2, 4), "float32"))
    w = relax.Var("w", relax.TensorType((n, 7, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, i, y, w]):
        with bb.dataflow():
            joined = relax.op.concat([relax.op.take(x, i, axis=1, mode="wrap"), y], axis=1)
            out = bb.emit_output(bb.emit(relax.op.sum(relax.op.multiply(joined, w))))
        bb.emit_func_output(out)
    return relax.transform.Gradient("main", require_grads=[x, y])(bb.get())


def test_gradients_of_symbolic_graph_run_at_any_size():
    grad_mod = _take_concat_graph()
    assert {"index_select_grad", "concat_grad"} <= _tvmgrad_kernels(grad_mod)
    vm = _vm(grad_mod)
    rng = np.random.default_rng(9)
    idx = np.array([0, 4, -1, 2, 2], dtype="int64")
    for rows in (1, 3):
        x, y, w = (rng.standard_normal((rows, k, 4)).astype("float32") for k in (3, 2, 7))
        _, (gx, gy) = vm["main_adjoint"](*map(tvm.runtime.tensor, (x, idx, y, w)))
        want = np.zeros_like(x)
        np.add.at(want, (slice(None), idx % 3), w[:, :5])
        np.testing.assert_allclose(gx.numpy(), want, rtol=1e-6)
        np.testing.assert_array_equal(gy.numpy(), w[:, 5:])


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
def test_index_gradients_take_their_cuda_form():
    grad_mod = tr.schedule_kernels(_take_concat_graph(), {"kind": "cuda", "arch": "sm_80"})
    ex = tvm.compile(grad_mod, target=tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm"))
    device = ex.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
    source = "\n".join(m.inspect_source() for m in device)
    assert "index_select_grad_" in source and "concat_grad_" in source


# ------------------------------------------------------------------------------------------
# Training steps: loss and parameter grads equal Paddle's

def _mlp_module():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class MLP:
        @R.function
        def main(x: R.Tensor((8, 16), "float32"), w1: R.Tensor((16, 32), "float32"),
                 b1: R.Tensor((32,), "float32"), w2: R.Tensor((32, 10), "float32"),
                 b2: R.Tensor((10,), "float32"), labels: R.Tensor((8,), "int64")):
            with R.dataflow():
                h = R.nn.gelu(R.add(R.matmul(x, w1), b1))
                logits = R.add(R.matmul(R.tanh(h), w2), b2)
                loss = R.nn.nll_loss(R.nn.log_softmax(logits, axis=-1), labels, reduction="mean")
                R.output(loss)
            return loss
    return MLP


def _mlp_paddle(x, w1, b1, w2, b2, labels):
    import paddle
    import paddle.nn.functional as F
    params = [paddle.to_tensor(a, stop_gradient=False) for a in (w1, b1, w2, b2)]
    pw1, pb1, pw2, pb2 = params
    h = F.gelu(paddle.to_tensor(x) @ pw1 + pb1)
    loss = F.nll_loss(F.log_softmax(paddle.tanh(h) @ pw2 + pb2, axis=-1), paddle.to_tensor(labels))
    loss.backward()
    return float(loss), [p.grad.numpy() for p in params]


def _tvmgrad_kernels(mod) -> set[str]:
    return {str(f.attrs["tvmgrad.op"]) for f in mod.functions.values()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and "tvmgrad.op" in f.attrs}


def test_mlp_training_step_matches_paddle():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype("float32")
    w1, w2 = (rng.standard_normal(s).astype("float32") * 0.3 for s in ((16, 32), (32, 10)))
    b1, b2 = (rng.standard_normal(s).astype("float32") * 0.1 for s in ((32,), (10,)))
    labels = rng.integers(0, 10, 8).astype("int64")
    grad_mod = relax.transform.Gradient("main", require_grads=None)(_mlp_module())
    assert {"bmm_grad", "gelu_grad", "tanh_grad", "log_softmax_grad"} <= _tvmgrad_kernels(grad_mod)
    loss, grads = _vm(grad_mod)["main_adjoint"](*map(tvm.runtime.tensor, (x, w1, b1, w2, b2, labels)))
    want_loss, want = _mlp_paddle(x, w1, b1, w2, b2, labels)
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5)
    for got, exp in zip([g.numpy() for g in grads][1:5], want):
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-6)


def _cnn_module():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class CNN:
        @R.function
        def main(x: R.Tensor((2, 3, 8, 8), "float32"), w: R.Tensor((4, 3, 3, 3), "float32"),
                 gamma: R.Tensor((4, 8, 8), "float32"), beta: R.Tensor((4, 8, 8), "float32"),
                 fc: R.Tensor((256, 5), "float32"), labels: R.Tensor((2,), "int64")):
            with R.dataflow():
                c = R.nn.relu(R.nn.conv2d(x, w, strides=[1, 1], padding=[1, 1, 1, 1]))
                n = R.nn.layer_norm(c, gamma, beta, axes=[1, 2, 3], epsilon=1e-5)
                logits = R.matmul(R.reshape(n, [2, 256]), fc)
                loss = R.nn.nll_loss(R.nn.log_softmax(logits, axis=-1), labels, reduction="mean")
                R.output(loss)
            return loss
    return CNN


def _cnn_paddle(x, w, gamma, beta, fc, labels):
    import paddle
    import paddle.nn.functional as F
    params = [paddle.to_tensor(a, stop_gradient=False) for a in (w, gamma, beta, fc)]
    pw, pg, pb, pfc = params
    c = F.relu(F.conv2d(paddle.to_tensor(x), pw, padding=1))
    n = F.layer_norm(c, [4, 8, 8], weight=pg.reshape([-1]), bias=pb.reshape([-1]), epsilon=1e-5)
    loss = F.nll_loss(F.log_softmax(n.reshape([2, 256]) @ pfc, axis=-1), paddle.to_tensor(labels))
    loss.backward()
    return float(loss), [p.grad.numpy() for p in params]


def test_cnn_training_step_matches_paddle():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 8, 8)).astype("float32")
    w = rng.standard_normal((4, 3, 3, 3)).astype("float32") * 0.3
    gamma = (1 + 0.1 * rng.standard_normal((4, 8, 8))).astype("float32")
    beta = (0.1 * rng.standard_normal((4, 8, 8))).astype("float32")
    fc = rng.standard_normal((256, 5)).astype("float32") * 0.1
    labels = rng.integers(0, 5, 2).astype("int64")
    grad_mod = relax.transform.Gradient("main")(_cnn_module())
    used = _tvmgrad_kernels(grad_mod)
    assert {"relu_grad", "layer_norm_grad", "log_softmax_grad"} <= used
    assert {"conv2d_data_grad", "conv2d_filter_grad"} <= used      # dx and dw as two kernels
    loss, grads = _vm(grad_mod)["main_adjoint"](*map(tvm.runtime.tensor, (x, w, gamma, beta, fc, labels)))
    want_loss, want = _cnn_paddle(x, w, gamma, beta, fc, labels)
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5)
    for got, exp in zip([g.numpy() for g in grads][1:5], want):
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
@pytest.mark.parametrize("build", [_mlp_module, _cnn_module], ids=["mlp", "cnn"])
def test_training_graphs_compile_for_cuda(build):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm")
    grad_mod = relax.transform.Gradient("main")(build())
    grad_mod = tr.schedule_kernels(grad_mod, {"kind": "cuda", "arch": "sm_80"})
    ex = tvm.compile(grad_mod, target=target)
    device = ex.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
    source = "\n".join(m.inspect_source() for m in device)
    for op in _tvmgrad_kernels(grad_mod):
        assert f"{op}_" in source, f"{op} has no CUDA kernel in the compiled graph"


# ------------------------------------------------------------------------------------------
# More gradients (issue #9): each asserts its tvmgrad kernel and the gradient values

def _paddle_grads(fn, arrays):
    """Paddle's gradients of sum(fn(*tensors)) w.r.t. the float arrays."""
    import paddle
    ts = [paddle.to_tensor(a, stop_gradient=a.dtype.kind != "f") for a in arrays]
    fn(*ts).sum().backward()
    return [t.grad.numpy() for t, a in zip(ts, arrays) if a.dtype.kind == "f"]


def _check(got, want, rtol=1e-5, atol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("xs,ys,kernel", [
    ((3, 4), (4, 5), True), ((2, 3, 4), (4, 5), True), ((2, 3, 4), (2, 4, 5), True),
    ((4,), (4, 5), True), ((3, 4), (4,), True), ((2, 1, 3, 4), (3, 4, 5), False)])
def test_matmul_gradient_uses_bmm_grad(xs, ys, kernel):
    rng = np.random.default_rng(10)
    x, y = rng.standard_normal(xs).astype("float32"), rng.standard_normal(ys).astype("float32")
    w = rng.standard_normal(np.matmul(x, y).shape).astype("float32")
    used, grads = _adjoint(lambda a, b, c: relax.op.multiply(relax.op.matmul(a, b), c), [x, y, w])
    assert ("bmm_grad" in used) == kernel            # broadcast batch dims: TVM's own gradient
    x2, y2 = (x[None] if x.ndim == 1 else x), (y[:, None] if y.ndim == 1 else y)
    w2 = w.reshape(np.matmul(x2, y2).shape)

    def sum_to(a, shape):
        a = a.sum(tuple(range(a.ndim - len(shape))))
        return a.sum(tuple(i for i, d in enumerate(shape) if d == 1), keepdims=True)

    gx = sum_to(np.matmul(w2, np.swapaxes(y2, -1, -2)), x2.shape).reshape(xs)
    gy = sum_to(np.matmul(np.swapaxes(x2, -1, -2), w2), y2.shape).reshape(ys)
    _check(grads[:2], [gx, gy], rtol=1e-4)


@pytest.mark.parametrize("axis,keepdims,kernel", [(None, False, True), ([0, 1], True, True), (1, False, False)])
def test_mean_gradient_uses_mean_all_grad(axis, keepdims, kernel):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3)).astype("float32")
    used, (gx,) = _adjoint(lambda a: relax.op.multiply(relax.op.mean(a, axis=axis, keepdims=keepdims),
                                                       relax.const(3.0, "float32")), [x])
    assert ("mean_all_grad" in used) == kernel       # other axes: broadcast back in Relax
    np.testing.assert_allclose(gx, np.full_like(x, 3.0 / (6 if kernel else 3)), rtol=1e-6)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_gradients_broadcast_and_send_ties_to_x(name):
    """Ties: fmax/fmin_grad give the whole grad to x (TVM's maximum_grad does too, its
    minimum_grad gives it to y; Paddle's maximum/minimum split it 0.5/0.5)."""
    x = np.array([[1.0], [2.0], [3.0]], dtype="float32")
    y = np.array([[2.0, 0.5, 3.0, 1.0]], dtype="float32")
    w = np.arange(12, dtype="float32").reshape(3, 4) + 1
    used, (gx, gy, _) = _adjoint(lambda a, b, c: relax.op.multiply(getattr(relax.op, name)(a, b), c), [x, y, w])
    assert ("fmax_grad" if name == "maximum" else "fmin_grad") in used
    to_x = (x >= y) if name == "maximum" else (x <= y)
    np.testing.assert_allclose(gx, np.where(to_x, w, 0).sum(1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(gy, np.where(to_x, 0, w).sum(0, keepdims=True), rtol=1e-6)


def test_power_with_constant_exponent_uses_pow_grad():
    rng = np.random.default_rng(12)
    x = rng.random((2, 3)).astype("float32") + 0.5
    used, (gx,) = _adjoint(lambda a: relax.op.power(a, relax.const(2.5, "float32")), [x])
    assert "pow_grad" in used
    np.testing.assert_allclose(gx, 2.5 * x ** 1.5, rtol=1e-5)
    y = np.full((2, 3), 2.5, dtype="float32")         # a tensor exponent: TVM's gradient
    used, (gx, gy) = _adjoint(lambda a, b: relax.op.power(a, b), [x, y])
    assert "pow_grad" not in used
    _check([gx, gy], [2.5 * x ** 1.5, x ** 2.5 * np.log(x)], rtol=1e-5)


def test_shape_op_gradients(gradients):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 1, 3)).astype("float32")
    w2, w6 = rng.standard_normal((2, 3)).astype("float32"), rng.standard_normal(6).astype("float32")
    for op, body, w, want in [
            ("squeeze", lambda a, c: relax.op.multiply(relax.op.squeeze(a), c), w2, w2[:, None]),
            ("squeeze", lambda a, c: relax.op.multiply(relax.op.squeeze(a, [1]), c), w2, w2[:, None]),
            ("flatten", lambda a, c: relax.op.multiply(relax.op.flatten(a), c), w6, w6.reshape(x.shape))]:
        _, (gx, _) = _adjoint(body, [x, w])
        assert gradients[f"relax.{op}"] == f"{op}_grad"      # a reshape: no kernel of its own
        np.testing.assert_array_equal(gx, want)
    w = rng.standard_normal(x.shape).astype("float32")
    used, (gx, _) = _adjoint(lambda a, c: relax.op.multiply(relax.op.flip(a, 2), c), [x, w])
    assert "flip_grad" in used or gradients["relax.flip"] == "flip_grad"
    np.testing.assert_array_equal(gx, w[:, :, ::-1])


def test_stack_gradient_uses_stack_grad():
    rng = np.random.default_rng(14)
    x, y = rng.standard_normal((2, 2, 3)).astype("float32")
    w = rng.standard_normal((2, 2, 3)).astype("float32")
    used, (gx, gy, _) = _adjoint(lambda a, b, c: relax.op.multiply(relax.op.stack([a, b], axis=1), c),
                                 [x, y, w])
    assert "stack_grad" in used
    np.testing.assert_array_equal(gx, w[:, 0])
    np.testing.assert_array_equal(gy, w[:, 1])


@pytest.mark.parametrize("axis", [1, None])
def test_cumprod_gradient_uses_cumprod_grad(axis):
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 4)).astype("float32")
    x[0, 1] = 0.0                                      # exact with zeros
    w = rng.standard_normal(8 if axis is None else (2, 4)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, c: relax.op.multiply(relax.op.cumprod(a, axis=axis), c), [x, w])
    assert "cumprod_grad" in used
    want = _paddle_grads(lambda a, c: paddle_cumprod(a, axis) * c, [x, w])[0]
    np.testing.assert_allclose(gx, want, rtol=1e-5, atol=1e-6)


def paddle_cumprod(a, axis):
    import paddle
    return paddle.cumprod(a.reshape([-1]) if axis is None else a, dim=0 if axis is None else axis)


def test_gather_gradients_scatter_back():
    rng = np.random.default_rng(16)
    x = rng.standard_normal((3, 4)).astype("float32")
    idx = np.array([[0, 3, 3], [1, 1, -4]], dtype="int64")
    w = rng.standard_normal((2, 3)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, i, c: relax.op.multiply(relax.op.gather_elements(a, i, axis=1), c),
                             [x, idx, w])
    assert "take_along_axis_grad" in used
    want = np.zeros_like(x)
    np.add.at(want, (np.arange(2)[:, None].repeat(3, 1), idx % 4), w)
    np.testing.assert_allclose(gx, want, rtol=1e-6)
    nd = np.array([[0, 1], [2, 3], [0, 1]], dtype="int64")
    w3 = rng.standard_normal(3).astype("float32")
    used, (gx, _) = _adjoint(lambda a, i, c: relax.op.multiply(relax.op.gather_nd(a, i), c), [x, nd, w3])
    assert "gather_nd_grad" in used
    want = np.zeros_like(x)
    np.add.at(want, (nd[:, 0], nd[:, 1]), w3)
    np.testing.assert_allclose(gx, want, rtol=1e-6)


@pytest.mark.parametrize("reduction", ["update", "add", "max"])
def test_scatter_elements_gradient_uses_put_along_axis_grad(reduction):
    x = np.array([[1.0, 5.0, 2.0], [0.5, -1.0, 4.0]], dtype="float32")
    idx = np.array([[1, 1], [2, 0]], dtype="int64")         # two updates land on x[0, 1]
    # max: x[1, 0] = 0.5 ties with its update; Paddle's amax rule splits the grad between them
    upd = np.array([[3.0, 7.0], [1.0, 0.5]], dtype="float32")
    w = np.arange(1, 7, dtype="float32").reshape(2, 3)
    used, (gx, gu, _) = _adjoint(
        lambda a, i, u, c: relax.op.multiply(relax.op.scatter_elements(a, i, u, axis=1, reduction=reduction), c),
        [x, idx, upd, w])
    assert "put_along_axis_grad" in used
    want_x = {"update": [[1, 0, 3], [0, 5, 0]], "add": w, "max": [[1, 0, 3], [2, 5, 6]]}[reduction]
    want_u = {"update": [[0, 2], [6, 4]], "add": [[2, 2], [6, 4]], "max": [[0, 2], [0, 2]]}[reduction]
    _check([gx, gu], [np.asarray(want_x, "float32"), np.asarray(want_u, "float32")], rtol=1e-6)


def test_scatter_elements_mean_has_no_gradient():
    x = np.zeros((2, 3), "float32")
    idx = np.zeros((2, 1), "int64")
    with pytest.raises(Exception, match="reduction 'mean'"):
        _adjoint(lambda a, i, u: relax.op.scatter_elements(a, i, u, reduction="mean"), [x, idx, x[:, :1]])


@pytest.mark.parametrize("axis", [1, -1])
def test_prelu_gradient_uses_prelu_grad(axis):
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 3, 3)).astype("float32")
    alpha = rng.random(3).astype("float32")
    w = rng.standard_normal(x.shape).astype("float32")
    used, (gx, ga, _) = _adjoint(lambda a, al, c: relax.op.multiply(relax.op.nn.prelu(a, al, axis=axis), c),
                                 [x, alpha, w])
    assert "prelu_grad" in used
    shape = (1, 3, 1) if axis == 1 else (1, 1, 3)
    al = alpha.reshape(shape)
    _check([gx, ga], [np.where(x > 0, w, al * w), np.where(x > 0, 0, x * w).sum(
        axis=(0, 2) if axis == 1 else (0, 1))], rtol=1e-5)


def test_selu_gradient_uses_selu_grad():
    import paddle.nn.functional as F
    x = np.random.default_rng(18).standard_normal((2, 3)).astype("float32")
    used, (gx,) = _adjoint(lambda a: relax.op.multiply(relax.op.nn.selu(a), a), [x])
    assert "selu_grad" in used
    np.testing.assert_allclose(gx, _paddle_grads(lambda a: F.selu(a) * a, [x])[0], rtol=1e-5, atol=1e-6)


def test_pixel_shuffle_gradient_alone():
    """TVM 0.27 cannot legalize relax.nn.pixel_shuffle (it calls topi.nn.pixel_shuffle, which does
    not exist), so no graph holding the forward compiles: emit the registered gradient alone."""
    x = relax.Var("x", relax.TensorType((1, 8, 2, 3), "float32"))
    g = relax.Var("g", relax.TensorType((1, 2, 4, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g]):
        with bb.dataflow():
            call = bb.normalize(relax.op.nn.pixel_shuffle(x, 2))
            fgrad = tvm.ir.Op.get("relax.nn.pixel_shuffle").get_attr("FPrimalGradient")
            (dx,) = fgrad(g, call, g, bb)
            out = bb.emit_output(dx)
        bb.emit_func_output(out)
    mod = bb.get()
    assert _tvmgrad_kernels(mod) == {"pixel_shuffle_grad"}
    G = np.random.default_rng(18).standard_normal((1, 2, 4, 6)).astype("float32")
    got = _vm(mod)["main"](tvm.runtime.tensor(np.zeros((1, 8, 2, 3), "float32")), tvm.runtime.tensor(G))
    want = G.reshape(1, 2, 2, 2, 3, 2).transpose(0, 1, 3, 5, 2, 4).reshape(1, 8, 2, 3)   # pixel_unshuffle
    np.testing.assert_array_equal(got.numpy(), want)


def test_norm_gradients_recompute_statistics():
    import paddle
    import paddle.nn.functional as F
    rng = np.random.default_rng(19)
    x = rng.standard_normal((2, 4, 3)).astype("float32")
    g, b = (1 + 0.1 * rng.standard_normal(4)).astype("float32"), rng.standard_normal(4).astype("float32")
    w = rng.standard_normal(x.shape).astype("float32")
    gw = (1 + 0.1 * rng.standard_normal(3)).astype("float32")

    used, got = _adjoint(lambda a, s, c: relax.op.multiply(relax.op.nn.rms_norm(a, s, axes=[-1]), c), [x, gw, w])
    assert "rms_norm_grad" in used
    _check(got[:2], _paddle_grads(lambda a, s, c: a * paddle.rsqrt((a * a).mean(-1, keepdim=True) + 1e-5)
                                  * s * c, [x, gw, w])[:2], rtol=1e-4)

    used, got = _adjoint(lambda a, s, t, c: relax.op.multiply(
        relax.op.nn.group_norm(a, s, t, num_groups=2, channel_axis=1, axes=[2]), c), [x, g, b, w])
    assert "group_norm_grad" in used
    _check(got[:3], _paddle_grads(lambda a, s, t, c: F.group_norm(a, 2, 1e-5, s, t) * c, [x, g, b, w])[:3],
           rtol=1e-4)

    used, got = _adjoint(lambda a, s, t, c: relax.op.multiply(
        relax.op.nn.instance_norm(a, s, t, channel_axis=1, axes=[2]), c), [x, g, b, w])
    assert "instance_norm_grad" in used
    _check(got[:3], _paddle_grads(lambda a, s, t, c: F.instance_norm(a, weight=s, bias=t, eps=1e-5) * c,
                                  [x, g, b, w])[:3], rtol=1e-4)


def test_conv3d_gradient_uses_conv3d_grad():
    import paddle.nn.functional as F
    rng = np.random.default_rng(20)
    x = rng.standard_normal((1, 2, 4, 3, 3)).astype("float32")
    w = rng.standard_normal((3, 2, 2, 2, 2)).astype("float32")
    c = rng.standard_normal((1, 3, 4, 2, 4)).astype("float32")
    used, got = _adjoint(lambda a, b, cc: relax.op.multiply(
        relax.op.nn.conv3d(a, b, padding=[1, 0, 1, 0, 0, 1]), cc), [x, w, c])
    assert "conv3d_grad" in used
    # Relax pads (front, top, left, back, bottom, right); F.pad takes (left, right, top, bottom, front, back)
    want = _paddle_grads(lambda a, b, cc: F.conv3d(F.pad(a, [1, 1, 0, 0, 1, 0], data_format="NCDHW"), b) * cc,
                         [x, w, c])
    _check(got[:2], want[:2], rtol=1e-4)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_gradient_uses_argsort_grad(descending):
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 5)).astype("float32")
    w = rng.standard_normal((2, 5)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, c: relax.op.multiply(relax.op.sort(a, axis=1, descending=descending), c),
                             [x, w])
    assert "argsort_grad" in used
    order = np.argsort(-x if descending else x, axis=1)
    want = np.zeros_like(x)
    np.put_along_axis(want, order, w, axis=1)
    np.testing.assert_allclose(gx, want, rtol=1e-6)


def test_matmul_with_symbolic_dims_uses_bmm_grad_at_any_size():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 3, 4), "float32"))
    y = relax.Var("y", relax.TensorType((4, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.sum(relax.op.matmul(x, y))))
        bb.emit_func_output(out)
    grad_mod = relax.transform.Gradient("main")(bb.get())
    assert "bmm_grad" in _tvmgrad_kernels(grad_mod)
    vm = _vm(grad_mod)
    rng = np.random.default_rng(22)
    for rows in (2, 7):                                     # one compiled graph, any batch
        X, Y = rng.standard_normal((rows, 3, 4)).astype("float32"), rng.standard_normal((4, 5)).astype("float32")
        _, (gx, gy) = vm["main_adjoint"](tvm.runtime.tensor(X), tvm.runtime.tensor(Y))
        _check([gx.numpy(), gy.numpy()], [np.ones((rows, 3, 5)) @ Y.T, X.reshape(-1, 4).T @ np.ones((rows * 3, 5))],
               rtol=1e-5)


@pytest.mark.parametrize("method,mode,rounding,paddle_kw", [
    ("linear", "half_pixel", "round", dict(mode="bilinear", align_corners=False, align_mode=0)),
    ("linear", "align_corners", "round", dict(mode="bilinear", align_corners=True)),
    ("nearest_neighbor", "asymmetric", "floor", dict(mode="nearest"))])
def test_resize2d_gradient_uses_interp_grads(method, mode, rounding, paddle_kw):
    import paddle.nn.functional as F
    rng = np.random.default_rng(23)
    x = rng.standard_normal((1, 2, 3, 4)).astype("float32")
    w = rng.standard_normal((1, 2, 5, 7)).astype("float32")
    used, (gx, _) = _adjoint(lambda a, c: relax.op.multiply(relax.op.image.resize2d(
        a, (5, 7), method=method, coordinate_transformation_mode=mode, rounding_method=rounding), c), [x, w])
    assert f"{paddle_kw['mode']}_interp_grad" in used
    want = _paddle_grads(lambda a, c: F.interpolate(a, size=[5, 7], **paddle_kw) * c, [x, w])[0]
    np.testing.assert_allclose(gx, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padding_mode,align_corners", [("border", True)])
def test_grid_sample_gradient_uses_grid_sample_grad(padding_mode, align_corners):
    import paddle
    import paddle.nn.functional as F
    rng = np.random.default_rng(24)
    x = rng.standard_normal((1, 2, 3, 4)).astype("float32")
    grid = (rng.random((1, 2, 3, 2)) * 2.4 - 1.2).astype("float32")          # (N, 2, H, W), Relax's layout
    w = rng.standard_normal((1, 2, 3, 2)).astype("float32")
    used, (gx, gg, _) = _adjoint(lambda a, g, c: relax.op.multiply(relax.op.image.grid_sample(
        a, g, padding_mode=padding_mode, align_corners=align_corners), c), [x, grid, w])
    assert "grid_sample_grad" in used
    want = _paddle_grads(lambda a, g, c: F.grid_sample(a, paddle.transpose(g, [0, 2, 3, 1]), mode="bilinear",
                                                       padding_mode=padding_mode, align_corners=align_corners) * c,
                         [x, grid, w])
    _check([gx, gg], want[:2], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ret_type", ["both", "values"])
def test_topk_gradient_uses_topk_grad(ret_type):
    rng = np.random.default_rng(25)
    x = rng.standard_normal((2, 5)).astype("float32")
    w = rng.standard_normal((2, 2)).astype("float32")

    def body(a, c):
        top = relax.op.topk(a, 2, axis=1, ret_type=ret_type, largest=False)
        return relax.op.multiply(relax.TupleGetItem(top, 0) if ret_type == "both" else top, c)

    used, (gx, _) = _adjoint(body, [x, w])
    assert "topk_grad" in used
    want = np.zeros_like(x)
    np.put_along_axis(want, np.argsort(x, axis=1)[:, :2], w, axis=1)
    np.testing.assert_allclose(gx, want, rtol=1e-6)


_NORMS = {
    "rms_norm": ([(6,), (6,)], lambda x, w: relax.op.nn.rms_norm(x, w, axes=[-1])),
    "group_norm": ([(4, 5), (4,), (4,)],
                   lambda x, w, b: relax.op.nn.group_norm(x, w, b, num_groups=2, channel_axis=1, axes=[2])),
    "instance_norm": ([(4, 5), (4,), (4,)],
                      lambda x, w, b: relax.op.nn.instance_norm(x, w, b, channel_axis=1, axes=[2])),
}


@pytest.mark.sweep
@pytest.mark.parametrize("norm", sorted(_NORMS))
def test_norm_gradients_with_a_symbolic_batch_match_static_ones(norm):
    """One symbolic-batch graph (statistics recomputed in Relax, the tvmgrad kernel symbolic)
    gives the grads of the static graphs, which the Paddle tests above check."""
    tails, body = _NORMS[norm]
    rng = np.random.default_rng(31)
    weights = [rng.standard_normal(t).astype("float32") for t in tails[1:]]

    def graph(batch):
        shapes = [(batch, *tails[0])] + tails[1:]
        params = [relax.Var(f"a{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(bb.emit(relax.op.sum(relax.op.multiply(body(*params), body(*params)))))
            bb.emit_func_output(out)
        return relax.transform.Gradient("main")(bb.get())

    symbolic = graph(tirx.Var("n", "int64"))
    assert f"{norm}_grad" in _tvmgrad_kernels(symbolic)
    vm = _vm(symbolic)
    for rows in (1, 3):
        x = rng.standard_normal((rows, *tails[0])).astype("float32")
        args = [tvm.runtime.tensor(a) for a in [x] + weights]
        _, got = vm["main_adjoint"](*args)
        _, want = _vm(graph(rows))["main_adjoint"](*args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# Non-differentiable inputs, every form of an op, batch_norm and the other ops real models emit

def test_non_differentiable_inputs_are_no_grad(gradients):
    """where's condition, nll_loss's labels, take's indices: no_grad, so the Gradient pass never
    walks into the boolean/integer subgraphs computing them (logical_not has no gradient
    anywhere; argmax gets no_grad from tvmgrad)."""
    rng = np.random.default_rng(40)
    x = rng.standard_normal((3, 5)).astype("float32")
    t = rng.standard_normal((3, 5)).astype("float32")

    def body(a, b):
        mask = relax.op.logical_not(relax.op.equal(a, relax.const(float("-inf"), "float32")))
        masked = relax.op.where(mask, relax.op.nn.log_softmax(a, axis=-1), relax.op.zeros_like(a))
        labels = relax.op.argmax(b, axis=1)
        return relax.op.nn.nll_loss(masked, labels)

    used, (gx, gt) = _adjoint(body, [x, t])
    assert {"where_grad", "nll_loss_grad", "log_softmax_grad"} <= used
    import paddle
    import paddle.nn.functional as F
    a = paddle.to_tensor(x, stop_gradient=False)
    F.nll_loss(F.log_softmax(a, axis=-1), paddle.to_tensor(t).argmax(1)).backward()
    want = a.grad.numpy()
    np.testing.assert_allclose(gx, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(gt, np.zeros_like(t))       # argmax: nothing flows back
    assert gradients["relax.logical_not"] == gradients["relax.argmax"] == "no_grad"


@pytest.mark.sweep
@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 5, 3), (2, 5, 2, 3), (2, 5, 2, 1, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_gradient_takes_every_rank(shape, reduction):
    """(C,), (N, C), (N, C, d1...dk): the kernel takes ranks 2 and 4, the rest are viewed."""
    import paddle
    import paddle.nn.functional as F
    rng = np.random.default_rng(41)
    pred = rng.standard_normal(shape).astype("float32")
    lab_shape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    labels = rng.integers(0, 5, lab_shape).astype("int64")
    if labels.ndim:
        labels.flat[0] = -100                                  # ignored
    weight = rng.random(5).astype("float32")
    cot = rng.standard_normal(lab_shape).astype("float32")
    used, (gx, _, _) = _adjoint(lambda p, lab, w, c: relax.op.multiply(
        relax.op.nn.nll_loss(p, lab, w, reduction=reduction), c if reduction == "none" else relax.const(1.0)),
        [pred, labels, weight, cot])
    assert "nll_loss_grad" in used
    p = paddle.to_tensor(pred if len(shape) > 1 else pred[None], stop_gradient=False)
    lab = paddle.to_tensor(labels if labels.ndim else labels[None])
    loss = F.nll_loss(p, lab, weight=paddle.to_tensor(weight), reduction=reduction)
    (loss * paddle.to_tensor(cot.reshape(loss.shape)) if reduction == "none" else loss).sum().backward()
    np.testing.assert_allclose(gx, p.grad.numpy().reshape(shape), rtol=1e-5, atol=1e-6)


def _torch():
    return pytest.importorskip("torch")


def _torch_grads(fn, arrays):
    torch = _torch()
    ts = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    fn(*ts).sum().backward()
    return [np.zeros_like(a) if t.grad is None else t.grad.numpy() for t, a in zip(ts, arrays) if t.requires_grad]


@pytest.mark.parametrize("layout,axis,shape", [("NCHW", 1, (2, 4, 3, 3)), ("NHWC", 3, (2, 3, 3, 4)),
                                               ("NC", 1, (5, 4)), ("NCL", 1, (2, 4, 3))])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_gradient(layout, axis, shape, training):
    """Training: batch statistics (recomputed), moving statistics no_grad; eval: the moving
    statistics are constants. Float64, to the last bits (float32 loses them to cancellation)."""
    torch = _torch()
    rng = np.random.default_rng(42)
    x, w = (rng.standard_normal(shape) for _ in range(2))
    C = shape[axis]
    gamma, beta, mean = (rng.standard_normal(C) for _ in range(3))
    var = rng.random(C) + 0.5

    def body(a, c, g, b, m, v):
        out = relax.op.nn.batch_norm(a, g, b, m, v, axis=axis, training=training, epsilon=1e-5)
        return relax.op.multiply(relax.TupleGetItem(out, 0), c)

    used, got = _adjoint(body, [x, w, gamma, beta, mean, var])
    assert "batch_norm_grad" in used
    perm = [0, axis] + [i for i in range(1, len(shape)) if i != axis]

    def reference(a, c, g, b, m, v):
        y = torch.nn.functional.batch_norm(a.permute(*perm), m.detach(), v.detach(), g, b,
                                           training=training, eps=1e-5)
        return y.permute(*np.argsort(perm).tolist()) * c

    want = _torch_grads(reference, [x, w, gamma, beta, mean, var])
    _check([got[0], got[2], got[3]], [want[0], want[2], want[3]], rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(got[4], 0)                    # moving statistics: no_grad
    np.testing.assert_array_equal(got[5], 0)


def test_batch_norm_gradient_with_a_symbolic_batch():
    n = tirx.Var("n", "int64")
    ps = [relax.Var("x", relax.TensorType((n, 3, 4), "float32")),
          relax.Var("g", relax.TensorType((3,), "float32")), relax.Var("b", relax.TensorType((3,), "float32"))]
    stats = [relax.const(np.zeros(3, "float32")), relax.const(np.ones(3, "float32"))]
    bb = relax.BlockBuilder()
    with bb.function("main", ps):
        with bb.dataflow():
            y = relax.TupleGetItem(relax.op.nn.batch_norm(ps[0], ps[1], ps[2], *stats, axis=1), 0)
            out = bb.emit_output(bb.emit(relax.op.sum(relax.op.multiply(y, y))))
        bb.emit_func_output(out)
    vm = _vm(relax.transform.Gradient("main", require_grads=ps)(bb.get()))
    torch = _torch()
    rng = np.random.default_rng(43)
    g, b = rng.standard_normal(3).astype("float32"), rng.standard_normal(3).astype("float32")
    for rows in (2, 5):
        x = rng.standard_normal((rows, 3, 4)).astype("float32")
        _, got = vm["main_adjoint"](*map(tvm.runtime.tensor, (x, g, b)))
        want = _torch_grads(lambda a, gg, bb_: torch.nn.functional.batch_norm(
            a, torch.zeros(3), torch.ones(3), gg, bb_, training=True) ** 2, [x, g, b])
        _check([t.numpy() for t in got], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("data,kernel,groups,shape,stride", [
    ("NCHW", "OIHW", 1, (2, 8, 2, 2), 1), ("NCHW", "OIHW", 1, (2, 8, 1, 1), 1),
    ("NCHW", "OIHW", 1, (2, 3, 16, 16), 2),
    ("NCHW", "OIHW", 2, (2, 8, 8, 8), 1), ("NHWC", "OIHW", 1, (2, 8, 8, 8), 1),
    ("NHWC", "HWIO", 1, (2, 3, 3, 8), 1)])
def test_conv2d_gradient_every_layout(data, kernel, groups, shape, stride):
    """Direct and GEMM (small feature maps) kernels, groups; layouts other than NCHW/NHWC with
    OIHW filters through permute_dims (TVM's own gradient takes NCHW/OIHW only)."""
    torch = _torch()
    rng = np.random.default_rng(44)
    x = rng.standard_normal(shape).astype("float32")           # in `data` layout
    xt = x.transpose([data.index(c) for c in "NCHW"])
    O = 8
    w_oihw = rng.standard_normal((O, xt.shape[1] // groups, 3, 3)).astype("float32")
    w = w_oihw.transpose(["OIHW".index(c) for c in kernel])
    y = torch.nn.functional.conv2d(torch.tensor(xt), torch.tensor(w_oihw), stride=stride, padding=1, groups=groups)
    c_nchw = rng.standard_normal(tuple(y.shape)).astype("float32")
    c = c_nchw.transpose([data.index(ch) for ch in "NCHW"]).transpose(np.argsort([data.index(ch) for ch in "NCHW"]))
    c = np.ascontiguousarray(c_nchw.transpose(["NCHW".index(ch) for ch in data]))
    used, (gx, gw, _) = _adjoint(lambda a, b, cc: relax.op.multiply(relax.op.nn.conv2d(
        a, b, strides=[stride] * 2, padding=[1] * 4, groups=groups, data_layout=data, kernel_layout=kernel), cc),
        [np.ascontiguousarray(x), np.ascontiguousarray(w), c])
    assert "conv2d_filter_grad" in used and not {"conv2d_grad"} & used
    want_x, want_w = _torch_grads(lambda a, b: torch.nn.functional.conv2d(
        a, b, stride=stride, padding=1, groups=groups) * torch.tensor(c_nchw), [xt, w_oihw])
    _check([gx, gw], [want_x.transpose(["NCHW".index(ch) for ch in data]),
                      want_w.transpose(["OIHW".index(ch) for ch in kernel])], rtol=1e-4, atol=1e-4)


def test_conv1d_and_conv2d_transpose_gradients():
    torch = _torch()
    rng = np.random.default_rng(45)
    x, w = rng.standard_normal((2, 3, 9)).astype("float32"), rng.standard_normal((4, 3, 3)).astype("float32")
    used, got = _adjoint(lambda a, b: relax.op.power(relax.op.nn.conv1d(a, b, strides=[2], padding=[1, 1]),
                                                     relax.const(2.0)), [x, w])
    assert "conv2d_filter_grad" in used
    _check(got, _torch_grads(lambda a, b: torch.nn.functional.conv1d(a, b, stride=2, padding=1) ** 2, [x, w]),
           rtol=1e-4, atol=1e-4)
    x, w = rng.standard_normal((2, 3, 4, 4)).astype("float32"), rng.standard_normal((3, 4, 3, 3)).astype("float32")
    used, got = _adjoint(lambda a, b: relax.op.power(relax.op.nn.conv2d_transpose(
        a, b, strides=[2, 2], padding=[1, 1, 1, 1], output_padding=[1, 1]), relax.const(2.0)), [x, w])
    assert {"conv2d_filter_grad"} <= used
    _check(got, _torch_grads(lambda a, b: torch.nn.functional.conv_transpose2d(
        a, b, stride=2, padding=1, output_padding=1) ** 2, [x, w]), rtol=1e-4, atol=1e-3)


def test_slicing_padding_tiling_and_pooling_gradients():
    torch = _torch()
    rng = np.random.default_rng(46)
    x = rng.standard_normal((2, 8, 8)).astype("float32")
    sq = lambda e: relax.op.power(e, relax.const(2.0))  # noqa: E731
    cases = [
        (lambda a: sq(relax.op.strided_slice(a, [1, 2], [-7, 1], [8, 8], [3, 2])), lambda a: a[:, -7::3, 1::2] ** 2,
         "strided_slice_grad"),
        (lambda a: sq(relax.op.strided_slice(a, [1], [6], [0], [-2])), lambda a: a.flip(1)[:, 1:7:2] ** 2, None),
        (lambda a: sq(relax.op.nn.pad(a, [0, 0, 1, 2, 3, 0])), lambda a: torch.nn.functional.pad(a, (3, 0, 1, 2)) ** 2,
         None),
        (lambda a: sq(relax.op.tile(a, [2, 1, 1, 3])), lambda a: a.repeat(2, 1, 1, 3) ** 2, None),
        (lambda a: sq(relax.op.nn.adaptive_avg_pool2d(relax.op.expand_dims(a, [0]), (2, 4))),
         lambda a: torch.nn.functional.adaptive_avg_pool2d(a[None], (2, 4)) ** 2, None),
        (lambda a: sq(relax.op.nn.adaptive_avg_pool2d(relax.op.expand_dims(a, [0]), (3, 5))),
         lambda a: torch.nn.functional.adaptive_avg_pool2d(a[None], (3, 5)) ** 2, "adaptive_avg_pool2d_grad"),
        (lambda a: sq(relax.op.max(a, axis=[2])), lambda a: a.amax(2) ** 2, None),
        (lambda a: sq(relax.op.min(a)), lambda a: a.amin() ** 2, None),
        (lambda a: sq(relax.op.tril(a, 1)), lambda a: torch.tril(a, 1) ** 2, None),
        (lambda a: sq(relax.op.nn.layer_norm(a, relax.const(np.linspace(0.5, 1.5, 8).astype("float32")),
                                             relax.const(np.zeros(8, "float32")), axes=[1])),
         lambda a: torch.nn.functional.layer_norm(a.transpose(1, 2), (8,), torch.linspace(0.5, 1.5, 8)
                                                  ).transpose(1, 2) ** 2, "layer_norm_grad"),
    ]
    for build, reference, kernel in cases:
        used, (gx,) = _adjoint(build, [x])
        assert kernel is None or kernel in used
        np.testing.assert_allclose(gx, _torch_grads(reference, [x])[0], rtol=1e-5, atol=1e-5)
    x[0, 1, 2] = x[0, 1, 5] = 9.0                          # ties share the grad (torch's amax)
    _, (gx,) = _adjoint(lambda a: relax.op.max(a, axis=[2]), [x])
    assert gx[0, 1, 2] == gx[0, 1, 5] == 0.5


def test_atan2_gradient_broadcasts_both_ways():
    rng = np.random.default_rng(47)
    x, y = rng.standard_normal((4, 1)).astype("float32"), rng.standard_normal((1, 5)).astype("float32")
    used, (gx, gy) = _adjoint(lambda a, b: relax.op.atan2(a, b), [x, y])
    assert "atan2_grad" in used
    d = x * x + y * y
    _check([gx, gy], [(y / d).sum(1, keepdims=True), (-x / d).sum(0, keepdims=True)], rtol=1e-5)


def test_relu_gradient_at_zero_is_zero_as_in_paddle():
    """Paddle's (and torch's) convention: relu'(0) = 0 (TVM's own gradient says 1)."""
    x = np.array([-1.0, 0.0, 2.0], dtype="float32")
    used, (gx,) = _adjoint(lambda a: relax.op.nn.relu(a), [x])
    assert "relu_grad" in used
    np.testing.assert_array_equal(gx, [0.0, 0.0, 1.0])


def test_the_default_pipeline_schedules_every_tvmgrad_kernel():
    """register_gradients() installs the tvmgrad steps in front of tvm.compile's default
    pipeline: a training step compiles scheduled without schedule_kernels."""
    from tvmgrad.relax import passes
    grad_mod = relax.transform.Gradient("main")(_cnn_module())
    assert passes.has_tvmgrad_kernels(grad_mod)
    with tvm.target.Target("llvm"):
        mod = grad_mod
        for step in passes._tvmgrad_steps(passes._current(None), True):
            mod = step(mod)
    ours = [f for f in mod.functions.values()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and "tvmgrad.op" in f.attrs]
    assert ours and all("tirx.is_scheduled" in f.attrs for f in ours)
    assert {"conv2d", "matmul"} <= {str(f.attrs["tvmgrad.op"]) for f in ours}      # the forward too
    # through tvm.compile itself: the same as the explicit pipeline, and as without the forward
    rng = np.random.default_rng(48)
    args = [rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3)) * 0.3,
            1 + 0.1 * rng.standard_normal((4, 8, 8)), 0.1 * rng.standard_normal((4, 8, 8)),
            rng.standard_normal((256, 5)) * 0.1]
    args = [a.astype("float32") for a in args] + [np.array([1, 3], "int64")]
    a = _vm(grad_mod)["main_adjoint"](*map(tvm.runtime.tensor, args))
    b = relax.VirtualMachine(tvm.compile(grad_mod, target="llvm", relax_pipeline=tr.pipeline()),
                             tvm.cpu())["main_adjoint"](*map(tvm.runtime.tensor, args))
    passes.configure(forward=False)
    try:
        c = _vm(grad_mod)["main_adjoint"](*map(tvm.runtime.tensor, args))
    finally:
        passes.configure(forward=True)
    for x, y, z in zip(a[1], b[1], c[1]):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-6)
        np.testing.assert_allclose(x.numpy(), z.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_training_graph_compiles_for_cuda_without_schedule_kernels():
    """The default pipeline schedules the tvmgrad kernels for the target being compiled for
    (batch_norm_grad, the conv kernels), so a CUDA build needs no extra step either."""
    rng = np.random.default_rng(49)
    x = relax.Var("x", relax.TensorType((2, 4, 6, 6), "float32"))
    w = relax.Var("w", relax.TensorType((8, 4, 3, 3), "float32"))
    g = relax.Var("g", relax.TensorType((8,), "float32"))
    b = relax.Var("b", relax.TensorType((8,), "float32"))
    stats = [relax.const(np.zeros(8, "float32")), relax.const(np.ones(8, "float32"))]
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, g, b]):
        with bb.dataflow():
            c = relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            y = relax.TupleGetItem(relax.op.nn.batch_norm(c, g, b, *stats, axis=1, training=True), 0)
            out = bb.emit_output(bb.emit(relax.op.sum(relax.op.nn.relu(y))))
        bb.emit_func_output(out)
    grad_mod = relax.transform.Gradient("main")(bb.get())
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm")
    ex = tvm.compile(grad_mod, target=target)
    device = ex.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
    source = "\n".join(m.inspect_source() for m in device)
    for op in _tvmgrad_kernels(grad_mod):
        assert f"{op}_" in source, f"{op} has no CUDA kernel in the compiled graph"
    del rng


@pytest.mark.parametrize("case", ["where", "nll_loss", "take", "broadcast_to", "clip", "strided_slice",
                                  "batch_norm", "argmax", "int_where"])
def test_rules_return_no_grad_exactly_at_non_differentiable_inputs(case):
    """As TVM's own rules do (tests/python/relax/test_op_gradient_numeric.py's check): a
    no_grad call at every condition, label, index, shape or moving statistic, and nowhere else."""
    f32 = lambda *s: relax.Var("f", relax.TensorType(s, "float32"))  # noqa: E731
    i64 = lambda *s: relax.Var("i", relax.TensorType(s, "int64"))  # noqa: E731
    cond = relax.Var("c", relax.TensorType((3, 4), "bool"))
    R = relax.op
    call, ignored = {
        "where": (lambda: R.where(cond, f32(3, 4), f32(3, 4)), {0}),
        "nll_loss": (lambda: R.nn.nll_loss(f32(2, 5, 3), i64(2, 3), f32(5)), {1, 2}),
        "take": (lambda: R.take(f32(3, 4), i64(2), axis=1), {1}),
        "broadcast_to": (lambda: R.broadcast_to(f32(3, 1), (3, 4)), {1}),
        "clip": (lambda: R.clip(f32(3, 4), 0.0, 1.0), {1, 2}),
        "strided_slice": (lambda: R.strided_slice(f32(3, 4), [1], [1], [3]), {1, 2, 3}),
        "batch_norm": (lambda: R.nn.batch_norm(f32(2, 4, 3), f32(4), f32(4), f32(4), f32(4), axis=1), {3, 4}),
        "argmax": (lambda: R.argmax(f32(3, 4), axis=1), {0}),
        "int_where": (lambda: R.where(cond, i64(3, 4), i64(3, 4)), {0, 1, 2}),    # an integer result
    }[case]
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            c = bb.normalize(call())
            out = bb.emit(c)
            grad = bb.emit(relax.op.ones_like(out) if not isinstance(out.ty, relax.TupleType)
                           else relax.Tuple([relax.op.ones_like(relax.TupleGetItem(out, i))
                                             for i in range(len(out.ty.fields))]))
            grads = tvm.ir.Op.get(str(c.op.name)).get_attr("FPrimalGradient")(out, c, grad, bb)
            bb.emit_output(relax.const(0.0))
        bb.emit_func_output(relax.const(0.0))
    no_grad = tvm.ir.Op.get("relax.grad.no_grad")
    got = {i for i, g in enumerate(grads) if isinstance(g, relax.Call) and g.op.same_as(no_grad)}
    assert got == ignored
