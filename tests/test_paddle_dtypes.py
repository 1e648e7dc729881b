"""The Paddle dtype audit: tvmgrad/paddle_dtypes.json against the registry and the installed Paddle.

tvmgrad/paddle_dtypes.json (written by scripts/paddle_dtypes.py) lists, for every backward op, the
phi kernel that implements it in Paddle and the dtypes Paddle registers for that kernel on the CPU
(the installed paddle) and the GPU (PD_REGISTER_KERNEL(<kernel>, GPU|GPUDNN, ...) in Paddle's
source, commit per file in gpu_source). The goal is that tvmgrad accepts every float and complex
dtype either backend registers; the gaps that remain are listed here exactly, so closing one
(adding the dtype to the op's te_defs ``dtypes``) or opening one fails until the list is edited.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import numpy as np
import pytest

from tvmgrad import examples, registry
from tvmgrad.call import bind

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE_PATH = ROOT / "tvmgrad" / "paddle_dtypes.json"
TABLE = json.loads(TABLE_PATH.read_text())

FLOATLIKE = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
INTLIKE = {"bool", "int8", "uint8", "int16", "int32", "int64"}

# Registered by Paddle but unreachable through the kernel key, so not demanded: eig_grad's kernel is
# selected by out_v's dtype (YAML ``data_type: out_v``), which is always complex; its float32/float64
# registrations are never chosen (tvmgrad's eig_grad takes the complex out_w/out_v, as Paddle does).
UNREACHABLE = {
    "eig_grad": {"float32", "float64"},
}

# Float/complex dtypes Paddle registers (CPU and/or GPU) that tvmgrad rejects today, by the te_defs
# module that implements the op (for invoke ops: the forward op's module). "CPU only" marks dtypes
# the installed paddle registers on the CPU but the GPU source read does not (that source may be an
# older version than 3.3.1: see gpu_source); the rest are registered on both. None today: every
# float and complex dtype Paddle registers is accepted.
KNOWN_GAPS: dict = {}

# Integer/bool dtypes Paddle registers that tvmgrad rejects: none. tvmgrad's dtype layer knows them
# (tvmgrad/dtypes.py: bool, int8..int64); the indexing, shape and linear (concat/stack/expand/...)
# grads, fill_grad, global_gather/scatter_grad, view_dtype_grad, the pointwise binary/elementary/
# conj grads, the pow grads (te_defs/_powers.py), the scan and sort/select grads, reduce_as,
# segment_pool, cross/dot/kron/trace, unpool3d, roi_align/roi_pool and overlap_add
# (tests/test_int_dtypes.py) take them.
KNOWN_INT_GAPS: dict = {}

# Dtypes beyond the float/complex and integer ones (float8): none open. tvmgrad's dtype layer stores
# float8 as uint8 bits, for the data-movement grads Paddle registers it for (tests/test_float8.py).
KNOWN_OTHER_GAPS: dict = {}


def _script():
    spec = importlib.util.spec_from_file_location("paddle_dtypes", ROOT / "scripts" / "paddle_dtypes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _backward_ops():
    return {name: op for name, op in registry.ops().items() if not op.is_forward}


def _gaps() -> dict[str, set]:
    """op -> dtypes registered by Paddle (CPU or GPU, after dtype_map) that tvmgrad rejects."""
    out = {}
    for name, entry in TABLE["ops"].items():
        accepted = set(registry.get(name).implementation.dtypes)
        mapping = entry.get("dtype_map") or {}
        registered = set(entry["cpu"]) | set(entry["gpu"] or [])
        rejected = {d for d in registered if mapping.get(d, d) not in accepted}
        if rejected:
            out[name] = rejected
    return out


def _split(gaps, keep):
    out = {}
    for op, dts in gaps.items():
        sel = {d for d in dts if keep(d)} - UNREACHABLE.get(op, set())
        if sel:
            out[op] = sel
    return out


def _diff(actual, listed):
    lines = []
    for op in sorted(set(actual) | set(listed)):
        new, closed = actual.get(op, set()) - listed.get(op, set()), listed.get(op, set()) - actual.get(op, set())
        if new:
            lines.append(f"{op}: new gap {sorted(new)} (tvmgrad rejects a dtype Paddle registers)")
        if closed:
            lines.append(f"{op}: {sorted(closed)} is listed but no longer a gap: remove it from the list")
    return "\n".join(lines)


def test_the_table_covers_every_backward_op():
    ops = _backward_ops()
    assert len(ops) > 200
    missing, stale = set(ops) - set(TABLE["ops"]), set(TABLE["ops"]) - set(ops)
    assert not missing and not stale, (f"paddle_dtypes.json is out of date (missing {sorted(missing)}, "
                                       f"stale {sorted(stale)}): run scripts/paddle_dtypes.py")
    script = _script()
    for name, op in ops.items():
        kernel, how = script.kernel_of(op)
        entry = TABLE["ops"][name]
        assert (entry["kernel"], entry["kernel_from"]) == (kernel, how), name
        assert entry.get("dtype_map") == script.dtype_map(op), name


def test_every_entry_is_well_formed():
    names = FLOATLIKE | INTLIKE | {"float8_e4m3fn", "float8_e5m2"}
    for name, entry in TABLE["ops"].items():
        assert set(entry["cpu"]) <= names, name
        if entry["gpu"] is None:
            assert entry.get("gpu_reason"), f"{name}: no GPU list and no reason"
        else:
            assert set(entry["gpu"]) <= names, name
            for source in entry["gpu_source"].split("; "):
                assert re.fullmatch(r"paddle/[\w/.+-]+@[0-9a-f]{40}", source), (name, source)
    with_gpu = sum(e["gpu"] is not None for e in TABLE["ops"].values())
    assert with_gpu >= 250, with_gpu


def test_the_cpu_column_is_what_the_installed_paddle_registers():
    pytest.importorskip("paddle")
    script = _script()
    core, version, commit = script.installed_paddle()
    cpu = script.cpu_registrations(core)
    assert TABLE["meta"]["paddle_version"] == version
    for name, entry in TABLE["ops"].items():
        if entry["kernel"] is None:
            assert entry["cpu"] == [], name
            continue
        reg = cpu.get(entry["kernel"], {"all": [], "strided": []})
        assert entry["cpu"] == reg["all"], name
        assert entry.get("cpu_strided", []) == reg["strided"], name


def test_the_file_is_what_the_script_writes():
    pytest.importorskip("paddle")
    script = _script()
    assert script.dump(script.build(None, TABLE)) == TABLE_PATH.read_text(), \
        "stale: run .venv/bin/python scripts/paddle_dtypes.py"


def test_every_float_and_complex_dtype_paddle_registers_is_accepted_or_a_known_gap():
    actual = _split(_gaps(), lambda d: d in FLOATLIKE)
    assert actual == KNOWN_GAPS, _diff(actual, KNOWN_GAPS)


def test_integer_and_other_gaps_are_listed_exactly():
    gaps = _gaps()
    ints = _split(gaps, lambda d: d in INTLIKE)
    other = _split(gaps, lambda d: d not in FLOATLIKE | INTLIKE)
    assert ints == KNOWN_INT_GAPS, _diff(ints, KNOWN_INT_GAPS)
    assert other == KNOWN_OTHER_GAPS, _diff(other, KNOWN_OTHER_GAPS)


def test_unreachable_registrations_are_registered_and_rejected():
    gaps = _gaps()
    for op, dts in UNREACHABLE.items():
        assert dts <= gaps.get(op, set()), op


def _plan(op, dtype):
    entry = registry.get(op)
    inputs, attrs = examples.sample(op)
    inputs = {k: examples.cast(v, dtype) for k, v in inputs.items()}
    arrays = [a for v in inputs.values() for a in (v if isinstance(v, list) else [v]) if a is not None]
    if not any(np.asarray(a).dtype == examples.np_dtype(dtype) for a in arrays):
        return None                        # the sample has no input castable to dtype
    call = bind(entry.spec, inputs, attrs)
    return entry.impl.plan(call, registry.infer_outputs(entry, call))


def test_the_listed_float_gaps_are_rejected_by_the_planner():
    """The declared dtypes are what the op enforces: a listed gap really raises TypeError."""
    tried = 0
    for op, dts in KNOWN_GAPS.items():
        for dtype in sorted(dts):
            try:
                if _plan(op, dtype) is None:
                    continue
            except TypeError:
                tried += 1
                continue
            raise AssertionError(f"{op} accepted {dtype}, which KNOWN_GAPS lists as rejected")
    assert tried >= len(KNOWN_GAPS), tried       # every listed op is really tried
