"""tvmgrad's backward ops as PyTorch operators: ``torch.ops.tvmgrad.<op>``.

``register()`` defines one ``torch.library`` op per implemented backward op, its schema derived
from the op's YAML spec, its CPU (and CUDA) kernel calling ``tvmgrad.run`` on the torch tensors
(by DLPack, no copies), and its fake kernel running our InferMeta on the tensors' shapes and
dtypes, so the ops trace into ``torch.compile`` graphs. torch is imported only here, and only
when ``register`` runs: tvmgrad itself never needs torch.

The schema convention (``schema(op)`` shows it):

* arguments in YAML order, tensors and attributes alike; ``Tensor`` / ``Tensor[]``, and
  ``Tensor?`` / ``Tensor[]?`` for optional inputs (None: absent);
* attributes: int, int64_t -> ``int``; float, double -> ``float``; bool; str; Scalar;
  int[], int64_t[], IntArray -> ``int[]``; float[]; str[]; DataType -> ``ScalarType`` (a torch
  dtype); each with its YAML default. A default the schema language cannot spell (inf, a list of
  strings, a dtype) makes the argument optional: ``float? x=None``, where None means the YAML
  default;
* the first argument with a default that some argument without one follows starts the
  keyword-only arguments (``*``); an optional tensor before that point is positional without a
  default (pass None), as in aten's own backward ops;
* outputs: the YAML outputs in order, unnamed (one output: a Tensor, several: a tuple);
  ``Tensor[]`` outputs are lists; an op with optional inputs returns ``Tensor?`` (None for an
  output it does not produce), any other op plain ``Tensor``.
"""

from __future__ import annotations

import math

from . import registry, rt
from .call import bind
from .dtypes import dtype as as_dtype
from .infer_meta import TensorMeta

__all__ = ["register", "registered", "skipped", "schema"]

NAMESPACE = "tvmgrad"

_ATTR_TYPES = {"int": "int", "int64_t": "int", "float": "float", "double": "float", "bool": "bool",
               "str": "str", "Scalar": "Scalar", "IntArray": "int[]", "int[]": "int[]",
               "int64_t[]": "int[]", "float[]": "float[]", "double[]": "float[]",
               "str[]": "str[]", "DataType": "ScalarType"}

_LIB = None
_REGISTERED: dict[str, str] = {}        # op -> its schema
_SKIPPED: dict[str, str] = {}           # op -> why it has no torch op


def _default_text(torch_type: str, value) -> str | None:
    """The schema spelling of a YAML default, None where the schema language has none."""
    if torch_type == "bool":
        return str(bool(value)) if isinstance(value, bool) else None
    if torch_type == "int":
        return str(value) if isinstance(value, int) and not isinstance(value, bool) \
            and -2**63 <= value < 2**63 else None
    if torch_type == "float":
        return repr(float(value)) if isinstance(value, (int, float)) and math.isfinite(value) else None
    if torch_type == "Scalar":
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return repr(value)
        return None
    if torch_type == "str":
        if isinstance(value, str) and '"' not in value and "\\" not in value:
            return f'"{value}"'
        return None
    if torch_type in ("int[]", "float[]") and isinstance(value, (tuple, list)):
        elem = "int" if torch_type == "int[]" else "float"
        parts = [_default_text(elem, v) for v in value]
        return None if None in parts else "[" + ", ".join(parts) + "]"
    return None                          # str[], ScalarType: no spelled default


def _arguments(spec) -> list[tuple[str, str, str | None, bool]]:
    """(name, schema type, default text or None, kwarg_only) per YAML argument."""
    defaults = spec.defaults
    items = []                            # (name, type, default, hard: no default possible)
    for p in spec.args:
        if p.is_tensor:
            optional = p.name in spec.optional
            t = ("Tensor[]" if p.is_tensor_list else "Tensor") + ("?" if optional else "")
            items.append([p.name, t, "None" if optional else None, not optional])
            continue
        t = _ATTR_TYPES.get(p.base_type)
        if t is None:
            raise TypeError(f"attribute {p.name!r} has type {p.type}, which a torch schema "
                            f"cannot take")
        if p.name not in defaults:
            items.append([p.name, t, None, True])
            continue
        text = _default_text(t, defaults[p.name]) if defaults[p.name] is not None else None
        if text is None:                  # None stands for the YAML default
            t, text = t + "?", "None"
        items.append([p.name, t, text, False])
    hard_after = [any(it[3] for it in items[i + 1:]) for i in range(len(items))]
    cut = next((i for i, it in enumerate(items)
                if not it[1].startswith("Tensor") and it[2] is not None and hard_after[i]),
               len(items))
    out = []
    for i, (name, t, default, _) in enumerate(items):
        kwarg_only = i >= cut
        if not kwarg_only and t.startswith("Tensor") and default is not None and hard_after[i]:
            default = None                # an optional tensor others follow: pass None
        out.append((name, t, default, kwarg_only))
    return out


def _returns(spec) -> list[str]:
    single = "Tensor?" if spec.optional else "Tensor"
    return ["Tensor[]" if o.is_list else single for o in spec.outputs]


def schema(op: str) -> str:
    """The torch schema (without the op name) of backward op ``op``."""
    spec = registry.get(op).spec
    parts, star = [], False
    for name, t, default, kwarg_only in _arguments(spec):
        if kwarg_only and not star:
            parts.append("*")
            star = True
        parts.append(f"{t} {name}" + (f"={default}" if default is not None else ""))
    rets = _returns(spec)
    ret = rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"
    return f"({', '.join(parts)}) -> {ret}"


_TENSOR, _LIST, _DTYPE, _ATTR = range(4)


def _params(spec) -> tuple:
    """(name, kind) per YAML argument: how ``_split`` hands it to tvmgrad (computed once)."""
    return tuple((p.name, (_LIST if p.is_tensor_list else _TENSOR) if p.is_tensor
                  else _DTYPE if p.base_type == "DataType" else _ATTR) for p in spec.args)


def _split(params, names, args, kwargs) -> tuple[dict, dict]:
    """The dispatcher's arguments as tvmgrad's inputs and attrs (None: absent / YAML default)."""
    values = dict(zip(names, args))
    if kwargs:
        values.update(kwargs)
    inputs, attrs = {}, {}
    for name, kind in params:
        value = values.get(name)
        if value is None:
            continue
        if kind == _TENSOR:
            inputs[name] = value
        elif kind == _LIST:
            inputs[name] = list(value)
        elif kind == _DTYPE:
            attrs[name] = as_dtype(value).name
        else:
            attrs[name] = value
    return inputs, attrs


def _outputs(op: str, spec, results: dict, convert):
    out = []
    for o, kind in zip(spec.outputs, _returns(spec)):
        value = results.get(o.name)
        if value is None:
            if kind == "Tensor":
                raise RuntimeError(f"{op}: output {o.name!r} was not produced, but the op's torch "
                                   f"schema returns a Tensor")
            out.append([] if o.is_list else None)
        elif o.is_list:
            out.append([convert(v) for v in value])
        else:
            out.append(convert(value))
    return out[0] if len(out) == 1 else tuple(out)


def _as_torch(value):
    if type(value).__module__ == "torch":             # (torch.Tensor; import-free check)
        return value
    import torch
    if isinstance(value, torch.Tensor):
        return value
    return torch.from_dlpack(value) if hasattr(value, "__dlpack__") else torch.as_tensor(value)


def _kernel(op: str, spec, names: list[str], target: str):
    from .runtime import run
    params = _params(spec)
    outputs = [o.name for o in spec.outputs]
    simple = len(outputs) == 1 and not spec.outputs[0].is_list and not spec.optional

    def kernel(*args, **kwargs):
        inputs, attrs = _split(params, names, args, kwargs)
        results = run(op, inputs, attrs, target=target)
        if simple and results[outputs[0]] is not None:    # the common case, without the checks
            return _as_torch(results[outputs[0]])
        return _outputs(op, spec, results, _as_torch)
    kernel.__name__ = f"{op}_{target}"
    return kernel


def _fake(op: str, entry, names: list[str]):
    """The fake (meta) kernel: our InferMeta on the tensors' shapes and dtypes."""
    import torch
    spec = entry.spec
    params = _params(spec)

    def fake(*args, **kwargs):
        inputs, attrs = _split(params, names, args, kwargs)
        device = None
        metas = {}
        for name, value in inputs.items():
            tensors = value if isinstance(value, list) else [value]
            if device is None and tensors:
                device = tensors[0].device
            m = [TensorMeta(tuple(t.shape), t.dtype) for t in tensors]
            metas[name] = m if isinstance(value, list) else m[0]
        call = bind(spec, metas, attrs, metas_only=True)
        outs = registry.infer_outputs(entry, call)
        results = {o.name: m for o, m in zip(spec.outputs, outs)}

        def empty(meta):
            return torch.empty(meta.shape, dtype=rt.torch_dtype(meta.dtype), device=device)
        return _outputs(op, spec, results, empty)
    fake.__name__ = f"{op}_fake"
    return fake


def _backward_ops() -> list[str]:
    return [name for name, op in registry.ops().items() if op.available and not op.is_forward]


def register(ops=None) -> list[str]:
    """Define ``torch.ops.tvmgrad.<op>`` for each backward op in ``ops`` (default: every
    implemented one); idempotent. Returns the ops registered by this call; ops whose schema
    torch cannot express are left out and listed by ``skipped()``."""
    import torch
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library(NAMESPACE, "DEF")
    names = _backward_ops() if ops is None else [ops] if isinstance(ops, str) else list(ops)
    done = []
    for op in names:
        if op in _REGISTERED:
            continue
        entry = registry.get(op)
        if not entry.available:
            raise NotImplementedError(f"{op}: listed in backward.yaml but not implemented yet")
        try:
            text = schema(op)
            _LIB.define(op + text)
        except Exception as exc:  # noqa: BLE001 - torch's schema parser rejects it: skip the op
            _SKIPPED[op] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
            continue
        arg_names = [a[0] for a in _arguments(entry.spec)]
        _LIB.impl(op, _kernel(op, entry.spec, arg_names, "llvm"), "CPU")
        _LIB.impl(op, _kernel(op, entry.spec, arg_names, "cuda"), "CUDA")
        torch.library.register_fake(f"{NAMESPACE}::{op}", _fake(op, entry, arg_names), lib=_LIB)
        _REGISTERED[op] = text
        _SKIPPED.pop(op, None)
        done.append(op)
    return done


def registered() -> dict[str, str]:
    """The ops registered so far: op -> torch schema."""
    return dict(_REGISTERED)


def skipped() -> dict[str, str]:
    """The ops ``register`` could not define: op -> the reason."""
    return dict(_SKIPPED)
