"""Every implemented op compiles for CUDA for real: TVM codegen, then nvcc/ptxas to cubin for sm_80
and sm_90, with every kernel bound to threads and no local-memory spills. All of it is -m slow (a
dtype is ~2.5 min of nvcc on 2 cores, beyond the default run's budget; the default run builds
CUDA code in other files: tests/test_aot.py, test_complex.py, test_shape.py, test_relax.py); CI
runs float32 on sm_80 and sm_90 and bfloat16 on sm_80 after the default run.

No GPU is needed (nothing runs); the math of the same PrimFuncs is tested on LLVM elsewhere. Work
is grouped by te_defs family and dtype and spread over a process pool (nvcc dominates); a worker
that dies (ptxas or TVM crashing the process) fails the run at once naming its family and dtype
(tvmgrad.workers).
"""

import functools
import os

import pytest

from samples import broadcast_variant, implemented_ops, sample
from tvmgrad import registry
from tvmgrad.cuda import nvcc_path
from tvmgrad.workers import WorkerDied, imap_unordered

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")]

DTYPES = ("float32", "bfloat16", "float16", "float64")
ARCHS = ("sm_80", "sm_90")
HALF = ("bfloat16", "float16")


def _has_complex(inputs) -> bool:
    values = [v for x in inputs.values() for v in (x if isinstance(x, list) else [x])]
    return any(getattr(v, "dtype", None) is not None and v.dtype.kind == "c" for v in values)


def _family(op):
    entry = registry.get(op)
    return entry.implementation.family


def _groups():
    fams = {}
    for op in implemented_ops():
        fams.setdefault(_family(op), []).append(op)
    return [(fam, dtype, tuple(ops)) for fam, ops in sorted(fams.items()) for dtype in DTYPES]


def _build_group(job):
    """Lower, compile and nvcc one family in one dtype for some archs; returns (plans, stats or
    error)."""
    family, dtype, ops, archs = job
    from cubins import cuda_source, plans_of
    from harness import cast
    from tvmgrad.cuda import compile_cubin
    found = []
    try:
        for op in ops:
            calls = [sample(op)] + ([broadcast_variant(op)] if broadcast_variant(op) else [])
            calls = [(op, {k: cast(v, dtype) for k, v in inputs.items()}, attrs)
                     for inputs, attrs in calls
                     # no half-precision complex dtype: the complex kernels run in f32/f64
                     if not (dtype in HALF and _has_complex(inputs))]
            found += plans_of(calls)
        plans = [(op, plan.symbol) for op, plan in found]
        source = cuda_source(found)
        stats = {}
        for arch in archs:
            if source:
                cubin = compile_cubin(source, arch)
                assert cubin.data[:4] == b"\x7fELF", "nvcc did not produce a cubin"
                stats[arch] = {k: (s.arch, s.registers, s.spill_stores, s.spill_loads)
                               for k, s in cubin.kernels.items()}
        return plans, stats, None
    except Exception as exc:  # noqa: BLE001 - reported per group by the test
        return [(op, plan.symbol) for op, plan in found], {}, f"{type(exc).__name__}: {exc}"[-3000:]


def _build_family(job):
    """(family, _build_group(job)): results arrive in completion order."""
    return job[0], _build_group(job)


def _describe(job):
    family, dtype, _, archs = job
    return f"{family} [{dtype}, {'/'.join(archs)}]"


@functools.cache
def _built(dtype, arch):
    jobs = [job + ((arch,),) for job in _groups() if job[1] == dtype]
    try:
        return dict(imap_unordered(_build_family, jobs, workers=len(os.sched_getaffinity(0)),
                                   describe=_describe)), None
    except WorkerDied as exc:                  # once per dtype, not once per test
        return None, str(exc)


def _results(dtype, arch="sm_80"):
    """Every family's build in ``dtype`` for ``arch``, over a process pool; a worker that died
    fails every test of the dtype with its family and signal."""
    results, death = _built(dtype, arch)
    if death is not None:
        pytest.fail(f"a build worker died: {death}")
    return results


@pytest.mark.parametrize("family,dtype,arch", [(f, d, a) for f, d, _ in _groups() for a in ARCHS])
def test_family_compiles_to_cubin_without_spills(family, dtype, arch):
    plans, stats, error = _results(dtype, arch)[family]
    assert error is None, f"{family} [{dtype}, {arch}]: {error}"
    for op, symbol in plans:
        kernels = {k: v for k, v in stats[arch].items() if k.startswith(symbol + "_kernel")}
        assert kernels, f"{op} [{dtype}]: no kernel {symbol}_kernel* in the {arch} cubin"
        for name, (karch, registers, spill_st, spill_ld) in kernels.items():
            assert karch == arch
            assert registers > 0, f"{name}: ptxas reported no register use"
            assert spill_st == 0 and spill_ld == 0, f"{name} ({op}, {dtype}) spills on {arch}"


def test_every_op_is_covered():
    covered = {op for plans, _, _ in _results("float32").values() for op, _ in plans}
    aliases_only = {op for op in implemented_ops()
                    if registry.get(op).spec.name not in covered}
    # ops whose every sample is a pure alias (a view, no kernel) have nothing to compile
    for op in aliases_only:
        entry = registry.get(op)
        from harness import cast
        from tvmgrad.call import bind
        inputs, attrs = sample(op)
        call = bind(entry.spec, {k: cast(v, "float32") for k, v in inputs.items()}, attrs)
        assert entry.impl.plan(call, registry.infer_outputs(entry, call)).make is None, op
