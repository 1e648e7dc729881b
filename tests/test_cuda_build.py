"""Every implemented op compiles for CUDA for real: TVM codegen, then nvcc/ptxas to cubin for sm_80
and sm_90, with every kernel bound to threads and no local-memory spills.

No GPU is needed (nothing runs); the math of the same PrimFuncs is tested on LLVM elsewhere.
"""

import functools

import pytest

from samples import broadcast_variant, implemented_ops, sample
from tvmgrad import registry
from tvmgrad.build import compile_plans
from tvmgrad.call import bind
from tvmgrad.cuda import compile_cubin, device_source, nvcc_path
from tvmgrad.targets import resolve

from harness import cast

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")]

DTYPES = ("float32", "float16", "bfloat16", "float64")
ARCHS = ("sm_80", "sm_90")


def _plans():
    plans = []
    for op in implemented_ops():
        entry = registry.get(op)
        calls = [sample(op)]
        variant = broadcast_variant(op)
        if variant is not None:
            calls.append(variant)
        for dtype in DTYPES:
            for inputs, attrs in calls:
                call = bind(entry.spec, {k: cast(v, dtype) for k, v in inputs.items()}, attrs)
                plans.append((op, dtype, entry.impl.plan(call, registry.infer_outputs(entry, call))))
    return plans


@functools.cache
def _library():
    plans = _plans()
    ex = compile_plans([p for _, _, p in plans], resolve({"kind": "cuda", "arch": "sm_80"}))
    source = device_source(ex)
    return plans, source, {arch: compile_cubin(source, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_to_cubin_without_spills(arch):
    plans, source, cubins = _library()
    stats = cubins[arch].kernels
    assert cubins[arch].data[:4] == b"\x7fELF", "nvcc did not produce a cubin"
    for op, dtype, plan in plans:
        kernels = [s for name, s in stats.items() if name.startswith(plan.symbol + "_kernel")]
        assert kernels, f"{op} [{dtype}]: no kernel {plan.symbol}_kernel* in the {arch} cubin"
        for k in kernels:
            assert k.arch == arch
            assert k.registers > 0, f"{k.name}: ptxas reported no register use"
            assert not k.spills, f"{k.name} ({op}, {dtype}) spills on {arch}: {k}"


def test_every_op_is_covered():
    plans, _, _ = _library()
    covered = {op for op, _, _ in plans}
    assert covered == set(implemented_ops())
    assert {d for _, d, _ in plans} == set(DTYPES)
