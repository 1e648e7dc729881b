"""The CPU target is the host as it really is, never the CPU's name; named CPUs are checked.

The failure these guard against: LLVM names a host ``znver4`` (which implies AVX-512) while its
hypervisor masks AVX-512, so code built for the name dies with SIGILL on the first call.
"""

import re

import numpy as np
import pytest

import tvmgrad
from tvmgrad import hostcpu, targets
from tvmgrad.examples import sample

tvm = pytest.importorskip("tvm")
from tvm.target import codegen  # noqa: E402

from tvmgrad.schedules.cpu._isa import VectorUnit, vector_unit  # noqa: E402
from tvmgrad.schedules.cpu.gemm_dense import micro_kernel  # noqa: E402
from harness import micro_kernel_rows, scheduled  # noqa: E402

X86 = pytest.mark.skipif(hostcpu.host().arch != "x86_64", reason="x86-64 CPU names")

# /proc/cpuinfo of a 2-core EPYC VM whose hypervisor masks AVX-512 (LLVM calls it znver4)
MASKED_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy abm sse4a misalignsse 3dnowprefetch topoext fsgsbase bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero rdpid fsrm vaes vpclmulqdq gfni
"""


@pytest.fixture
def masked_znver4(monkeypatch):
    """This process believes it runs on a znver4 whose AVX-512 is masked."""
    fake = hostcpu.from_cpuinfo(MASKED_EPYC, "x86_64")
    monkeypatch.setattr(hostcpu, "host", lambda: fake)
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "znver4")
    targets.host_cpu_spec.cache_clear()
    yield fake
    targets.host_cpu_spec.cache_clear()


def test_cpuinfo_flags_become_llvm_features():
    cpu = hostcpu.from_cpuinfo(MASKED_EPYC, "x86_64")
    assert {"avx2", "fma", "sse4.1", "sse3", "bmi", "lzcnt", "gfni"} <= cpu.present
    assert "avx512f" not in cpu.present and "avx512f" in cpu.vouched
    # LLVM's tuning flags are not CPU features: no source vouches for them
    assert cpu.lacks(["avx512f", "avx512bw", "fast-lzcnt", "avx2"]) == ["avx512bw", "avx512f"]
    arm = hostcpu.from_cpuinfo("processor\t: 0\nFeatures\t: fp asimd aes crc32 atomics fphp asimdhp "
                               "asimddp sve\n", "aarch64")
    assert {"neon", "fullfp16", "dotprod", "sve", "lse"} <= arm.present
    assert arm.lacks(["sve2", "neon", "i8mm"]) == ["i8mm", "sve2"]


@X86
def test_host_target_turns_off_what_the_host_lacks(masked_znver4):
    spec = targets.host_cpu_spec()
    assert spec["mcpu"] == "znver4"
    assert "-avx512f" in spec["mattr"] and "-avx512bw" in spec["mattr"]
    resolved = targets.Resolved(tvm.target.Target(spec))
    assert not any(f.startswith("avx512") for f in resolved.features)
    assert {"avx2", "fma"} <= set(resolved.features)
    assert resolved.missing_on_host == ()
    assert vector_unit(resolved.target) == VectorUnit(256, 16)
    # the name alone would need AVX-512
    named = targets.Resolved(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    assert "avx512f" in named.missing_on_host


@X86
def test_code_for_the_masked_host_has_no_avx512(masked_znver4):
    host = _doubled_asm(targets.host_cpu_spec())
    assert "zmm" not in host and "ymm" in host
    assert "zmm" in _doubled_asm({"kind": "llvm", "mcpu": "znver4"})


def _doubled_asm(target) -> str:
    """The assembly of a 64-lane vectorised a * 2 + 1 for ``target``."""
    from tvm import s_tir, te
    n = te.var("n")
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0 + 1.0, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]).with_attr("global_symbol", "k"))
    _, inner = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, 64])
    sch.vectorize(inner)
    return tvm.compile(sch.mod, target=tvm.target.Target(target)).mod.inspect_source("asm")


@X86
def test_avx512_targets_use_the_full_vector_width():
    """LLVM's prefer-256-bit (Intel's AVX-512 CPUs) would split each 512-bit vector in two."""
    def float_ops(asm, reg):
        return len(re.findall(rf"v(?:fmadd\w*|addps|mulps)\s[^\n]*%{reg}", asm))

    spec = targets.cpu_spec("skylake-avx512")
    assert spec["mattr"] == ["-prefer-256-bit"]
    full, written = _doubled_asm(spec), _doubled_asm({"kind": "llvm", "mcpu": "skylake-avx512"})
    assert float_ops(full, "zmm") > 0 and float_ops(full, "ymm") == 0
    assert float_ops(written, "zmm") == 0 and float_ops(written, "ymm") > 0     # as written
    assert "mattr" not in targets.cpu_spec("x86-64-v3")                            # no AVX-512


@X86
def test_default_target_runs_on_the_masked_host(masked_znver4, monkeypatch):
    """A pointwise, a dense and a reduction kernel built for the corrected znver4 run here (they
    use at most AVX2, which every x86 host these tests run on has)."""
    monkeypatch.delenv(targets.CPU_ENV, raising=False)
    target = targets.host_cpu_spec()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 33)).astype("float32")
    g = rng.standard_normal((5, 33)).astype("float32")
    got = tvmgrad.run("relu_grad", {"out": x, "out_grad": g}, target=target)["x_grad"]
    np.testing.assert_array_equal(got, np.where(x > 0, g, 0))
    y = rng.standard_normal((2, 33, 7)).astype("float32")
    xb = np.stack([x, -x])
    dout = rng.standard_normal((2, 5, 7)).astype("float32")
    res = tvmgrad.run("bmm_grad", {"x": xb, "y": y, "out_grad": dout}, target=target)
    np.testing.assert_allclose(res["x_grad"], dout @ y.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res["y_grad"], xb.transpose(0, 2, 1) @ dout, rtol=1e-5, atol=1e-5)
    res = tvmgrad.run("log_softmax_grad", {"out": x, "out_grad": g}, {"axis": -1}, target=target)
    np.testing.assert_allclose(res["x_grad"], g - np.exp(x) * g.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-5)


def test_unknown_cpu_names_are_refused():
    with pytest.raises(ValueError, match=r"unknown CPU 'no-such-cpu'"):
        targets.resolve("llvm:no-such-cpu")
    with pytest.raises(ValueError, match=r"did you mean .*znver"):
        targets.resolve("llvm:znver")
    with pytest.raises(ValueError, match=r"unknown CPU"):
        targets.resolve({"kind": "llvm", "mcpu": "pentium9"})
    x = np.ones((2, 3), "float32")
    with pytest.raises(ValueError, match=r"unknown CPU"):
        tvmgrad.run("relu_grad", {"out": x, "out_grad": x}, target="llvm:no-such-cpu")


@X86
def test_cpu_env_selects_what_llvm_means(monkeypatch):
    monkeypatch.setenv(targets.CPU_ENV, "x86-64-v3")
    resolved = targets.resolve("llvm")
    assert resolved.target.attrs["mcpu"] == "x86-64-v3"
    assert vector_unit(resolved.target) == VectorUnit(256, 16)
    monkeypatch.setenv(targets.CPU_ENV, "host")
    assert targets.resolve("llvm").key == targets.resolve(targets.host_cpu_spec()).key
    monkeypatch.setenv(targets.CPU_ENV, "bogus-cpu")
    with pytest.raises(ValueError, match="unknown CPU 'bogus-cpu'"):
        targets.resolve("llvm")


@X86
def test_a_target_the_host_cannot_run_is_refused_before_building(monkeypatch):
    fake = hostcpu.HostCPU("x86_64", "test", frozenset({"sse", "sse2"}), frozenset(hostcpu.X86_FLAGS))
    monkeypatch.setattr(hostcpu, "host", lambda: fake)
    x = np.ones((2, 3), "float32")
    built = []
    monkeypatch.setattr("tvmgrad.cache.compile_plan", lambda *a: built.append(a))
    with pytest.raises(ValueError, match=r"relu_grad: target llvm:x86-64-v3 .*needs .*avx2.*illegal"):
        tvmgrad.run("relu_grad", {"out": x, "out_grad": x},
                    target={"kind": "llvm", "mcpu": "x86-64-v3", "mattr": ["+sse3"]})
    assert not built


@X86
def test_cache_key_carries_the_resolved_features():
    v3 = targets.resolve("llvm:x86-64-v3")
    v4 = targets.resolve("llvm:x86-64-v4")
    masked = targets.resolve({"kind": "llvm", "mcpu": "x86-64-v4", "mattr": ["-avx512f"]})
    assert len({v3.key, v4.key, masked.key}) == 3


@X86
def test_micro_kernels_follow_the_vector_unit():
    for cpu, unit, f32_tile in (("x86-64-v3", VectorUnit(256, 16), (6, 16)),
                                ("x86-64-v4", VectorUnit(512, 32), (6, 64)),
                                ("x86-64-v2", VectorUnit(128, 16), (6, 8))):
        target = targets.resolve(f"llvm:{cpu}").target
        assert vector_unit(target) == unit
        mb, nb = micro_kernel(unit, "float32")
        assert (mb, nb) == f32_tile
        # accumulators + one operand row + one broadcast stay within the registers
        assert mb * unit.vectors(nb, "float32") + unit.vectors(nb, "float32") + 1 <= unit.registers


@X86
@pytest.mark.parametrize("cpu,rows,grain", [("x86-64-v3", 6, 6), ("x86-64-v4", 6, 6),
                                            ("x86-64-v2", 6, 6)])
def test_contractions_pad_rows_for_the_targets_micro_kernel(cpu, rows, grain):
    """bmm_grad's long M axes (100 and 70 rows) are tiled by the target's micro-kernel rows and
    padded for them: 6 rows (102 and 72 rows, not 128) wherever they fit the registers, AVX2,
    AVX-512 and SSE alike; the grads are the products'."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 100, 70)), rng.standard_normal((2, 70, 50))
    g = rng.standard_normal((2, 100, 50))
    inputs = {k: v.astype("float32") for k, v in (("x", x), ("y", y), ("out_grad", g))}
    planned, script = scheduled("bmm_grad", inputs, cpu=cpu)
    assert set(re.findall(r'"dense\.gm": (\d+)', script)) == {str(grain)}
    assert micro_kernel_rows(script) == {str(rows)}
    if not planned.target.missing_on_host:          # this host runs the kernel
        out = tvmgrad.run("bmm_grad", inputs, target=f"llvm:{cpu}")
        np.testing.assert_allclose(out["x_grad"], g @ y.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["y_grad"], x.transpose(0, 2, 1) @ g, rtol=1e-4, atol=1e-4)


def _output_lanes(op, inputs, cpu) -> int:
    """The vector length of the loop around ``op``'s output block ``ro_x_grad`` in its scheduled
    TIR for ``llvm:<cpu>``."""
    _, script = scheduled(op, inputs, cpu=cpu)
    (lanes,) = re.findall(r"T\.vectorized\((?:T\.int\d+\()?(\d+)\)*:\s*"
                          r"with T\.sblock\(\"ro_x_grad\"\)", script)
    return int(lanes)


def test_row_outputs_with_a_polynomial_step_several_vectors_on_a_narrow_unit():
    """log_softmax_grad's output runs exp: four vectors a step on a 256-bit unit, one on a
    512-bit one; layer_norm_grad's (no polynomial) one vector a step on both."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 256)).astype("float32")
    softmax = {"out": x, "out_grad": x}
    norm = {"x": x, "scale": x[0], "bias": x[0], "mean": x[:, 0], "variance": x[:, 0] ** 2,
            "out_grad": x}
    assert _output_lanes("log_softmax_grad", softmax, "x86-64-v3") == 32
    assert _output_lanes("log_softmax_grad", softmax, "x86-64-v4") == 16
    assert _output_lanes("log_softmax_grad", {k: v.astype("float64") for k, v in softmax.items()},
                         "x86-64-v3") == 4          # float64's exp is libm's: one vector a step
    assert _output_lanes("layer_norm_grad", norm, "x86-64-v3") == 8
    assert _output_lanes("layer_norm_grad", norm, "x86-64-v4") == 16


def test_small_scratch_buffers_live_on_the_cpu_stack_and_in_cuda_registers():
    """grid_sample_grad's accumulators (CUDA: one per output position; CPU: a run of 64
    positions'): a stack array for LLVM (a "local" one lowers to a TVMBackendAllocWorkspace/
    FreeWorkspace pair per task), "local" for CUDA (which allows no global allocation in a
    kernel)."""
    from tvmgrad.build import lower
    from tvmgrad.planning import plan_call
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((1, 2, 4, 4)).astype("float32"),
              "grid": rng.uniform(-1, 1, (1, 3, 3, 2)).astype("float32"),
              "out_grad": rng.standard_normal((1, 2, 3, 3)).astype("float32")}
    attrs = {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False}

    def scopes(target):
        planned = plan_call("grid_sample_grad", inputs, attrs, target=target)
        script = lower(planned.plan, planned.target).script()
        allocs = re.findall(r"T\.alloc_\w+\(\((?:1,|2, 64)\)[^\n]*", script)
        assert allocs
        return {"local" if "alloc_local" in a or 'scope="local"' in a else "global" for a in allocs}

    assert scopes("llvm") == {"global"}
    assert scopes("cuda") == {"local"}


@X86
@pytest.mark.parametrize("op,width", [("depthwise_conv2d_grad", 50), ("conv2d_grad", 5)])
def test_cropped_dense_outputs_store_without_avx2_masks(op, width):
    """A contraction's epilogue crops its padded tile into the output with a loop bounded by the
    crop: plain vector stores and a scalar tail, never AVX2's slow ``vmaskmovps`` stores (the
    output rows are ``width`` wide: padded to a grain of 64 and of 8)."""
    from tvmgrad.build import compile_plan
    from tvmgrad.planning import plan_call
    inputs, attrs = sample(op)
    rng = np.random.default_rng(0)
    if op == "depthwise_conv2d_grad":   # a channel multiplier of 2: the contraction form
        inputs["filter"] = np.concatenate([inputs["filter"]] * 2)
    for name in ("input", "out_grad"):
        n, c, h, _ = inputs[name].shape
        c *= 2 if op == "depthwise_conv2d_grad" and name == "out_grad" else 1
        inputs[name] = rng.standard_normal((n, c, h, width)).astype(inputs["filter"].dtype)
    planned = plan_call(op, inputs, attrs, target="llvm:x86-64-v3")
    asm = compile_plan(planned.plan, planned.target).mod.inspect_source("asm")
    assert "ymm" in asm
    assert not re.findall(r"vmaskmovp[sd]\s+%[xy]mm\d+,\s*%[xy]mm\d+,\s*-?\w*\(", asm)
