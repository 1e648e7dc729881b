"""PyTorch references for pointwise grads (aten backward ops, or autograd on the forward)."""

from . import aten


def _tanh_double(t, a):
    import torch
    out, go = t["out"].requires_grad_(), t["grad_out"].requires_grad_()
    return lambda: torch.autograd.grad(aten().tanh_backward(go, out), [out, go], t["grad_x_grad"])


def _atan2(t, a):
    import torch
    x, y = t["x"].requires_grad_(), t["y"].requires_grad_()
    return lambda: torch.autograd.grad(torch.atan2(x, y), [x, y], t["out_grad"])


TORCH = {
    "relu_grad": lambda t, a: (lambda: aten().threshold_backward(t["out_grad"], t["out"], 0.0)),
    "sigmoid_grad": lambda t, a: (lambda: aten().sigmoid_backward(t["out_grad"], t["out"])),
    "tanh_grad": lambda t, a: (lambda: aten().tanh_backward(t["out_grad"], t["out"])),
    "silu_grad": lambda t, a: (lambda: aten().silu_backward(t["out_grad"], t["x"])),
    "gelu_grad": lambda t, a: (lambda: aten().gelu_backward(
        t["out_grad"], t["x"], approximate="tanh" if a.get("approximate") else "none")),
    "tanh_double_grad": _tanh_double,
    "atan2_grad": _atan2,
}


def _paddle_tanh_double(t, a):
    import paddle
    out, go = t["out"], t["grad_out"]
    out.stop_gradient = go.stop_gradient = False

    def run():
        grad = paddle._C_ops.tanh_grad(out, go)
        return paddle.grad(grad, [out, go], t["grad_x_grad"])
    return run


PADDLE = {"tanh_double_grad": _paddle_tanh_double}
