"""Arrays of other frameworks by DLPack: torch tensors in, torch tensors out, without copies."""

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from tvmgrad import rt, runtime
from tvmgrad.planning import calls_planned

torch = pytest.importorskip("torch")


def _numpy(t):
    """A torch CPU tensor's values as the numpy array tvmgrad's numpy path takes."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def _pair(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen).to(dtype) if not dtype.is_complex
            else torch.randn(shape, dtype=dtype, generator=gen),
            torch.randn(shape, generator=gen).to(dtype) if not dtype.is_complex
            else torch.randn(shape, dtype=dtype, generator=gen))


@pytest.mark.parametrize("op,dtype", [
    ("tanh_grad", torch.float32), ("tanh_grad", torch.float64), ("tanh_grad", torch.bfloat16),
    ("tanh_grad", torch.complex64), ("relu_grad", torch.float32), ("relu_grad", torch.bfloat16)])
def test_torch_in_torch_out_with_the_numpy_values(op, dtype):
    out, g = _pair((3, 5), dtype)
    got = tvmgrad.run(op, {"out": out, "out_grad": g})["x_grad"]
    want = tvmgrad.run(op, {"out": _numpy(out), "out_grad": _numpy(g)})["x_grad"]
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.device.type == "cpu"
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(_numpy(got), want)


def test_inputs_are_seen_without_a_copy():
    x = torch.randn(4, 6)
    seen = rt.Foreign(x)
    assert seen.tensor().data_ptr() == x.data_ptr()
    assert seen.shape == (4, 6) and seen.dtype == np.float32 and seen.framework == "torch"
    assert np.shares_memory(np.asarray(seen), x.numpy())


def test_out_buffers_and_inplace_are_written_where_they_are():
    out, g = _pair((8, 3), torch.float32, seed=1)
    want = tvmgrad.run("tanh_grad", {"out": out, "out_grad": g})["x_grad"]
    launch = tvmgrad.prepare("tanh_grad", {"out": out, "out_grad": g})
    buf = torch.empty(8, 3)
    got = launch(out={"x_grad": buf})["x_grad"]
    assert got.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(buf, want, rtol=0, atol=0)
    # the YAML inplace pair (relu_grad: out_grad -> x_grad) writes into the caller's tensor
    g2 = g.clone()
    ptr = g2.data_ptr()
    want = tvmgrad.run("relu_grad", {"out": out, "out_grad": g})["x_grad"]
    got = tvmgrad.run("relu_grad", {"out": out, "out_grad": g2}, inplace=True)["x_grad"]
    assert got.data_ptr() == ptr and g2.data_ptr() == ptr
    torch.testing.assert_close(g2, want, rtol=0, atol=0)


@pytest.mark.parametrize("view", ["transposed", "sliced", "expanded"])
def test_non_contiguous_views(view):
    base_o, base_g = _pair((6, 8), torch.float32, seed=2)
    pick = {"transposed": lambda t: t.t(), "sliced": lambda t: t[1:5, ::3],
            "expanded": lambda t: t[:1].expand(6, 8)}[view]
    o, g = pick(base_o), pick(base_g)
    assert not o.is_contiguous()
    got = tvmgrad.run("tanh_grad", {"out": o, "out_grad": g})["x_grad"]
    want = tvmgrad.run("tanh_grad", {"out": _numpy(o), "out_grad": _numpy(g)})["x_grad"]
    assert isinstance(got, torch.Tensor) and got.is_contiguous()
    np.testing.assert_array_equal(got.numpy(), want)


class DLPackOnly:
    """An array that exposes nothing but the DLPack protocol (no shape, no dtype)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_a_bare_dlpack_producer_is_accepted():
    o = np.random.default_rng(3).standard_normal((4, 5)).astype("float32")
    g = np.random.default_rng(4).standard_normal((4, 5)).astype("float32")
    seen = rt.Foreign(DLPackOnly(o))
    assert seen.shape == (4, 5) and seen.dtype == np.float32 and seen.device == (rt.HOST, 0)
    got = tvmgrad.run("tanh_grad", {"out": DLPackOnly(o), "out_grad": DLPackOnly(g)})["x_grad"]
    want = tvmgrad.run("tanh_grad", {"out": o, "out_grad": g})["x_grad"]
    np.testing.assert_array_equal(np.asarray(got), want)


def test_tensors_that_require_grad_are_accepted():
    o, g = _pair((5, 7), torch.float32, seed=5)
    o.requires_grad_(True)
    got = tvmgrad.run("tanh_grad", {"out": o, "out_grad": g})["x_grad"]
    want = tvmgrad.run("tanh_grad", {"out": _numpy(o), "out_grad": _numpy(g)})["x_grad"]
    assert isinstance(got, torch.Tensor) and not got.requires_grad
    np.testing.assert_array_equal(got.numpy(), want)
    launch = tvmgrad.prepare("tanh_grad", {"out": o, "out_grad": g})
    np.testing.assert_array_equal(launch()["x_grad"].numpy(), want)


def test_a_launch_reuses_its_plan_on_new_tensors():
    o, g = _pair((16,), torch.float32, seed=6)
    launch = tvmgrad.prepare("tanh_grad", {"out": o, "out_grad": g})
    planned = calls_planned()
    for seed in range(3):
        o2, g2 = _pair((16,), torch.float32, seed=10 + seed)
        got = launch({"out": o2, "out_grad": g2})["x_grad"]
        want = tvmgrad.run("tanh_grad", {"out": o2.numpy(), "out_grad": g2.numpy()})["x_grad"]
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(got.numpy(), want)
    # the numpy calls planned once (their own signature), the launch never
    assert calls_planned() - planned <= 1
    planned = calls_planned()
    o3, g3 = _pair((16,), torch.float32, seed=20)
    launch({"out": o3, "out_grad": g3})
    launch.run({"out": g3, "out_grad": o3})
    assert calls_planned() == planned


def test_run_reuses_the_plan_of_a_torch_signature():
    o, g = _pair((9,), torch.float32, seed=7)
    tvmgrad.run("relu_grad", {"out": o, "out_grad": g})
    before = runtime.run_cache_info()
    planned = calls_planned()
    for _ in range(3):
        tvmgrad.run("relu_grad", {"out": torch.randn(9), "out_grad": torch.randn(9)})
    after = runtime.run_cache_info()
    assert after["hits"] - before["hits"] == 3 and calls_planned() == planned


def _error(op, inputs, attrs=None):
    with pytest.raises((ValueError, TypeError)) as info:
        tvmgrad.run(op, inputs, attrs)
    return info.type, str(info.value)


@pytest.mark.parametrize("case", ["shape", "mixed dtype", "unsupported dtype", "rank"])
def test_bad_torch_inputs_fail_as_numpy_ones_do(case):
    a = torch.randn(3, 5)
    op, inputs = {
        "shape": ("tanh_grad", {"out": a, "out_grad": torch.randn(3, 4)}),
        "mixed dtype": ("tanh_grad", {"out": a, "out_grad": a.double()}),
        "unsupported dtype": ("relu_grad", {"out": a.to(torch.complex64),
                                            "out_grad": a.to(torch.complex64)}),
        "rank": ("log_softmax_grad", {"out": a, "out_grad": a}),
    }[case]
    attrs = {"axis": 4} if op == "log_softmax_grad" else None
    kind, message = _error(op, inputs, attrs)
    np_kind, np_message = _error(op, {k: v.numpy() for k, v in inputs.items()}, attrs)
    assert (kind, message) == (np_kind, np_message)
    assert message.startswith(f"{op}: ") and any(f"'{k}'" in message or k in message
                                                  for k in list(inputs) + ["axis"])
