"""The float32 exp/erf polynomials of tvmgrad/fastmath.py against float64 numpy, on the LLVM target
as every CPU kernel gets them: exp within 1 ulp of the correctly rounded value over the whole
range (erf: Eigen's few ulp), exact at the edges (overflow to inf, underflow to 0, the subnormal
range, NaN and ±inf), in scalar code and in an explicitly vectorised loop, on the host's ISA and
on AVX2; and each target's own way of scaling by 2ⁿ."""

from __future__ import annotations

import numpy as np
import pytest

import tvmgrad  # noqa: F401  (TVM's import path)
from tvmgrad import hostcpu, targets

# every float32 exp/erf input that is an edge: both sides of overflow and of underflow, the
# subnormal results, the points where the range reduction changes n, signed zeros, inf, NaN
EXP_EDGES = [88.72283935546875, 88.7228317260742, 88.72284, 88.8, 89.0, 89.5, 100.0, 1e30,
             -87.33654, -87.34, -100.0, -103.0, -103.27893, -103.9720, -103.97207708, -103.9721,
             -103.98, -104.0, -104.5, -105.0, -1e30, 0.0, -0.0, 1e-30, -1e-30, 0.34657359,
             -0.34657359, 0.5, -0.5, 1.0, np.log(2.0), 10.0, -10.0, np.inf, -np.inf, np.nan]


def _kernel(fn: str, target, lanes: int):
    """y = fn(x) over n float32 values, the loop scalar (lanes 1) or vectorised by TVM: the
    compiled module (its function "f")."""
    import tvm
    from tvm import s_tir, te
    from tvmgrad.fastmath import install
    install()
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: getattr(te, fn)(x[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]).with_attr("global_symbol", "f"))
    if lanes > 1:
        _, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])
        sch.vectorize(inner)
    with target:                        # as tvmgrad builds: the rules read the target
        return tvm.compile(sch.mod, target=target)


def _run(fn, target, lanes, x):
    from tvmgrad.runtime import aligned_empty
    x = np.ascontiguousarray(x, np.float32)
    n = -(-len(x) // lanes) * lanes
    src = aligned_empty((n,), np.float32)
    src[:] = 0.0
    src[: len(x)] = x
    dst = aligned_empty((n,), np.float32)
    _kernel(fn, target, lanes)["f"](src, dst)
    return dst[: len(x)]


def _ulps(got, want):
    """Distance in float32 ulps (counted on the ordered integer line, so across zero and into
    the subnormals too)."""
    def ordered(v):
        i = v.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(got) - ordered(want))


def _targets():
    out = [pytest.param(targets.resolve("llvm").target, id="host")]
    if hostcpu.host().arch == "x86_64":
        out.append(pytest.param(targets.resolve("llvm:x86-64-v3").target, id="avx2"))
    return out


@pytest.mark.parametrize("lanes", [1, 8, 16])
@pytest.mark.parametrize("target", _targets())
def test_exp32(target, lanes):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.array(EXP_EDGES, np.float32),
                        rng.uniform(-110, 90, 20000).astype(np.float32),
                        rng.standard_normal(5000).astype(np.float32)])
    got = _run("exp", target, lanes, x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)     # correctly rounded (float64 first)
    finite = np.isfinite(want) & ~np.isnan(x)
    assert _ulps(got[finite], want[finite]).max() <= 1
    assert np.array_equal(np.isinf(got), np.isinf(want))        # overflow exactly where it is
    assert np.array_equal(got[want == 0], want[want == 0])      # underflow to +0
    assert np.isnan(got[np.isnan(x)]).all()
    assert got[x == -np.inf].tolist() == [0.0] and got[x == np.inf].tolist() == [np.inf]


@pytest.mark.parametrize("lanes", [1, 8])
@pytest.mark.parametrize("target", _targets())
def test_erf32(target, lanes):
    from scipy.special import erf
    rng = np.random.default_rng(1)
    x = np.concatenate([np.array([0.0, -0.0, 1e-30, 0.5, 3.9, 4.0, 4.1, -4.1, 10.0, np.inf,
                                  -np.inf, np.nan], np.float32),
                        rng.uniform(-6, 6, 20000).astype(np.float32)])
    got = _run("erf", target, lanes, x)
    want = erf(x.astype(np.float64)).astype(np.float32)
    ok = ~np.isnan(x)
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=5e-7)    # Eigen's approximation: a few ulp
    assert np.isnan(got[~ok]).all()
    assert got[np.abs(x) >= 4].tolist() == np.sign(x[np.abs(x) >= 4]).tolist()


@pytest.mark.skipif(hostcpu.host().arch != "x86_64", reason="x86-64 CPU names")
@pytest.mark.parametrize("cpu, scalef", [("skylake-avx512", True), ("x86-64-v3", False)])
def test_exp_scales_by_the_targets_means(cpu, scalef):
    """AVX-512 targets scale by 2ⁿ with vscalefps (what llvm.ldexp lowers to there), AVX2 ones
    by exponent bits; only the target's features decide (compiled, not run: any x86 host)."""
    asm = _kernel("exp", targets.resolve(f"llvm:{cpu}").target, 16).mod.inspect_source("asm")
    assert ("vscalefps" in asm) == scalef
    assert "expf" not in asm                       # no libm call either way
