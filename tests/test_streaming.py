"""Streaming (non-temporal) stores of large flat pointwise kernels and row kernels (norm grads)
(tvmgrad/streaming.py): opt-in, the same results as the ordinary kernel, stores marked only in
the kernel body and, for a row kernel, only into its outputs."""

import os
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from tvmgrad import build, planning, streaming
from tvmgrad.cache import default_cache
from tvmgrad.dtypes import dtype as as_dtype
from tvmgrad.infer_meta import TensorMeta
from tvmgrad.runtime import aligned_empty
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


def test_large_calls_only(monkeypatch):
    monkeypatch.delenv(streaming.ENV, raising=False)
    least = streaming.min_bytes()
    assert least == streaming.L2_MULTIPLE * streaming._l2_bytes() * int(
        os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))
    a, b = _inputs("float32", 1 << 10)
    for n, streams in ((least // 4 - 1, False), (least // 4, True)):
        metas = {"out": TensorMeta((n,), as_dtype("float32")),
                 "out_grad": TensorMeta((n,), as_dtype("float32"))}
        plan = planning.plan_call("relu_grad", metas, metas_only=True, target="llvm").plan
        assert plan.stream_bytes == 4 * n and plan.stream is streams
    monkeypatch.setenv(streaming.ENV, "off")
    assert not planning.plan_call("relu_grad", metas, metas_only=True, target="llvm").plan.stream


def test_threshold_setting(monkeypatch):
    monkeypatch.setenv(streaming.ENV, "auto")
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert streaming._size("2048K") == 2 << 20 and streaming._size("1M") == 1 << 20
    assert streaming.min_bytes() == streaming.L2_MULTIPLE * streaming._l2_bytes() * 3
    monkeypatch.setenv(streaming.ENV, "off")
    assert streaming.min_bytes() is None
    monkeypatch.setenv(streaming.ENV, "lots")
    with pytest.raises(ValueError, match="TVMGRAD_STREAM_MIN_BYTES"):
        streaming.min_bytes()


@pytest.mark.parametrize("op,names,attrs,dtype", [
    ("relu_grad", ("out", "out_grad"), None, "float32"),
    ("sigmoid_grad", ("out", "out_grad"), None, "float64"),
    ("tanh_double_grad", ("out", "grad_out", "grad_x_grad"), None, "float32"),
    ("atan2_grad", ("x", "y", "out_grad"), None, "float16"),
    ("tanh_grad", ("out", "out_grad"), None, "bfloat16"),
    ("hardsigmoid_grad", ("out", "out_grad"), {"slope": 0.2, "offset": 0.5}, "float32"),
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
            lanes, align = re.search(r"store <(\d+) x float> .*, align (\d+)", line).groups()
            assert int(align) == 4 * int(lanes)                   # a whole aligned vector
    unaligned = re.sub(r"align (32|64)\b", "align 4", ll)          # as LLVM writes a tail
    assert streaming.mark_nontemporal(unaligned)[1] == 0
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
    kept = launch.bound().plan               # holds no builder (its closures hold the arrays)
    assert kept.make_static is None and kept.plain.make_static is None
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
    assert "vmovntp" in code.stdout               # whole aligned vectors, not movnti pieces


def test_streamed_only_onto_aligned_outputs_already_in_memory(stream_from_1k):
    a, b = _inputs("float32", 1 << 16, seed=5)
    launch = _prepare("relu_grad", {"out": a, "out_grad": b})
    kernel = launch.function
    assert isinstance(kernel, streaming.Streaming)
    want = np.where(a > 0, b, 0)
    got = launch()["x_grad"]                                    # its own outputs: aligned
    np.testing.assert_array_equal(got, want)
    assert got.ctypes.data % 64 == 0
    out = aligned_empty(a.shape, a.dtype)
    out[:] = 0                                                  # pages faulted in
    np.testing.assert_array_equal(launch(out={"x_grad": out})["x_grad"], want)
    assert kernel.last == "streamed"
    raw = np.zeros(a.size + 1, a.dtype)
    odd = raw[1:] if raw.ctypes.data % 64 == 0 else raw[:-1]    # 4 bytes off a 64-byte line
    if odd.ctypes.data % 64:
        np.testing.assert_array_equal(launch(out={"x_grad": odd})["x_grad"], want)
        assert kernel.last == "plain"
    import mmap
    fresh = mmap.mmap(-1, a.nbytes)                              # mapped, never touched
    untouched = np.frombuffer(fresh, dtype=a.dtype)
    np.testing.assert_array_equal(launch(out={"x_grad": untouched})["x_grad"], want)
    assert kernel.last == "plain"
    del untouched
    fresh.close()


def _layer_norm_inputs(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype("float32")
    return {"x": x, "scale": rng.uniform(0.5, 1.5, cols).astype("float32"),
            "bias": np.zeros(cols, "float32"), "mean": x.mean(1), "variance": x.var(1),
            "out_grad": rng.standard_normal((rows, cols)).astype("float32")}


def _group_norm_inputs(n, c, hw, groups, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, hw)) * 2 + 0.5).astype("float32")
    g = x.reshape(n, groups, -1)
    return ({"x": x, "scale": rng.uniform(0.5, 1.5, c).astype("float32"),
             "bias": np.zeros(c, "float32"), "y": x, "mean": g.mean(2), "variance": g.var(2),
             "y_grad": rng.standard_normal(x.shape).astype("float32")},
            {"epsilon": 1e-5, "groups": groups, "data_format": "NCHW"})


@pytest.mark.parametrize("op,inputs,attrs,rows", [
    ("layer_norm_grad", _layer_norm_inputs(64, 256), {"begin_norm_axis": 1}, 256),
    ("group_norm_grad", *_group_norm_inputs(6, 8, 48, 4), 48),
])
def test_row_kernels_stream_with_their_rows_baked_in(stream_from_1k, monkeypatch, op, inputs,
                                                     attrs, rows):
    """A norm grad whose rows are a whole number of 64-byte vectors streams: its variant is
    built for that row length (so LLVM proves the row's vector stores aligned) and serves only
    calls of that length; others run the ordinary kernel."""
    launch = _prepare(op, inputs, attrs)
    plan = launch.plan
    assert plan.stream and plan.baked and {size for _, _, size in plan.baked} == {rows}
    assert isinstance(launch.function, streaming.Streaming)
    got = launch()
    assert launch.function.last == "streamed"
    monkeypatch.setenv(streaming.ENV, "off")
    plain = _prepare(op, inputs, attrs)
    assert not plain.plan.stream and plain.plan.variant_key == plan.variant_key
    want = plain()
    for name in want:              # the same sums, maybe in another order (rows of a known length)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5,
                                   atol=1e-6 * np.abs(want[name]).max())
    longer = ({k: (np.concatenate([v, v[..., :16]], -1) if v.shape == inputs["x"].shape else v)
               for k, v in inputs.items()} if op == "layer_norm_grad" else None)
    if longer is not None:        # the same launch on rows of another length: the ordinary kernel
        longer["scale"] = np.concatenate([inputs["scale"], inputs["scale"][:16]])
        longer["bias"] = np.zeros(rows + 16, "float32")
        got = launch(longer)
        assert launch.function.last == "plain"
        want = plain(longer)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def _normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


@pytest.mark.parametrize("op,inputs,attrs", [
    ("concat_grad", {"x": [np.zeros((40, n), "float32") for n in (16, 48, 32)],
                     "out_grad": _normal(40, 96)}, {"axis": 1}),
    ("concat_grad", {"x": [np.zeros((5, n, 16), "float32") for n in (2, 3)],
                     "out_grad": _normal(5, 5, 16, seed=1)}, {"axis": 1}),
    ("stack_grad", {"x": [np.zeros((24, 32), "float32")] * 3, "out_grad": _normal(24, 3, 32)},
     {"axis": 1}),
])
def test_shape_kernels_stream_with_their_rows_baked_in(stream_from_1k, monkeypatch, op, inputs,
                                                       attrs):
    """A shape grad whose output rows are a whole number of 64-byte vectors streams under the
    stream_stores rule, built for those row lengths; the values are the ordinary kernel's."""
    launch = _prepare(op, inputs, attrs)
    assert launch.plan.stream and launch.plan.pattern == streaming.PATTERN and launch.plan.baked
    got = launch()
    assert launch.function.last == "streamed"
    monkeypatch.setenv(streaming.ENV, "off")
    plain = _prepare(op, inputs, attrs)
    assert not plain.plan.stream
    want = plain()
    for name in want:
        for g, w in zip(*(v if isinstance(v, list) else [v] for v in (got[name], want[name]))):
            np.testing.assert_array_equal(g, w)


def test_shape_kernels_of_other_rows_or_rules_do_not_stream(stream_from_1k):
    odd = {"x": [np.zeros((40, n), "float32") for n in (16, 40)], "out_grad": _normal(40, 56)}
    assert not planning.plan_call("concat_grad", odd, {"axis": 1}, target="llvm").plan.stream
    pad = {"x": np.zeros((2, 3, 16, 16, 16), "float32"), "out_grad": _normal(2, 3, 18, 18, 18)}
    plan = planning.plan_call("pad3d_grad", pad, {"paddings": [1] * 6, "mode": "reflect",
                                                  "pad_value": 0.0, "data_format": "NCDHW"},
                              target="llvm").plan
    assert plan.pattern == "gather_sums" and not plan.stream     # its own rule is kept


def test_rows_of_a_length_off_the_vectors_do_not_stream(stream_from_1k):
    plan = planning.plan_call("layer_norm_grad", _layer_norm_inputs(64, 250), target="llvm").plan
    assert plan.stream_bytes is None and not plan.stream


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_a_row_kernel_has_nontemporal_stores(stream_from_1k):
    launch = _prepare("layer_norm_grad", _layer_norm_inputs(64, 256, seed=1))
    path = default_cache.entry_path(launch.plan, launch.op.impl, launch.target)
    code = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True)
    assert "vmovntp" in code.stdout


def test_only_stores_into_the_outputs_are_marked():
    ll = "\n".join([
        "define internal fastcc i32 @kernel_compute_(ptr noalias align 64 %out, ptr %scratch) {",
        "  %1 = getelementptr inbounds float, ptr %out, i64 %i",
        "  %2 = getelementptr inbounds float, ptr %1, i64 16",
        "  %3 = getelementptr inbounds float, ptr %scratch, i64 %i",
        "  store <16 x float> %v, ptr %2, align 64, !tbaa !1",
        "  store <16 x float> %v, ptr %3, align 64, !tbaa !2",
        "  store <16 x float> %v, ptr %out, align 64",
        "}",
        "define internal fastcc i32 @other_(ptr %out2) {",
        "  %2 = getelementptr inbounds float, ptr %scratch, i64 %i",
        "  store <16 x float> %v, ptr %2, align 64",
        "}"])
    text, marked = streaming.mark_nontemporal(ll, ["out"])
    assert marked == 2
    lines = text.splitlines()
    assert "!nontemporal" in lines[4] and "!nontemporal" in lines[6]
    assert "!nontemporal" not in lines[5] and "!nontemporal" not in lines[10]
    assert streaming.mark_nontemporal(ll)[1] == 4                  # no names: every store


@pytest.mark.parametrize("op,names,attrs", [
    ("gelu_grad", ("x", "out_grad"), {"approximate": False}),
    ("silu_grad", ("x", "out", "out_grad"), None),
])
def test_compute_bound_kernels_do_not_stream(stream_from_1k, op, names, attrs):
    inputs = dict(zip(names, _inputs("float32", count=len(names))))
    plan = planning.plan_call(op, inputs, attrs, target="llvm").plan
    assert plan.stream_bytes is not None and not streaming.memory_bound(plan)
    assert not plan.stream


@pytest.mark.cuda
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_streamed_plan_still_builds_for_cuda(stream_from_1k):
    a, b = _inputs("float32")
    plan = planning.plan_call("relu_grad", {"out": a, "out_grad": b}, target="llvm").plan
    assert plan.stream
    build.compile_plan(plan, resolve("cuda"))           # the elementwise rule; no store hint
