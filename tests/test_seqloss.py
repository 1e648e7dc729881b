"""Sequence-loss grads (te_defs/seqloss.py): warpctc_grad and warprnnt_grad.

Oracle: Paddle 3.3.1's ``_C_ops.warpctc_grad`` / ``_C_ops.warprnnt_grad`` (both run on CPU), and
end to end ``paddle.grad`` through ``F.ctc_loss`` / ``F.rnnt_loss``: the backward is linear in
loss_grad, so the forward's ``warpctcgrad`` is the logits gradient for a loss cotangent of ones.
``_C_ops.warpctc`` returns only the loss (the warpctcgrad output is not exposed).

Paddle differences: without ``logits_length`` Paddle's warpctc_grad takes its LoD path, which
segfaults in 3.3.1 (no LoD in dynamic mode): those cases are checked against numpy. Paddle needs
loss_grad as [B, 1]; [B] is accepted here too. Half types: Paddle's CPU build registers
float32/float64 only; ``check`` runs Paddle in float32 on the rounded inputs.
"""

import numpy as np
import pytest

import tvmgrad
from harness import assert_close, cast, check

HALF = ("float16", "bfloat16")
DTYPES = ("float32", "float64") + HALF


def _rng(seed=0):
    return np.random.default_rng(seed)


def _ctc_inputs(rng, T=7, B=3, C=5, lengths=(7, 4, 5)):
    return {"logits": rng.standard_normal((T, B, C)),
            "logits_length": np.array(lengths, np.int64),
            "warpctcgrad": rng.standard_normal((T, B, C)),
            "loss_grad": rng.standard_normal((B, 1))}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
def test_warpctc_grad_vs_paddle(dtype, norm):
    check("warpctc_grad", _ctc_inputs(_rng()), {"norm_by_times": norm, "blank": 2}, dtype)


def test_warpctc_grad_shapes():
    for T, B, C, lens in ((1, 1, 1, (1,)), (9, 1, 3, (2,)), (4, 5, 2, (4, 1, 3, 2, 4))):
        check("warpctc_grad", _ctc_inputs(_rng(T), T, B, C, lens), {"norm_by_times": True})


def test_warpctc_grad_empty():
    inp = _ctc_inputs(_rng(), T=0, B=2, C=3, lengths=(0, 0))
    out = tvmgrad.run("warpctc_grad", inp, {"norm_by_times": True})["logits_grad"]
    assert out.shape == (0, 2, 3) and out.dtype == np.float64


def test_warpctc_grad_zero_length():
    """Paddle multiplies by 1/length: a zero length gives ±inf/NaN, as here."""
    inp = _ctc_inputs(_rng(1), lengths=(7, 0, 5))
    inp["warpctcgrad"][0, 1, 0] = 0.0
    out = check("warpctc_grad", inp, {"norm_by_times": True}, "float64")["logits_grad"]
    assert np.isnan(out[0, 1, 0]) and np.isinf(out[1, 1]).all()


def test_warpctc_grad_loss_grad_1d():
    inp = _ctc_inputs(_rng(2))
    want = tvmgrad.run("warpctc_grad", inp, {"norm_by_times": True})["logits_grad"]
    inp["loss_grad"] = inp["loss_grad"][:, 0]
    got = tvmgrad.run("warpctc_grad", inp, {"norm_by_times": True})["logits_grad"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("norm", [False, True])
def test_warpctc_grad_without_length(dtype, norm):
    """Paddle's LoD path (no logits_length) segfaults in 3.3.1: numpy reference. 3-D logits:
    every sequence spans all time steps; 2-D logits [T, C]: one sequence, first T steps."""
    rng = _rng(3)
    inp = _ctc_inputs(rng, T=6, B=2, C=4)
    del inp["logits_length"]
    x = {k: cast(v, dtype) for k, v in inp.items()}
    got = tvmgrad.run("warpctc_grad", x, {"norm_by_times": norm})["logits_grad"]
    wg, lg = (np.asarray(x[k], np.float64) for k in ("warpctcgrad", "loss_grad"))
    want = wg * lg[None] / (6.0 if norm else 1.0)
    assert_close("logits_grad", got, cast(want, dtype), dtype)

    one = {"logits": rng.standard_normal((4, 3)), "warpctcgrad": rng.standard_normal((6, 1, 3)),
           "loss_grad": rng.standard_normal((1, 1))}
    x = {k: cast(v, dtype) for k, v in one.items()}
    got = tvmgrad.run("warpctc_grad", x, {"norm_by_times": norm})["logits_grad"]
    want = np.asarray(x["warpctcgrad"], np.float64)[:4, 0] * float(np.asarray(x["loss_grad"],
                                                                            np.float64)[0, 0])
    want = want / (4.0 if norm else 1.0)
    assert got.shape == (4, 3)
    assert_close("logits_grad", got, cast(want, dtype), dtype)


def test_warpctc_grad_end_to_end_ctc_loss():
    """logits_grad of F.ctc_loss(reduction='none') with a random loss cotangent equals
    warpctc_grad(warpctcgrad = the gradient for a cotangent of ones, loss_grad)."""
    import paddle
    import paddle.nn.functional as F

    rng = _rng(4)
    T, B, C = 8, 3, 6
    logits = rng.standard_normal((T, B, C)).astype(np.float64)
    labels = np.array([[1, 2, 2], [3, 0, 0], [5, 4, 1]], np.int32)
    il, ll = np.array([8, 5, 7], np.int64), np.array([3, 1, 3], np.int64)
    lg = rng.standard_normal((B,))

    def grad(cot):
        x = paddle.to_tensor(logits, stop_gradient=False)
        loss = F.ctc_loss(x, paddle.to_tensor(labels), paddle.to_tensor(il), paddle.to_tensor(ll),
                          blank=0, reduction="none")
        return paddle.grad(loss, x, paddle.to_tensor(cot.reshape(loss.shape)))[0].numpy()

    wg = grad(np.ones(B))
    got = tvmgrad.run("warpctc_grad", {"logits": logits, "logits_length": il, "warpctcgrad": wg,
                                       "loss_grad": lg[:, None]})["logits_grad"]
    np.testing.assert_allclose(got, grad(lg), rtol=1e-10, atol=1e-12)


def test_warpctc_grad_bad_input():
    inp = _ctc_inputs(_rng())
    with pytest.raises(ValueError, match="warpctc_grad.*loss_grad"):
        tvmgrad.run("warpctc_grad", {**inp, "loss_grad": np.ones((2, 1))})
    with pytest.raises(ValueError, match="warpctc_grad.*logits_length"):
        tvmgrad.run("warpctc_grad", {**inp, "logits_length": np.ones(2, np.int64)})
    with pytest.raises(ValueError, match="warpctc_grad.*logits"):
        tvmgrad.run("warpctc_grad", {**inp, "logits": np.ones((7, 3, 4))})
    with pytest.raises(ValueError, match="warpctc_grad.*warpctcgrad"):
        tvmgrad.run("warpctc_grad", {**inp, "warpctcgrad": np.ones((7, 15))})
    no_len = {k: v for k, v in inp.items() if k != "logits_length"}
    with pytest.raises(ValueError, match="warpctc_grad.*logits_length"):
        tvmgrad.run("warpctc_grad", {**no_len, "logits": np.ones((7, 5))})
    with pytest.raises((ValueError, TypeError), match="warpctc_grad.*logits_length"):
        tvmgrad.run("warpctc_grad", {**inp, "logits_length": np.ones(3, np.float64)})


# ------------------------------------------------------------------------------------------
# warprnnt

def _rnnt_inputs(rng, B=2, T=4, U=3, C=5):
    return {"input": rng.standard_normal((B, T, U, C)),
            "input_lengths": rng.integers(1, T + 1, (B,)).astype(np.int32),
            "warprnntgrad": rng.standard_normal((B, T, U, C)),
            "loss_grad": rng.standard_normal((B,))}


@pytest.mark.parametrize("dtype", DTYPES)
def test_warprnnt_grad_vs_paddle(dtype):
    check("warprnnt_grad", _rnnt_inputs(_rng()), {"blank": 1, "fastemit_lambda": 0.25}, dtype)


def test_warprnnt_grad_shapes():
    for shape in ((1, 1, 1, 1), (3, 2, 1, 4), (1, 5, 4, 2)):
        check("warprnnt_grad", _rnnt_inputs(_rng(1), *shape), {}, "float64")
    out = tvmgrad.run("warprnnt_grad", _rnnt_inputs(_rng(), 0, 3, 2, 4))["input_grad"]
    assert out.shape == (0, 3, 2, 4)


@pytest.mark.parametrize("fastemit", [0.0, 0.1])
def test_warprnnt_grad_end_to_end_rnnt_loss(fastemit):
    """input grad of F.rnnt_loss(reduction='none') with a random cotangent equals
    warprnnt_grad(warprnntgrad = the gradient for a cotangent of ones, loss_grad): fastemit_lambda
    enters only the forward's warprnntgrad."""
    import paddle
    import paddle.nn.functional as F

    rng = _rng(5)
    B, T, U, C = 2, 5, 3, 4
    acts = rng.standard_normal((B, T, U + 1, C))
    labels = rng.integers(1, C, (B, U)).astype(np.int32)
    il, ll = np.array([5, 4], np.int32), np.array([3, 2], np.int32)
    lg = rng.standard_normal((B,))

    def grad(cot):
        x = paddle.to_tensor(acts, stop_gradient=False)
        loss = F.rnnt_loss(x, paddle.to_tensor(labels), paddle.to_tensor(il), paddle.to_tensor(ll),
                           blank=0, fastemit_lambda=fastemit, reduction="none")
        return paddle.grad(loss, x, paddle.to_tensor(cot.reshape(loss.shape)))[0].numpy()

    wg = grad(np.ones(B))
    got = tvmgrad.run("warprnnt_grad", {"input": acts, "input_lengths": il, "warprnntgrad": wg,
                                        "loss_grad": lg}, {"fastemit_lambda": fastemit})
    np.testing.assert_allclose(got["input_grad"], grad(lg), rtol=1e-9, atol=1e-12)


def test_warprnnt_grad_bad_input():
    inp = _rnnt_inputs(_rng())
    with pytest.raises(ValueError, match="warprnnt_grad.*loss_grad"):
        tvmgrad.run("warprnnt_grad", {**inp, "loss_grad": np.ones((2, 1))})
    with pytest.raises(ValueError, match="warprnnt_grad.*input_lengths"):
        tvmgrad.run("warprnnt_grad", {**inp, "input_lengths": np.ones(3, np.int32)})
    with pytest.raises(ValueError, match="warprnnt_grad.*'input'"):
        tvmgrad.run("warprnnt_grad", {**inp, "input": np.ones((2, 4, 3, 6))})
    with pytest.raises(ValueError, match="warprnnt_grad.*warprnntgrad"):
        tvmgrad.run("warprnnt_grad", {**inp, "warprnntgrad": np.ones((2, 4, 15)),
                                      "input": np.ones((2, 4, 15))})
    with pytest.raises((ValueError, TypeError), match="warprnnt_grad"):
        tvmgrad.run("warprnnt_grad", {k: v for k, v in inp.items() if k != "loss_grad"})
