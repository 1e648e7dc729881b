"""CUDA build checks the tests share: plan calls for CUDA, compile them with nvcc to cubin and
assert what ptxas reports (every kernel there, using registers, not spilling)."""

import pytest

from tvmgrad import registry
from tvmgrad.build import compile_lowered, lower
from tvmgrad.call import bind
from tvmgrad.cuda import compile_cubin, device_source, nvcc_path
from tvmgrad.targets import resolve

ARCHS = ("sm_80", "sm_90")


def cuda_target():
    if nvcc_path() is None:
        pytest.fail("nvcc is needed for the CUDA build checks (the cuda marker deselects them)")
    return resolve({"kind": "cuda", "arch": "sm_80"})


def plans_of(calls, **options) -> list:
    """[(op, plan)] of ``calls`` [(op, inputs, attrs)] that have a kernel (``options`` as bind's)."""
    out = []
    for op, inputs, attrs in calls:
        entry = registry.get(op)
        call = bind(entry.spec, inputs, attrs, **options)
        plan = entry.impl.plan(call, registry.infer_outputs(entry, call))
        if plan.make is not None:
            out.append((op, plan))
    return out


def cuda_source(plans) -> str:
    """The CUDA source of the plans' kernels (a kernel shared by several plans once)."""
    target = cuda_target()
    funcs = {}
    for _, plan in plans:
        if plan.symbol not in funcs:
            funcs[plan.symbol] = lower(plan, target)["main"]
    return device_source(compile_lowered(funcs, target)) if funcs else ""


def kernels_of(stats: dict, symbol: str) -> dict:
    """The cubin kernels of one plan (TVM names them ``<symbol>_kernel...``)."""
    return {k: s for k, s in stats.items() if k.startswith(symbol + "_kernel")}


def assert_compiles_without_spills(plans, archs=ARCHS) -> None:
    """Every plan's kernels are in the cubin for each arch, use registers and do not spill."""
    assert plans
    source = cuda_source(plans)
    for arch in archs:
        cubin = compile_cubin(source, arch)
        assert cubin.data[:4] == b"\x7fELF", "nvcc did not produce a cubin"
        for op, plan in plans:
            kernels = kernels_of(cubin.kernels, plan.symbol)
            assert kernels, f"{op}: no kernel {plan.symbol} on {arch}"
            for name, k in kernels.items():
                assert k.registers > 0 and not k.spills, f"{op} on {arch}: {name} {k}"
