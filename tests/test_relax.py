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
    assert rows["relax.nn.relu"] == ("relu_grad", True)            # ours shadows TVM's
    assert len([r for r in rows.values() if r[0]]) == len(gradients) >= 30


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
    assert {"gelu_grad", "tanh_grad", "log_softmax_grad"} <= _tvmgrad_kernels(grad_mod)
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
    assert {"conv2d_grad", "relu_grad", "layer_norm_grad", "log_softmax_grad"} <= _tvmgrad_kernels(grad_mod)
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
