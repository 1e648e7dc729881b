"""cudnn_lstm_grad (te_defs/rnn.py) against Paddle 3.3.1's CPU ``rnn`` op (mode "LSTM", the same
weight_list layout as cuDNN's: all W_ih/W_hh per layer and direction, then all b_ih/b_hh) and
``paddle.grad`` through it. Paddle's CPU build has no cudnn_lstm kernel; the grad's ``reserve`` /
``state_out`` (cuDNN-opaque) and ``out`` are not read by tvmgrad (the forward is recomputed), so
the tests pass placeholders. Half types: Paddle's CPU rnn registers float32/float64; the oracle
runs in float32 on the rounded inputs (the half kernels compute in float32 too).

Paddle bug: with ``sequence_length`` shorter than the padded length, Paddle 3.3.1's CPU rnn grad
gets W_hh's gradient of the *reverse* direction wrong (its forward is right: the reverse pass
starts at step len − 1 from init_h, but the grad pairs that step's gate grads with a different
previous hidden state; finite differences of Paddle's own forward agree with tvmgrad, not with
paddle.grad). For those weights the oracle is central differences of Paddle's float64 forward.
"""

import numpy as np
import pytest

import tvmgrad
from harness import assert_close, cast
from tvmgrad.examples.attention import lstm_weights

OP = "cudnn_lstm_grad"


def _rng(seed=0):
    return np.random.default_rng(seed)


def _case(seed=0, T=5, B=3, I=4, H=6, L=1, bidirec=False, lengths=None):
    rng = _rng(seed)
    D = 2 if bidirec else 1
    inputs = {"x": rng.standard_normal((T, B, I)),
              "init_h": 0.5 * rng.standard_normal((L * D, B, H)),
              "init_c": 0.5 * rng.standard_normal((L * D, B, H)),
              "weight_list": lstm_weights(rng, I, H, L, bidirec, scale=0.5),
              "out": np.zeros((T, B, D * H)), "reserve": np.zeros(1, np.uint8),
              "state_out": np.zeros(1, np.uint8),
              "out_grad": rng.standard_normal((T, B, D * H)),
              "last_h_grad": rng.standard_normal((L * D, B, H)),
              "last_c_grad": rng.standard_normal((L * D, B, H))}
    if lengths is not None:
        inputs["sequence_length"] = np.array(lengths, np.int32)
    return inputs, {"is_bidirec": bidirec, "hidden_size": H, "num_layers": L}


def paddle_lstm_grads(inputs, attrs, dtype="float64"):
    """(out, x_grad, init_h_grad, init_c_grad, weight_list_grad) by Paddle's CPU rnn op."""
    import paddle

    pdt = "float32" if dtype in ("float16", "bfloat16") else dtype

    def leaf(a):
        return paddle.to_tensor(np.asarray(a, np.float64).astype(pdt), stop_gradient=False)

    x, h0, c0 = leaf(inputs["x"]), leaf(inputs["init_h"]), leaf(inputs["init_c"])
    ws = [leaf(w) for w in inputs["weight_list"]]
    sl = inputs.get("sequence_length")
    sl = None if sl is None else paddle.to_tensor(np.asarray(sl, np.int32))
    out, _, (lh, lc) = paddle._C_ops.rnn(
        x, [h0, c0], ws, sl, paddle.zeros([0], dtype="uint8"), 0.0, attrs["is_bidirec"],
        inputs["x"].shape[2], attrs["hidden_size"], attrs["num_layers"], "LSTM", 0, False)
    cot = [paddle.to_tensor(np.asarray(inputs[k], np.float64).astype(pdt))
           for k in ("out_grad", "last_h_grad", "last_c_grad")]
    grads = paddle.grad([out, lh, lc], [x, h0, c0] + ws, cot, allow_unused=True)
    grads = [np.zeros(t.shape, pdt) if g is None else g.numpy() for g, t in zip(grads, [x, h0, c0] + ws)]
    dw = grads[3:]
    if attrs["is_bidirec"] and sl is not None and (np.asarray(inputs["sequence_length"])
                                                   < inputs["x"].shape[0]).any():
        for layer in range(attrs["num_layers"]):
            k = 2 * (layer * 2 + 1) + 1                 # W_hh of the reverse direction
            dw[k] = _fd_weight(inputs, attrs, k).astype(pdt)
    return out.numpy(), grads[0], grads[1], grads[2], dw


def _fd_weight(inputs, attrs, k, eps=1e-6):
    """d(loss)/d weight_list[k] by central differences of Paddle's float64 forward, loss =
    <out, out_grad> + <last_h, last_h_grad> + <last_c, last_c_grad>."""
    import paddle

    f64 = {n: np.asarray(inputs[n], np.float64) for n in ("x", "init_h", "init_c", "out_grad",
                                                           "last_h_grad", "last_c_grad")}
    ws = [np.asarray(w, np.float64) for w in inputs["weight_list"]]
    sl = paddle.to_tensor(np.asarray(inputs["sequence_length"], np.int32))
    P = paddle.to_tensor

    def loss(w_k):
        wl = [P(w) for w in ws[:k]] + [P(w_k)] + [P(w) for w in ws[k + 1:]]
        out, _, (lh, lc) = paddle._C_ops.rnn(
            P(f64["x"]), [P(f64["init_h"]), P(f64["init_c"])], wl, sl,
            paddle.zeros([0], dtype="uint8"), 0.0, True, f64["x"].shape[2], attrs["hidden_size"],
            attrs["num_layers"], "LSTM", 0, True)
        return float((out.numpy() * f64["out_grad"]).sum() + (lh.numpy() * f64["last_h_grad"]).sum()
                     + (lc.numpy() * f64["last_c_grad"]).sum())

    grad = np.zeros_like(ws[k])
    for idx in np.ndindex(grad.shape):
        wp, wm = ws[k].copy(), ws[k].copy()
        wp[idx] += eps
        wm[idx] -= eps
        grad[idx] = (loss(wp) - loss(wm)) / (2 * eps)
    return grad


TOLS = {"float64": (1e-7, 1e-8), "float32": (2e-4, 2e-5), "float16": (2e-2, 2e-2),
        "bfloat16": (8e-2, 8e-2)}


def _compare(inputs, attrs, dtype):
    x = {k: cast(v, dtype) for k, v in inputs.items()}
    got = tvmgrad.run(OP, x, attrs)
    _, dx, dh, dc, dw = paddle_lstm_grads({k: cast(v, "float64") for k, v in x.items()}, attrs,
                                          dtype)
    rtol, atol = TOLS[dtype]
    for name, want in (("x_grad", dx), ("init_h_grad", dh), ("init_c_grad", dc),
                       ("weight_list_grad", dw)):
        assert_close(name, got[name], cast(want, dtype) if dtype != "float32" else want, dtype,
                     rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("L,bidirec", [(1, False), (1, True), (2, False), (2, True)])
@pytest.mark.sweep
def test_cudnn_lstm_grad(dtype, L, bidirec):
    _compare(*_case(L=L, bidirec=bidirec), dtype)


@pytest.mark.sweep
@pytest.mark.parametrize("L,bidirec", [(1, False), (2, True)])
def test_cudnn_lstm_grad_sequence_length(L, bidirec):
    _compare(*_case(1, T=6, B=4, L=L, bidirec=bidirec, lengths=[6, 3, 1, 5]), "float64")


def test_cudnn_lstm_grad_zero_length():
    """A zero-length sequence: its outputs are padding, every state passes through."""
    inputs, attrs = _case(2, T=4, B=3, L=2, bidirec=True, lengths=[4, 0, 2])
    got = _compare(inputs, attrs, "float64")
    np.testing.assert_allclose(got["init_h_grad"][:, 1], inputs["last_h_grad"][:, 1], rtol=1e-12)
    np.testing.assert_array_equal(got["x_grad"][:, 1], 0)


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cudnn_lstm_grad_half(dtype):
    _compare(*_case(3, L=2, bidirec=True, lengths=[5, 2, 4]), dtype)


def test_cudnn_lstm_grad_shapes():
    for seed, kw in enumerate([dict(T=1, B=1, I=1, H=1), dict(T=7, B=2, I=9, H=3, L=3),
                               dict(T=3, B=5, I=2, H=8, bidirec=True)]):
        _compare(*_case(10 + seed, **kw), "float64")


def test_cudnn_lstm_grad_empty_sequence():
    inputs, attrs = _case(4, T=0, B=2, L=1, bidirec=True)
    got = tvmgrad.run(OP, inputs, attrs)
    assert got["x_grad"].shape == (0, 2, 4)
    np.testing.assert_array_equal(got["init_h_grad"], inputs["last_h_grad"])
    np.testing.assert_array_equal(got["init_c_grad"], inputs["last_c_grad"])
    assert all((w == 0).all() for w in got["weight_list_grad"])


def test_cudnn_lstm_grad_empty_batch_is_a_value_error():
    """cuDNN rejects an empty batch; here it is a ValueError before any build (the kernel's
    batch-fused loops divided by it: SIGFPE)."""
    inputs, attrs = _case(4, T=3, B=2, L=1, bidirec=True)
    empty = {k: (v[:, :0] if isinstance(v, np.ndarray) and v.ndim == 3 else v)
             for k, v in inputs.items()}
    with pytest.raises(ValueError, match=f"{OP}: input 'x' has batch size 0"):
        tvmgrad.prepare(OP, empty, attrs)


def test_cudnn_lstm_grad_bad_input():
    inputs, attrs = _case(5, L=2, bidirec=True)

    def run(attrs=attrs, **kw):
        return tvmgrad.run(OP, {**inputs, **kw}, attrs)

    with pytest.raises(ValueError, match=f"{OP}.*'init_h'"):
        run(init_h=inputs["init_h"][:2])
    with pytest.raises(ValueError, match=f"{OP}.*'out_grad'"):
        run(out_grad=inputs["out_grad"][..., :6])
    with pytest.raises(ValueError, match=rf"{OP}.*'weight_list' must hold 4 \* num_layers \* directions = 16"):
        run(weight_list=inputs["weight_list"][:-1])
    bad = list(inputs["weight_list"])
    bad[2] = bad[2][:, :3]
    with pytest.raises(ValueError, match=rf"{OP}.*'weight_list\[2\]' \(layer 0, direction 1\)"):
        run(weight_list=bad)
    with pytest.raises(ValueError, match=f"{OP}.*'sequence_length' must hold lengths in"):
        run(sequence_length=np.array([5, 6, 1], np.int32))
    with pytest.raises(ValueError, match=f"{OP}.*'sequence_length' must be"):
        run(sequence_length=np.array([5, 1], np.int32))
    with pytest.raises(ValueError, match=f"{OP}.*'hidden_size'"):
        run(attrs={**attrs, "hidden_size": 0})
    with pytest.raises(ValueError, match=f"{OP}.*'dropout_prob'.*cannot be recomputed"):
        run(attrs={**attrs, "dropout_prob": 0.3})
    with pytest.raises(ValueError, match=f"{OP}.*'weight_list' is required"):
        tvmgrad.run(OP, {k: v for k, v in inputs.items() if k != "weight_list"}, attrs)
    with pytest.raises((ValueError, TypeError), match=f"{OP}.*x must be 3-D"):
        run(x=inputs["x"][0])


def test_cudnn_lstm_grad_dropout_inference():
    """dropout_prob with is_test (or one layer) has no mask: the grads are dropout-free."""
    inputs, attrs = _case(6, L=2)
    want = tvmgrad.run(OP, inputs, attrs)
    got = tvmgrad.run(OP, inputs, {**attrs, "dropout_prob": 0.5, "is_test": True})
    for k in ("x_grad", "init_h_grad"):
        np.testing.assert_array_equal(got[k], want[k])
