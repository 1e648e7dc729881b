"""On a machine with a CUDA device (``pytest -m gpu``, not in the default run): every implemented
op's sample call, in every float dtype, gives on the GPU what the same PrimFunc gives on LLVM, and
deterministic scatter-type grads are bit-identical across runs.

``TVMGRAD_GPU_TARGET`` picks the target (default ``cuda``); ``llvm`` checks this file's own logic
on a machine without a GPU.
"""

import os

import numpy as np
import pytest

import tvmgrad
from samples import implemented_ops, sample
from tvmgrad import registry
from tvmgrad.examples import cast, each_tensor, float_dtypes
from tvmgrad.rt import cuda_available

TARGET = os.environ.get("TVMGRAD_GPU_TARGET", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(TARGET.startswith("cuda") and not cuda_available(),
                                 reason="no CUDA device")]

TOL = {"float64": 1e-9, "float32": 2e-4, "float16": 2e-2, "bfloat16": 5e-2}


@pytest.mark.parametrize("op", implemented_ops())
def test_device_matches_llvm(op):
    inputs, attrs = sample(op)
    for dtype in float_dtypes(op):
        data = {k: cast(v, dtype) for k, v in inputs.items()}
        want = tvmgrad.run(op, data, attrs)
        got = tvmgrad.run(op, data, attrs, target=TARGET)
        assert got.keys() == want.keys()
        for name in want:
            for w, g in each_tensor(want[name], got[name]):
                if w is None:
                    assert g is None
                    continue
                kind = np.complex128 if np.iscomplexobj(w) else np.float64
                g, w = np.asarray(g).astype(kind), np.asarray(w).astype(kind)
                np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype],
                                           err_msg=f"{op}.{name} [{dtype}] on {TARGET}")


@pytest.mark.parametrize("op", ["gather_grad", "index_select_grad", "scatter_grad", "send_u_recv_grad",
                                "put_along_axis_grad", "index_add_grad"])
def test_deterministic_scatters_are_bit_identical(op):
    if not registry.get(op).available:
        pytest.fail(f"{op} is not implemented")
    inputs, attrs = sample(op)
    data = {k: cast(v, "float32") for k, v in inputs.items()}
    first = tvmgrad.run(op, data, attrs, target=TARGET)
    for _ in range(3):
        again = tvmgrad.run(op, data, attrs, target=TARGET)
        for name, value in first.items():
            if value is not None and not isinstance(value, list):
                assert np.array_equal(np.asarray(value).view(np.uint8), np.asarray(again[name]).view(np.uint8))


@pytest.mark.parametrize("op", ["gelu_grad", "layer_norm_grad", "gather_grad", "concat_grad"])
def test_device_resident_torch_tensors_stay_on_the_device(op):
    """torch tensors on the GPU in, torch tensors on the same GPU out (no host round trip), with
    the host call's values; a reused launch takes new device tensors of the same signature.
    (With TVMGRAD_GPU_TARGET=llvm: host tensors, this test's own logic.)"""
    torch = pytest.importorskip("torch")
    device = "cuda" if TARGET.startswith("cuda") else "cpu"
    inputs, attrs = sample(op)
    data = {k: cast(v, "float32") for k, v in inputs.items()}
    want = tvmgrad.run(op, data, attrs)

    def on_device(v):
        if isinstance(v, list):
            return [on_device(x) for x in v]
        return None if v is None else torch.from_numpy(np.ascontiguousarray(v)).to(device)
    tensors = {k: on_device(v) for k, v in data.items()}
    got = tvmgrad.run(op, tensors, attrs, target=TARGET)
    launch = tvmgrad.prepare(op, tensors, attrs, target=TARGET)
    again = launch({k: on_device(v) for k, v in data.items()})
    for result in (got, again):
        for name in want:
            for w, g in each_tensor(want[name], result[name]):
                if w is None:
                    assert g is None
                    continue
                assert isinstance(g, torch.Tensor) and g.device.type == device, (name, type(g))
                np.testing.assert_allclose(g.cpu().numpy(), w, rtol=TOL["float32"],
                                           atol=TOL["float32"], err_msg=f"{op}.{name} on {TARGET}")
