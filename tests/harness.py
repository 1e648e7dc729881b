"""Shared test machinery: run an op in tvmgrad and in Paddle 3.3.1 and compare.

Paddle is the oracle. Its CPU build registers most grads for float32/float64 only; for float16
and bfloat16 the oracle runs Paddle in float32 on the (already rounded) half inputs and rounds
the result, which is what Paddle's GPU kernels do (they compute half types in float32).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

import tvmgrad
from tvmgrad.examples import cast, np_dtype  # noqa: F401  (shared with the package)
from tvmgrad.spec import load_specs

warnings.filterwarnings("ignore", module="paddle")

FLOATS = ("float32", "float64", "float16", "bfloat16")

# (rtol, atol) of tvmgrad vs the oracle, per dtype of the outputs.
TOL = {
    "float64": (1e-10, 1e-12),
    "float32": (2e-5, 1e-6),
    "float16": (2e-3, 2e-4),
    "bfloat16": (1.6e-2, 1e-3),
}

_rng = np.random.default_rng(0)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------------------------------------
# Paddle

def _paddle():
    import paddle
    paddle.set_device("cpu")
    return paddle


def to_paddle(value, dtype: str | None = None):
    """numpy (incl. ml_dtypes bfloat16) -> paddle Tensor of the same dtype (or ``dtype``)."""
    paddle = _paddle()
    if value is None:
        return None
    if isinstance(value, list):
        return [to_paddle(v, dtype) for v in value]
    value = np.asarray(value)
    if value.dtype == np_dtype("bfloat16"):
        return paddle.to_tensor(value.astype(np.float32)).astype("bfloat16")
    t = paddle.to_tensor(value)
    return t.astype(dtype) if dtype and value.dtype.kind == "f" else t


def from_paddle(t):
    if t is None:
        return None
    if isinstance(t, (list, tuple)):
        return [from_paddle(x) for x in t]
    if str(t.dtype).endswith("bfloat16"):
        return t.astype("float32").numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def c_ops(op: str, inputs: dict, attrs: dict) -> dict:
    """Call ``paddle._C_ops.<op>`` with the YAML args in YAML order; outputs by YAML name."""
    paddle = _paddle()
    spec = load_specs()[op]
    full_attrs = {**spec.defaults, **(attrs or {})}
    args = []
    for p in spec.args:
        args.append(to_paddle(inputs.get(p.name)) if p.is_tensor else full_attrs[p.name])
    result = getattr(paddle._C_ops, op)(*args)
    if not isinstance(result, (list, tuple)) or spec.outputs[0].is_list and len(spec.outputs) == 1:
        result = (result,)
    return {o.name: from_paddle(r) for o, r in zip(spec.outputs, result)}


def oracle_outputs(op: str, inputs: dict, attrs: dict | None, oracle=None) -> dict:
    """Paddle's outputs for these (already cast) inputs; half types via float32 (see module doc)."""
    def call(arrays):
        return c_ops(op, arrays, attrs or {}) if oracle is None else oracle(arrays, attrs or {})

    half = _half_dtype(inputs)
    if half is None:
        return call(inputs)
    out = call({k: cast(v, "float32") for k, v in inputs.items()})
    return {k: cast(v, half) for k, v in out.items()}


def _half_dtype(inputs: dict) -> str | None:
    for v in inputs.values():
        for a in (v if isinstance(v, list) else [v]):
            if a is not None and np.asarray(a).dtype in (np.dtype(np.float16), np_dtype("bfloat16")):
                return np.asarray(a).dtype.name
    return None


# ------------------------------------------------------------------------------------------
# Comparison

def assert_close(name: str, got, want, dtype: str, rtol=None, atol=None) -> None:
    """Equal shapes and dtypes, NaN where the oracle has NaN, values within tolerance."""
    if want is None:
        assert got is None, f"{name}: expected no output"
        return
    assert got is not None, f"{name}: output missing"
    if isinstance(want, list):
        assert len(got) == len(want), name
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(f"{name}[{i}]", g, w, dtype, rtol, atol)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    d_rtol, d_atol = TOL.get(dtype, TOL["float32"])
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_allclose(g64, w64, rtol=rtol if rtol is not None else d_rtol,
                               atol=atol if atol is not None else d_atol, equal_nan=True,
                               err_msg=f"output {name}")


def check(op: str, inputs: dict, attrs: dict | None = None, dtype: str = "float32", *,
          oracle=None, rtol=None, atol=None, outputs=None) -> dict:
    """Run ``op`` in tvmgrad and in the oracle on ``inputs`` cast to ``dtype``; compare outputs.

    ``oracle(inputs, attrs) -> {output: array}`` replaces ``paddle._C_ops.<op>`` (for ops that have
    no binding, e.g. double grads via ``paddle.grad``). ``outputs`` limits the compared outputs.
    """
    cast_inputs = {k: cast(v, dtype) for k, v in inputs.items()}
    ours = tvmgrad.run(op, cast_inputs, attrs)
    want = oracle_outputs(op, cast_inputs, attrs, oracle)
    for name in outputs or want:
        assert_close(f"{op}.{name}[{dtype}]", ours[name], want[name], dtype, rtol, atol)
    return ours


def pgrad(ys, xs, cotangents, create_graph=False):
    """``paddle.grad`` where an input the outputs do not depend on gets a zero gradient."""
    paddle = _paddle()
    ys = ys if isinstance(ys, (list, tuple)) else [ys]
    cotangents = cotangents if isinstance(cotangents, (list, tuple)) else [cotangents]
    pairs = [(y, c) for y, c in zip(ys, cotangents) if c is not None]
    grads = paddle.grad([y for y, _ in pairs], xs, [c for _, c in pairs],
                        create_graph=create_graph, allow_unused=True)
    return [paddle.zeros_like(x) if g is None else g for x, g in zip(xs, grads)]


def leaf(array):
    """A paddle leaf tensor that requires grad."""
    t = to_paddle(array)
    t.stop_gradient = False
    return t


# ------------------------------------------------------------------------------------------
# Higher-order grads: Paddle's own double/triple-grad kernels through autograd.

def _autograd(op: str, tensors: dict, attrs: dict, create_graph: bool) -> dict:
    """Outputs of higher-order grad ``op`` (paddle tensors), given paddle tensors by YAML name."""
    specs = load_specs()
    spec = specs[op]
    fwd = spec.forward
    fwd_spec = specs[fwd.name]
    # forward-signature names -> the grad op's own YAML arg names (positional)
    sig_to_yaml = {sp.name: yp.name for sp, yp in zip(fwd.params, fwd_spec.args)}
    arrays = {}
    for sp in fwd.params:
        if sp.is_tensor and sp.name in tensors:
            arrays[sig_to_yaml[sp.name]] = tensors[sp.name]
    fwd_attrs = {sig_to_yaml[sp.name]: attrs[sp.name] for sp in fwd.params
                 if not sp.is_tensor and sp.name in attrs}
    leaves, outs = _forward_outputs_tensors(fwd.name, arrays, fwd_attrs)
    ys, cots = [], []
    for o_sig, o_yaml in zip(fwd.outputs, fwd_spec.output_names):
        cot = tensors.get(f"{o_sig.name}_grad")
        if cot is not None and outs.get(o_yaml) is not None:
            ys.append(outs[o_yaml])
            cots.append(cot)
    wrt = [sp.name for sp in fwd.params if sp.is_tensor and sig_to_yaml[sp.name] in leaves]
    grads = pgrad(ys, [leaves[sig_to_yaml[n]] for n in wrt], cots, create_graph=create_graph)
    by_name = dict(zip(wrt, grads))
    return {o.name: by_name.get(o.name[: -len("_grad")]) for o in spec.outputs}


def _forward_outputs_tensors(grad_op: str, tensors: dict, attrs: dict):
    """Like _forward_outputs, for inputs that are already paddle tensors (kept as the leaves)."""
    paddle = _paddle()
    spec = load_specs()[grad_op]
    full_attrs = {**spec.defaults, **attrs}
    args = [tensors.get(p.name) if p.is_tensor else full_attrs[p.name] for p in spec.args]
    if hasattr(paddle._C_ops, grad_op):
        result = getattr(paddle._C_ops, grad_op)(*args)
        result = result if isinstance(result, (list, tuple)) else (result,)
        return tensors, dict(zip(spec.output_names, result))
    return tensors, _autograd(grad_op, tensors, full_attrs, create_graph=True)


def autograd_oracle(op: str, extra=None):
    """An oracle for a higher-order grad ``op`` (e.g. tanh_double_grad) from Paddle's autograd.

    The op's YAML ``forward:`` names the grad it differentiates; its inputs named like that
    grad's inputs are the primals, its ``<output>_grad`` inputs the cotangents, and its outputs
    ``<input>_grad`` the results. ``extra(inputs, attrs) -> dict`` supplies primals the op does
    not take (e.g. ``out = elu(x)`` for elu_double_grad), by forward-signature name.
    """
    def oracle(inputs: dict, attrs: dict) -> dict:
        paddle = _paddle()
        tensors = {}
        for name, value in {**inputs, **(extra(inputs, attrs) if extra else {})}.items():
            if value is None:
                continue
            t = to_paddle(value)
            t.stop_gradient = False
            tensors[name] = t
        spec = load_specs()[op]
        full_attrs = {**spec.defaults, **attrs}
        outs = _autograd(op, tensors, full_attrs, create_graph=False)
        del paddle
        return {k: from_paddle(v) for k, v in outs.items()}
    return oracle


# complex/integer/bool data, as the indexing and shape tests check them
CPLX = ("complex64", "complex128")
INTLIKE = ("bool", "int8", "uint8", "int16", "int32", "int64")


def in_child_process(module: str, function: str):
    """``function()`` of test module ``module`` run in a child Python process, its JSON-able result
    returned: a kernel that dies of a signal (a size-0 extent dividing by zero: SIGFPE) then fails
    the calling test instead of killing the test session."""
    import json
    import subprocess
    import sys
    code = (f"import json, sys; sys.path.insert(0, 'tests'); import {module}; "
            f"print(json.dumps({module}.{function}()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, f"child died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def data(dtype, *shape, seed=0):
    """Values of ``dtype``: complex with nonzero imaginary parts, integers in [-100, 100] (uint8:
    [0, 100]; sums of them wrap in int8/uint8), bools half True."""
    r = rng(seed)
    if dtype in CPLX:
        return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)
    if dtype == "bool":
        return r.random(shape) > 0.5
    return r.integers(0 if dtype == "uint8" else -100, 101, shape).astype(dtype)


def agree(name, got, want):
    """Exact equality for integer/bool results, a tight tolerance for complex ones."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    if got.dtype.kind == "c":
        tol = 2e-6 if got.dtype == np.complex64 else 1e-14
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def extra_dtypes(op):
    """op's complex/integer/bool dtypes (those Paddle registers for it; of an invoke op, the
    forward op's)."""
    return [d for d in CPLX + INTLIKE if d in tvmgrad.registry.get(op).implementation.dtypes]


def scheduled(op: str, inputs: dict, attrs: dict | None = None, cpu: str | None = None):
    """(planned call, scheduled TIR as TVMScript) of ``op``'s LLVM kernel for these inputs, for
    ``llvm:<cpu>`` (the host's target when None): what the schedule tests read."""
    from tvmgrad.build import lower
    from tvmgrad.planning import plan_call
    planned = plan_call(op, inputs, attrs, target=f"llvm:{cpu}" if cpu else "llvm")
    return planned, lower(planned.plan, planned.target).script()


def micro_kernel_rows(script: str) -> set[str]:
    """The row counts of the register-blocked micro-kernels in a scheduled script: each
    contraction's update block, under its unrolled rows and vectorised lanes."""
    import re
    return set(re.findall(r"T\.unroll\((\d+)\):\s*for \w+ in T\.vectorized\(\d+\):\s*"
                          r"with T\.sblock\(\"\w+_update\"\)", script))
