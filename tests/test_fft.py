"""FFT grads (te_defs/fft.py) against Paddle 3.3.1 and numpy.

The transforms are real FFTs (four-step/Stockham for powers of two, Bluestein otherwise); the tests
cover both paths, every normalization and direction, several axes (negative ones too), onesided
and two-sided r2c, odd and even c2r lengths, n = 1, and check the adjoint identity against numpy's
forward transforms in float64.
"""

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from adjoint import inner
from harness import c_ops, in_child_process, rng

RTOL = {"complex64": 3e-5, "complex128": 1e-11, "float32": 3e-5, "float64": 1e-11}
NORMS = ("backward", "forward", "ortho")


def close(name, got, want, rtol=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    rtol = RTOL[want.dtype.name] if rtol is None else rtol
    g = np.stack([got.real, got.imag]) if np.iscomplexobj(got) else got
    w = np.stack([want.real, want.imag]) if np.iscomplexobj(want) else want
    scale = np.abs(w).max() if w.size else 1.0
    np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=rtol * scale,
                               err_msg=name)


def crand(shape, dtype="complex128", seed=0):
    r = rng(seed)
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)


def check(op, inputs, attrs, rtol=None):
    """tvmgrad vs Paddle's kernel. Paddle's kernels take the axes as given (its Python API
    normalizes them first): negative axes corrupt memory there, so the oracle gets them
    normalized."""
    ours = tvmgrad.run(op, inputs, attrs)["x_grad"]
    rank = np.asarray(inputs["out_grad"]).ndim
    want = c_ops(op, inputs, {**attrs, "axes": [a % rank for a in attrs["axes"]]})["x_grad"]
    close(f"{op} {attrs}", ours, want, rtol)
    return ours


# ------------------------------------------------------------------------------------------
# c2c

@pytest.mark.parametrize("shape,axes", [((16,), [0]), ((3, 8), [1]), ((4, 6), [0, 1]), ((5, 4, 3), [0, 2]),
                                        ((2, 7), [-1]), ((1,), [0]), ((3, 1, 4), [1, 2])])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("forward", [True, False])
def test_c2c(shape, axes, norm, forward):
    check("fft_c2c_grad", {"out_grad": crand(shape)}, {"axes": axes, "normalization": norm, "forward": forward})


@pytest.mark.parametrize("shape,axes", [((4, 32), [1]), ((6, 10), [0, 1])])
def test_c2c_complex64(shape, axes):
    check("fft_c2c_grad", {"out_grad": crand(shape, "complex64")},
          {"axes": axes, "normalization": "ortho", "forward": True})


@pytest.mark.parametrize("n", [2 ** 14, 3 * 5 * 7 * 11])
def test_c2c_long_is_accurate(n):
    """A long power-of-two line and a long Bluestein line agree with numpy to float64 precision."""
    g = crand((n,), seed=1)
    ours = tvmgrad.run("fft_c2c_grad", {"out_grad": g}, {"axes": [0], "normalization": "backward", "forward": True})
    close("c2c", ours["x_grad"], np.fft.ifft(g) * n, rtol=1e-12)


@pytest.mark.parametrize("shape,axis", [((2, 512), 1), ((256, 3), 0), ((3, 128, 5), 1), ((2, 5, 3), 1),
                                        ((2048,), 0), ((128, 16), 0), ((2, 64, 24), 1)])
@pytest.mark.parametrize("dtype", ["complex128", "complex64"])
def test_c2c_lines_in_many_units(shape, axis, dtype):
    """The CPU four-step form splits a line's work over several units of neighbouring lines
    (16 for complex64, 8 for complex128: a 128-byte row; ragged at the end), with strided
    (inner > 1) and Bluestein-padded lines too, as numpy (float64) does it; the odd and even
    log2 sizes take the radix-2 stage or not. The twiddles between the steps take each of their
    three forms: lanes of neighbouring lines (inner 1), lanes of one line (inner 16; 24 too with
    complex128's 8 lanes), mixed (inner 3, 5; 24 with complex64's 16)."""
    g = crand(shape, dtype, seed=2)
    ours = tvmgrad.run("fft_c2c_grad", {"out_grad": g}, {"axes": [axis], "normalization": "ortho", "forward": False})
    want = np.fft.fft(g.astype(np.complex128), axis=axis, norm="ortho").astype(dtype)
    close("c2c", ours["x_grad"], want, rtol=1e-12 if dtype == "complex128" else None)


@pytest.mark.parametrize("cpu,dtype,step", [("x86-64-v3", "complex64", 8), ("x86-64-v3", "complex128", 4),
                                            ("x86-64-v4", "complex64", 16), ("x86-64-v4", "complex128", 8)])
def test_c2c_butterflies_one_vector_register_wide(cpu, dtype, step):
    """The four-step's radix-4 butterflies take a unit's lanes one vector register of the target
    at a time (te_defs/fft.butterfly_vectors: AVX2's 256 bits, AVX-512's 512; a unit's row is
    128 bytes, 16 complex64 or 8 complex128 lanes, so AVX2 takes it in two), in both passes (a
    load and a compute loop each); the transform is numpy's on every target this host runs."""
    import re

    from harness import scheduled

    g = crand((2, 1024), dtype, seed=3)
    attrs = {"axes": [1], "normalization": "backward", "forward": True}
    planned, text = scheduled("fft_c2c_grad", {"out_grad": g}, attrs, cpu=cpu)
    widths = re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", text)
    lanes = 128 // np.dtype(dtype).itemsize                 # a unit's lines
    narrow = [int(w) for w in widths if int(w) < lanes]
    assert narrow == ([step] * 4 if step < lanes else []), text
    if not planned.target.missing_on_host:
        ours = tvmgrad.run("fft_c2c_grad", {"out_grad": g}, attrs, target=f"llvm:{cpu}")
        close("c2c", ours["x_grad"], np.fft.ifft(g.astype(np.complex128), axis=1).astype(dtype) * 1024,
              rtol=1e-12 if dtype == "complex128" else None)


# ------------------------------------------------------------------------------------------
# r2c

@pytest.mark.parametrize("shape,axes", [((8,), [0]), ((3, 8), [1]), ((4, 6), [0, 1]), ((5, 7), [0, 1]),
                                        ((3, 5), [0]), ((2, 3, 4), [-3, -1])])
@pytest.mark.parametrize("onesided", [True, False])
@pytest.mark.parametrize("norm", NORMS)
def test_r2c(shape, axes, onesided, norm):
    x = rng(2).standard_normal(shape)
    gshape = list(shape)
    if onesided:
        gshape[axes[-1]] = shape[axes[-1]] // 2 + 1
    attrs = {"axes": axes, "normalization": norm, "forward": norm != "forward", "onesided": onesided}
    check("fft_r2c_grad", {"x": x, "out_grad": crand(gshape, seed=3)}, attrs)


def test_r2c_float32_and_meta_x():
    """x is no_need_buffer: its shape (and dtype) is all that matters; a TensorMeta will do."""
    from tvmgrad.infer_meta import TensorMeta
    x = rng(4).standard_normal((4, 10)).astype(np.float32)
    g = crand((4, 6), "complex64", 5)
    attrs = {"axes": [1], "normalization": "backward", "forward": True, "onesided": True}
    ours = check("fft_r2c_grad", {"x": x, "out_grad": g}, attrs)
    meta = tvmgrad.run("fft_r2c_grad", {"x": TensorMeta((4, 10), "float32"), "out_grad": g}, attrs)["x_grad"]
    np.testing.assert_array_equal(meta, ours)


# ------------------------------------------------------------------------------------------
# c2r

@pytest.mark.parametrize("shape,axes", [((8,), [0]), ((3, 8), [1]), ((3, 7), [1]), ((4, 6), [0, 1]),
                                        ((5, 7), [1, 0]), ((2, 5, 3), [0, 1])])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("forward", [False, True])
@pytest.mark.sweep
def test_c2r(shape, axes, norm, forward):
    g = rng(6).standard_normal(shape)
    for last in (shape[axes[-1]], 0):
        check("fft_c2r_grad", {"out_grad": g}, {"axes": axes, "normalization": norm, "forward": forward,
                                                "last_dim_size": last})


def test_c2r_float32_and_half():
    g = rng(7).standard_normal((4, 9)).astype(np.float32)
    attrs = {"axes": [1], "normalization": "ortho", "forward": False, "last_dim_size": 9}
    ours = check("fft_c2r_grad", {"out_grad": g}, attrs)
    for dt in (np.float16, ml_dtypes.bfloat16):      # no complex32: half out_grad -> complex64
        h = g.astype(dt)
        got = tvmgrad.run("fft_c2r_grad", {"out_grad": h}, attrs)["x_grad"]
        assert got.dtype == np.complex64
        want = c_ops("fft_c2r_grad", {"out_grad": h.astype(np.float32)}, attrs)["x_grad"]
        close("c2r half", got, want, rtol=1e-5)
    assert ours.shape == (4, 5)


# ------------------------------------------------------------------------------------------
# adjoint identities (float64): ⟨F x, y⟩ = ⟨x, grad(y)⟩ with numpy's forward transforms

SWAP = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def np_c2c(x, axes, norm, forward):
    return np.fft.fftn(x, axes=axes, norm=norm) if forward else np.fft.ifftn(x, axes=axes, norm=norm)


def np_r2c(x, axes, norm, forward):
    """Paddle's fft_r2c (onesided) with numpy: the + direction of a real signal is the conjugate
    of the - one, and Paddle's normalization of a "backward" transform is numpy's "forward"."""
    if forward:
        return np.fft.rfftn(x, axes=axes, norm=norm)
    return np.conj(np.fft.rfftn(x, axes=axes, norm=SWAP[norm]))


def np_c2r(x, shape, axes, norm, forward):
    if not forward:
        return np.fft.irfftn(x, s=[shape[a] for a in axes], axes=axes, norm=norm)
    return np.fft.irfftn(np.conj(x), s=[shape[a] for a in axes], axes=axes, norm=SWAP[norm])


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("forward", [True, False])
def test_adjoint_identities(norm, forward):
    """⟨F x, y⟩ = ⟨x, grad(y)⟩ (real inner product) with numpy's transforms as the forwards: the
    grads are the exact adjoints (c2r's doubled bins included)."""
    shape, axes = (6, 8), [0, 1]
    half = (6, 5)
    attrs = {"axes": axes, "normalization": norm, "forward": forward}
    x, y = crand(shape, seed=8), crand(shape, seed=9)
    gx = tvmgrad.run("fft_c2c_grad", {"out_grad": y}, attrs)["x_grad"]
    assert np.isclose(inner(np_c2c(x, axes, norm, forward), y), inner(x, gx))
    xr, yh = rng(10).standard_normal(shape), crand(half, seed=11)
    gx = tvmgrad.run("fft_r2c_grad", {"x": xr, "out_grad": yh}, {**attrs, "onesided": True})["x_grad"]
    assert np.isclose(inner(np_r2c(xr, axes, norm, forward), yh), inner(xr, gx))
    xh, yr = crand(half, seed=12), rng(13).standard_normal(shape)
    gx = tvmgrad.run("fft_c2r_grad", {"out_grad": yr}, {**attrs, "last_dim_size": 8})["x_grad"]
    xh[:, 0] = xh[:, 0].real            # the imaginary parts of the DC and Nyquist bins are ignored
    xh[:, -1] = xh[:, -1].real
    assert np.isclose(inner(np_c2r(xh, shape, axes, norm, forward), yr), inner(xh, gx))


# ------------------------------------------------------------------------------------------
# bad input

def test_errors():
    g = crand((4, 6))
    base = {"axes": [1], "normalization": "backward", "forward": True}
    with pytest.raises(ValueError, match=r"fft_c2c_grad: attribute 'normalization' is 'none'"):
        tvmgrad.run("fft_c2c_grad", {"out_grad": g}, {**base, "normalization": "none"})
    with pytest.raises(ValueError, match=r"fft_c2c_grad: attribute 'axes' holds 2, out of range"):
        tvmgrad.run("fft_c2c_grad", {"out_grad": g}, {**base, "axes": [2]})
    with pytest.raises(ValueError, match=r"fft_c2c_grad: attribute 'axes' has repeated axes \[1, -1\]"):
        tvmgrad.run("fft_c2c_grad", {"out_grad": g}, {**base, "axes": [1, -1]})
    with pytest.raises(TypeError, match=r"fft_c2c_grad: input 'out_grad' has dtype float64"):
        tvmgrad.run("fft_c2c_grad", {"out_grad": g.real}, base)
    with pytest.raises(ValueError, match=r"fft_c2r_grad: attribute 'last_dim_size' is -6; it must be >= 0"):
        tvmgrad.run("fft_c2r_grad", {"out_grad": g.real}, {**base, "last_dim_size": -6})
    with pytest.raises(ValueError, match=r"fft_c2r_grad: out_grad has size 6 along axis 1 but last_dim_size is 8"):
        tvmgrad.run("fft_c2r_grad", {"out_grad": g.real}, {**base, "last_dim_size": 8})
    with pytest.raises(ValueError, match=r"fft_r2c_grad: out_grad has shape \[4, 6\]; for x of shape \[4, 6\] "
                                         r"\(onesided=True\) it must be \[4, 4\]"):
        tvmgrad.run("fft_r2c_grad", {"x": g.real, "out_grad": g}, {**base, "onesided": True})


def test_half_x_and_empty():
    """r2c: x_grad gets x's dtype (x is only a shape); empty signals give empty grads."""
    x = rng(14).standard_normal((3, 8)).astype(np.float16)
    g = crand((3, 5), "complex64", 15)
    attrs = {"axes": [1], "normalization": "ortho", "forward": True, "onesided": True}
    ours = tvmgrad.run("fft_r2c_grad", {"x": x, "out_grad": g}, attrs)["x_grad"]
    assert ours.dtype == np.float16
    want = c_ops("fft_r2c_grad", {"x": x.astype(np.float32), "out_grad": g}, attrs)["x_grad"]
    np.testing.assert_allclose(ours.astype(np.float32), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    empty = tvmgrad.run("fft_c2c_grad", {"out_grad": np.zeros((0, 8), np.complex128)},
                        {"axes": [1], "normalization": "backward", "forward": True})["x_grad"]
    assert empty.shape == (0, 8) and empty.dtype == np.complex128
    empty = tvmgrad.run("fft_c2c_grad", {"out_grad": np.zeros((3, 0), np.complex64)},
                        {"axes": [1], "normalization": "ortho", "forward": False})["x_grad"]
    assert empty.shape == (3, 0)


# ------------------------------------------------------------------------------------------
# size-0 dims (run in a child process: a kernel dividing by a zero size dies of SIGFPE)

EMPTY_CASES = [
    # (op, out_grad shape, x shape for r2c, axes, extra attrs)
    ("fft_c2c_grad", (4, 6, 0), None, [1, 2], {}),          # the SIGFPE: Bluestein axis, then a 0
    ("fft_c2c_grad", (3, 0), None, [1], {}),
    ("fft_c2c_grad", (0, 5), None, [0, 1], {}),
    ("fft_c2c_grad", (2, 0, 3), None, [0, 2], {}),
    ("fft_c2c_grad", (0,), None, [0], {}),
    ("fft_r2c_grad", (3, 1), (3, 0), [1], {"onesided": True}),
    ("fft_r2c_grad", (0, 4), (0, 6), [0, 1], {"onesided": True}),
    ("fft_r2c_grad", (2, 0, 3), (2, 0, 3), [0, 2], {"onesided": False}),
    ("fft_c2r_grad", (0, 6), None, [1], {"last_dim_size": 0}),
    ("fft_c2r_grad", (2, 0, 5), None, [0, 2], {"last_dim_size": 5}),
]


def _empty_call(op, gshape, xshape, axes, extra, norm, forward):
    g = np.zeros(gshape, np.float64 if op == "fft_c2r_grad" else np.complex128)
    inputs = {"out_grad": g}
    if xshape is not None:
        inputs["x"] = np.zeros(xshape)
    return inputs, {"axes": axes, "normalization": norm, "forward": forward, **extra}


def _empty_shapes():
    """[shape, dtype] of x_grad for every EMPTY_CASES call (run in a child process)."""
    out = []
    for case in EMPTY_CASES:
        for norm in NORMS:
            for fw in (True, False):
                r = tvmgrad.run(case[0], *_empty_call(*case, norm, fw))["x_grad"]
                out.append([list(r.shape), r.dtype.name])
    return out


def test_empty_signals_in_a_child_process():
    """Every fft grad with a size-0 dim, on a transform axis or not, every normalization and
    direction: the empty grad Paddle gives (shape and dtype compared with Paddle's), computed in
    a child process so that a crash fails this test instead of killing the session."""
    got = iter(in_child_process("test_fft", "_empty_shapes"))
    for case in EMPTY_CASES:
        for norm in NORMS:
            for fw in (True, False):
                inputs, attrs = _empty_call(*case, norm, fw)
                want = c_ops(case[0], inputs, attrs)["x_grad"]
                shape, dtype = next(got)
                assert (tuple(shape), dtype) == (want.shape, want.dtype.name), (case, norm, fw)
                assert want.size == 0


def test_c2r_zero_points_is_refused_like_paddle():
    """fft_c2r_grad over a transform axis of size 0: Paddle fails ("Invalid fft n-point (0)");
    here a ValueError naming the op and the axis, before any build."""
    import paddle
    for shape, axes in (((3, 0), [1]), ((0, 4), [0, 1]), ((2, 0, 3), [1, 2])):
        g = np.zeros(shape)
        attrs = {"axes": axes, "normalization": "backward", "forward": True, "last_dim_size": 0}
        with pytest.raises(ValueError, match=r"fft_c2r_grad: out_grad has size 0 along transform axis"):
            tvmgrad.prepare("fft_c2r_grad", {"out_grad": g}, attrs)
        with pytest.raises(Exception, match=r"Invalid fft n-point"):
            paddle._C_ops.fft_c2r_grad(paddle.to_tensor(g), axes, "backward", True, 0)
