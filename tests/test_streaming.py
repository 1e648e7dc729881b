"""Streaming (non-temporal) stores of large flat pointwise kernels (tvmgrad/streaming.py): opt-in,
the same results as the ordinary kernel, stores marked only in the kernel body."""

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from tvmgrad import build, planning, streaming
from tvmgrad.cache import default_cache
from tvmgrad.targets import resolve

N = 50_000 + 7          # not a multiple of any vector: the scalar tail runs too


def _inputs(dtype, n=N, seed=0, count=2):
    rng = np.random.default_rng(seed)
    npd = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    return tuple(rng.uniform(-2, 2, n).astype(npd) for _ in range(count))


def _prepare(op, inputs, attrs=None, target="llvm"):
    return tvmgrad.prepare(op, inputs, attrs, target=target)


@pytest.fixture
def stream_from_1k(monkeypatch):
    monkeypatch.setenv(streaming.ENV, "1024")


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(streaming.ENV, raising=False)
    a, b = _inputs("float32", 1 << 20)
    plan = planning.plan_call("relu_grad", {"out": a, "out_grad": b}, target="llvm").plan
    assert plan.stream_bytes == 4 << 20 and not plan.stream


def test_threshold_setting(monkeypatch):
    monkeypatch.setenv(streaming.ENV, "auto")
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert streaming.min_bytes() == streaming.L2_MULTIPLE * streaming._l2_bytes() * 3
    monkeypatch.setenv(streaming.ENV, "off")
    assert streaming.min_bytes() is None
    monkeypatch.setenv(streaming.ENV, "lots")
    with pytest.raises(ValueError, match="TVMGRAD_STREAM_MIN_BYTES"):
        streaming.min_bytes()


@pytest.mark.parametrize("op,names,attrs,dtype", [
    ("relu_grad", ("out", "out_grad"), None, "float32"),
    ("sigmoid_grad", ("out", "out_grad"), None, "float64"),
    ("gelu_grad", ("x", "out_grad"), {"approximate": False}, "float32"),
    ("silu_grad", ("x", "out", "out_grad"), None, "float16"),
    ("tanh_grad", ("out", "out_grad"), None, "bfloat16"),
])
def test_streamed_kernel_computes_what_the_ordinary_one_does(stream_from_1k, monkeypatch, op,
                                                              names, attrs, dtype):
    inputs = dict(zip(names, _inputs(dtype, count=len(names))))
    streamed = _prepare(op, inputs, attrs)
    assert streamed.plan.stream and streamed.plan.symbol.endswith("_stream")
    monkeypatch.setenv(streaming.ENV, "off")
    plain = _prepare(op, inputs, attrs)
    assert not plain.plan.stream and plain.plan.variant_key == streamed.plan.variant_key
    got, want = streamed(), plain()
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name], np.float64),
                                      np.asarray(want[name], np.float64))


def test_stores_of_the_body_are_marked_and_nothing_else(stream_from_1k):
    a, b = _inputs("float32")
    plan = planning.plan_call("relu_grad", {"out": a, "out_grad": b}, target="llvm").plan
    target = resolve("llvm")
    ll = build.compile_lowered({plan.symbol: build.lower(plan, target)["main"]}, target).mod \
        .inspect_source("ll")
    text, marked = streaming.mark_nontemporal(ll)
    assert marked >= 1 and text.count("!nontemporal") == marked
    wrapper = text[text.index(f"@__tvm_ffi_{plan.symbol}("):]
    assert "!nontemporal" not in wrapper[:wrapper.index("\n}")]
    for line in text.splitlines():
        if "!nontemporal" in line:
            assert line.lstrip().startswith("store <") and "float>" in line
    assert streaming.mark_nontemporal(text)[1] == 0          # marking twice adds nothing


def test_only_flat_whole_outputs_are_candidates(stream_from_1k):
    x = np.random.default_rng(1).uniform(0.1, 0.9, (300, 200)).astype("float32")
    y = x[0].copy()
    plan = planning.plan_call("atan2_grad", {"x": x, "y": y, "out_grad": x}, target="llvm").plan
    assert plan.stream_bytes is None and not plan.stream     # y_grad sums over a broadcast dim
    flat = planning.plan_call("atan2_grad", {"x": x, "y": x, "out_grad": x}, target="llvm").plan
    assert flat.stream and flat.stream_bytes == 2 * x.nbytes
    assert not planning.plan_call("relu_grad", {"out": x, "out_grad": x}, target="cuda").plan.stream
    assert not planning.plan_call("relu_grad", {"out": x, "out_grad": x}).plan.stream


def test_a_streamed_launch_serves_every_size_and_inplace(stream_from_1k):
    a, b = _inputs("float32")
    launch = _prepare("relu_grad", {"out": a, "out_grad": b})
    assert launch.plan.stream
    small_a, small_b = a[:100].copy(), b[:100].copy()       # planned as an ordinary kernel
    np.testing.assert_array_equal(launch({"out": small_a, "out_grad": small_b})["x_grad"],
                                  np.where(small_a > 0, small_b, 0))
    g = b.copy()
    tvmgrad.run("relu_grad", {"out": a, "out_grad": g}, inplace=True)
    np.testing.assert_array_equal(g, np.where(a > 0, b, 0))


def test_avx2_target_streams(stream_from_1k):
    a, b = _inputs("float32", seed=3)
    launch = _prepare("sigmoid_grad", {"out": a, "out_grad": b}, target="llvm:x86-64-v3")
    assert launch.plan.stream
    np.testing.assert_allclose(launch()["x_grad"], b * a * (1 - a), rtol=1e-6)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_the_cached_kernel_has_nontemporal_stores(stream_from_1k):
    a, b = _inputs("float32", seed=4)
    launch = _prepare("relu_grad", {"out": a, "out_grad": b})
    path = default_cache.entry_path(launch.plan, launch.op.impl, launch.target)
    code = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True)
    assert "movnt" in code.stdout
