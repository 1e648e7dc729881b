"""Real model definitions (torch.nn, torchvision) through torch.export ->
from_exported_program -> relax.transform.Gradient -> tvm.compile on tvmgrad gradients: every
parameter gradient equals torch autograd's, no op with a tvmgrad kernel falls back to TVM's own
gradient, every kernel is scheduled, and a few SGD steps follow torch's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tvm = pytest.importorskip("tvm")
from tvm import relax, tirx  # noqa: E402

import tvmgrad.relax as tr  # noqa: E402
from tvmgrad.relax import models as M  # noqa: E402
from tvmgrad.relax import passes  # noqa: E402
from tvmgrad.relax.fallback import FALLBACKS  # noqa: E402
from tvmgrad.relax.rules import GRADIENTS  # noqa: E402
from tvmgrad.targets import resolve  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def gradients():
    return tr.register_gradients()


def _gradient(tm):
    exp = M.export(tm)
    FALLBACKS.clear()
    grad_mod = M.gradient(exp)
    ops = M.relax_ops(exp.mod)
    # the Gradient pass used a tvmgrad rule for every op that has one, without handing any
    # call to TVM's own gradient
    assert not FALLBACKS, FALLBACKS
    return exp, grad_mod, ops


def _check_scheduled(grad_mod):
    """The default pipeline's tvmgrad steps leave no kernel unscheduled that tvmgrad's rules can
    take: every tvmgrad kernel is scheduled, and the forward products are tvmgrad's."""
    tgt = resolve("llvm")
    with tgt.target:
        mod = grad_mod
        for step in passes._tvmgrad_steps(tgt, True):
            mod = step(mod)
    funcs = {str(gv.name_hint): f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    ours = {n: f for n, f in funcs.items() if f.attrs is not None and "tvmgrad.op" in f.attrs}
    assert ours and all("tirx.is_scheduled" in f.attrs for f in ours.values())
    theirs = [n for n in funcs if n not in ours]
    assert not [n for n in theirs if n.startswith(("matmul", "conv2d"))], theirs
    return {str(f.attrs["tvmgrad.op"]) for f in ours.values()}


def _vm(grad_mod):
    ex = tvm.compile(grad_mod, target=resolve("llvm").target)
    return relax.VirtualMachine(ex, tvm.cpu())


def _assert_grads(got, want, names, tol):
    for n, g, w in zip(names, got, want):
        scale = float(np.abs(w).max()) + 1e-30
        err = float(np.abs(g - w).max()) / scale
        assert err <= tol, f"{n}: max |tvm - torch| / max |torch| = {err:.2e} > {tol}"


def _sgd(tm, exp, vm, steps, lr):
    """``steps`` SGD steps in both frameworks from the same parameters; -> (tvm losses, torch
    losses)."""
    params = [p.copy() for p in exp.params]
    inputs = M.as_tensors(exp.inputs)
    ours = []
    for _ in range(steps):
        loss, grads = vm["main_adjoint"](*inputs, *M.as_tensors(params))
        ours.append(float(loss.numpy()))
        params = [p - lr * g.numpy() for p, g in zip(params, grads)]
    by_name = dict(tm.module.named_parameters())
    opt = torch.optim.SGD([by_name[n] for n in exp.param_names], lr=lr)
    theirs = []
    tm.module.train(tm.train)
    for _ in range(steps):
        opt.zero_grad()
        loss = tm.module(*tm.inputs)
        loss.backward()
        opt.step()
        theirs.append(float(loss.detach()))
    return ours, theirs


def _train_and_compare(name, batch, size, tol, steps=3, lr=0.05, train=True):
    if name == "resnet18":
        pytest.importorskip("torchvision")
    tm = M.torch_model(name, batch, size=size, train=train)
    exp, grad_mod, ops = _gradient(tm)
    used = _check_scheduled(grad_mod)
    vm = _vm(grad_mod)
    loss, grads = vm["main_adjoint"](*M.as_tensors(exp.inputs + exp.params))
    want_loss, want = M.torch_grads(tm, exp.param_names)
    np.testing.assert_allclose(float(loss.numpy()), want_loss, rtol=1e-5)
    _assert_grads([g.numpy() for g in grads], want, exp.param_names, tol)
    ours, theirs = _sgd(tm, exp, vm, steps, lr)
    assert ours[-1] < ours[0] and theirs[-1] < theirs[0]          # both learn
    np.testing.assert_allclose(ours, theirs, rtol=20 * tol, atol=20 * tol)
    return ops, used


def test_mlp_trains_like_torch():
    ops, used = _train_and_compare("mlp", 16, None, 1e-5)
    assert {"relax.matmul", "relax.nn.relu", "relax.nn.log_softmax", "relax.gather_elements"} <= set(ops)
    assert {"relu_grad", "log_softmax_grad", "take_along_axis_grad", "matmul"} <= used


def test_transformer_encoder_layer_trains_like_torch():
    """nn.TransformerEncoderLayer: its attention masks are boolean subgraphs (equal,
    logical_not, an int8 max) under relax.where; they get no_grad and are never walked into."""
    ops, used = _train_and_compare("transformer", 2, 8, 5e-5)
    assert {"relax.logical_not", "relax.where", "relax.nn.layer_norm", "relax.nn.softmax"} <= set(ops)
    assert {"matmul", "layer_norm_grad", "where_grad", "relu_grad"} <= used


@pytest.mark.slow     # (CI runs it after the default run; the mlp and transformer run by default)
def test_resnet18_trains_like_torch():
    """torchvision resnet18 in train mode (batch statistics): 2x3x64x64 (its last stage sees
    2x2 maps: batch statistics over 8 values per channel, tight enough for float32)."""
    ops, used = _train_and_compare("resnet18", 2, 64, 2e-4, steps=2, lr=0.01)
    assert {"relax.nn.batch_norm", "relax.nn.conv2d", "relax.nn.max_pool2d", "relax.mean"} <= set(ops)
    assert {"batch_norm_grad", "conv2d_filter_grad", "relu_grad"} <= used


@pytest.mark.slow     # (CI runs it after the default run)
def test_resnet18_eval_mode_gradients():
    """resnet18 in eval mode: batch_norm with the moving statistics as constants (no
    DecomposeOpsForTraining, which would silently use batch statistics)."""
    pytest.importorskip("torchvision")
    tm = M.torch_model("resnet18", 2, size=32, train=False)
    exp, grad_mod, ops = _gradient(tm)
    assert "relax.nn.batch_norm" in ops
    vm = _vm(grad_mod)
    loss, grads = vm["main_adjoint"](*M.as_tensors(exp.inputs + exp.params))
    want_loss, want = M.torch_grads(tm, exp.param_names)
    np.testing.assert_allclose(float(loss.numpy()), want_loss, rtol=1e-5)
    _assert_grads([g.numpy() for g in grads], want, exp.param_names, 2e-5)


def test_tvm_alone_cannot_differentiate_these_models():
    """What the registration fixes: TVM's own gradients stop at ops it has none for."""
    from tvmgrad.relax.tvm_own import tvm_differentiable
    own = tvm_differentiable()
    for name, batch, size in (("mlp", 4, None), ("transformer", 2, 8)):
        ops = M.relax_ops(M.export(M.torch_model(name, batch, size=size)).mod)
        missing = {op for op in ops if op not in own}
        assert missing and all(op in GRADIENTS or op in tr.NO_GRAD for op in missing), missing


@pytest.mark.slow
def test_bench_training_step_reports_both_frameworks():
    from tvmgrad.relax.bench import bench_training_step
    out = bench_training_step("mlp", batch=8, repeat=3, warmup=1, threads=1)
    assert {"tvm_ms", "torch_ms", "ratio", "tvm_median_ms", "torch_median_ms"} <= set(out)
    assert out["tvm_ms"] > 0 and out["torch_ms"] > 0 and out["max_rel_err"] < 1e-4
    assert out["ratio"] == pytest.approx(out["tvm_ms"] / out["torch_ms"])
