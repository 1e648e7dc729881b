"""The op registry: backward.yaml decides which ops exist, ``te_defs`` which are implemented.

An op is *implemented* when a ``te_defs`` module defines a builder named after it, *invoke* when
its YAML ``invoke:`` names an implemented forward op (``scale_grad`` -> ``scale``), otherwise
*missing*. Forward ops get their signatures from the YAML ``forward:`` lines that name them.
There is no other list of ops. ``check()`` is the start-up self-check.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
import re
from dataclasses import dataclass

from . import infer_meta as infer_meta_lib
from .call import BoundCall
from .families.base import OpImpl
from .spec import Call, InferMetaSpec, OpSpec, load_specs

__all__ = ["Op", "ops", "get", "check", "check_builder", "UnknownOpError", "infer_outputs"]


class UnknownOpError(ValueError):
    pass


@dataclass
class Op:
    spec: OpSpec
    impl: OpImpl | None              # the builder (for invoke ops: the forward op's)
    state: str                       # "implemented" | "invoke" | "missing"
    is_forward: bool = False         # a forward op some invoke names, not a backward.yaml entry
    forward_op: "Op | None" = None   # for invoke ops

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def family(self) -> str:
        if self.state == "invoke":
            return f"invoke:{self.forward_op.name}"
        return self.impl.family if self.impl else "-"

    @property
    def available(self) -> bool:
        return self.state in ("implemented", "invoke")

    @property
    def implementation(self) -> "OpImpl | None":
        """The TE implementation whose dtypes, family and examples describe this op's kernels
        (for an invoke op, the forward op's)."""
        return self.forward_op.impl if self.state == "invoke" else self.impl


def _discover() -> dict[str, OpImpl]:
    te_defs = importlib.import_module("tvmgrad.te_defs")
    impls: dict[str, OpImpl] = {}
    for mod_info in sorted(pkgutil.iter_modules(te_defs.__path__), key=lambda m: m.name):
        if mod_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"tvmgrad.te_defs.{mod_info.name}")
        for value in vars(module).values():
            if isinstance(value, OpImpl) and value.module == module.__name__:
                if value.name in impls:
                    raise RuntimeError(f"{value.name} is defined in both {impls[value.name].module} "
                                       f"and {value.module}")
                impls[value.name] = value
    return impls


def _forward_specs(specs: dict[str, OpSpec], impls: dict[str, OpImpl]) -> dict[str, OpSpec]:
    """Specs for forward ops that te_defs implements, from the YAML forward signatures."""
    found: dict[str, OpSpec] = {}
    for spec in specs.values():
        sig = spec.forward
        impl = impls.get(sig.name)
        if sig.name in specs or impl is None or sig.name in found:
            continue
        found[sig.name] = OpSpec(
            name=sig.name, forward=sig, args=sig.params, outputs=sig.outputs,
            infer_meta=InferMetaSpec(impl.infer_meta, _forward_infer_params(impl.infer_meta, sig))
            if impl.infer_meta else None,
            attr_defaults=tuple((p.name, p.default) for p in sig.params
                                if not p.is_tensor and p.has_default),
        )
    return found


def _forward_infer_params(name: str, sig) -> tuple[str, ...]:
    """A forward op's InferMeta takes all its args (``ExpandInferMeta(x, shape)``) or, when it
    has fewer parameters, just its tensors (``UnchangedInferMeta(x)``)."""
    import inspect
    fn = infer_meta_lib.get(name)
    if fn is not None and len(inspect.signature(fn).parameters) == len(sig.params):
        return tuple(p.name for p in sig.params)
    return tuple(p.name for p in sig.params if p.is_tensor)


@functools.cache
def ops() -> dict[str, Op]:
    """Every op: backward.yaml's, in file order, then forward ops that invokes name."""
    specs = load_specs()
    impls = _discover()
    table: dict[str, Op] = {}
    forwards = _forward_specs(specs, impls)
    for name, spec in forwards.items():
        table[name] = Op(spec, impls[name], "implemented", is_forward=True)
    result: dict[str, Op] = {}
    for name, spec in specs.items():
        if name in impls:
            result[name] = Op(spec, impls[name], "implemented")
        elif spec.invoke and spec.invoke.name in table:
            fwd = table[spec.invoke.name]
            result[name] = Op(spec, InvokeImpl(spec, fwd), "invoke", forward_op=fwd)
        else:
            result[name] = Op(spec, None, "missing")
    unknown = set(impls) - set(specs) - set(forwards)
    if unknown:
        raise RuntimeError(f"te_defs defines builders for ops backward.yaml does not list (as a "
                           f"backward op or a forward signature): {sorted(unknown)}")
    result.update(table)
    return result


def get(name: str) -> Op:
    table = ops()
    if not isinstance(name, str) or name not in table:
        close = difflib.get_close_matches(str(name), table, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownOpError(f"unknown op {name!r}{hint}")
    return table[name]


def check() -> list[str]:
    """Problems with the registry: builders that disagree with the YAML, missing InferMetas."""
    problems = []
    for op in ops().values():
        if op.state == "implemented":
            problems += check_builder(op.spec, op.impl)
    return problems


def check_builder(spec: OpSpec, impl: OpImpl) -> list[str]:
    """A builder must take the YAML args in YAML order (then ``ctx``, if it reads the build
    context) and have shape inference."""
    problems = []
    expected = tuple(p.name for p in spec.args)
    if impl.params not in (expected, expected + ("ctx",)):
        problems.append(f"{spec.name}: builder parameters {list(impl.params)} != YAML args "
                        f"{list(expected)}")
    im = spec.infer_meta.func if spec.infer_meta else impl.infer_meta
    if not im:
        problems.append(f"{spec.name}: no infer_meta in the YAML and none declared by the builder")
    elif infer_meta_lib.get(im) is None:
        problems.append(f"{spec.name}: InferMeta {im} is not implemented")
    return problems


# ------------------------------------------------------------------------------------------
# Shape inference and invoke ops

def infer_outputs(op: Op, call: BoundCall) -> list:
    """Output metas (None for an output that is not produced), in the op's output order."""
    if op.state == "invoke":
        return op.impl.infer(call)
    spec = op.spec
    im = spec.infer_meta or (InferMetaSpec(op.impl.infer_meta) if op.impl and op.impl.infer_meta else None)
    if im is None:
        raise RuntimeError(f"{spec.name}: no shape inference available")
    fn = infer_meta_lib.get(im.func)
    if fn is None:
        raise NotImplementedError(f"{spec.name}: InferMeta {im.func} is not implemented")
    params = im.param if im.param is not None else tuple(p.name for p in spec.args)
    try:
        metas = list(fn(*(call.value(p) for p in params)))
    except infer_meta_lib.MetaError as exc:
        # the InferMeta speaks of its own parameters (Pad3dInferMeta's x); the user passed the
        # op's YAML arguments (pad3d_double_grad's grad_x_grad)
        raise ValueError(f"{spec.name}: {rename_args(str(exc), _infer_renames(fn, params))}") \
            from None
    if len(metas) > len(spec.outputs):
        raise RuntimeError(f"{spec.name}: {im.func} gave {len(metas)} metas for "
                           f"{len(spec.outputs)} outputs")
    metas += [None] * (len(spec.outputs) - len(metas))
    return metas


def rename_args(text: str, renames: dict[str, str]) -> str:
    """``text`` with each argument name ``a`` of ``renames`` (as a word: ``'x'``, ``x[1]``,
    ``x's``) replaced by ``renames[a]``, all at once (a swap x <-> y stays a swap)."""
    names = {a: b for a, b in renames.items() if a != b}
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
                         + r")(?![\w])")
    return pattern.sub(lambda m: names[m.group(1)], text)


@functools.lru_cache(maxsize=None)
def _infer_params(fn) -> tuple[str, ...]:
    import inspect
    return tuple(inspect.signature(fn).parameters)


def _infer_renames(fn, params) -> dict[str, str]:
    """InferMeta parameter name -> the op argument the YAML passes to it."""
    return dict(zip(_infer_params(fn), params))


def _literal(text: str):
    t = text.strip()
    if t in ("true", "false"):
        return t == "true"
    num = t.rstrip("fF") if t[-1:] in "fF" and any(c.isdigit() for c in t) else t
    try:
        return int(num)
    except ValueError:
        return float(num)


class InvokeImpl(OpImpl):
    """An op defined as a call of a forward op (YAML ``invoke:``), with its arguments mapped."""

    family_kind = "invoke"

    def __init__(self, spec: OpSpec, forward: Op):
        self.spec, self.forward = spec, forward
        fwd = forward.impl
        self.fn, self.name, self.doc = fwd.fn, spec.name, f"invoke: {_call_text(spec.invoke)}"
        self.dtypes, self.infer_meta = fwd.dtypes, fwd.infer_meta
        self.source_file, self.module, self.params = fwd.source_file, fwd.module, fwd.params

    def _forward_call(self, call: BoundCall) -> tuple[BoundCall, dict[str, str]]:
        fwd_spec = self.forward.spec
        tensors, attrs, renames = {}, {}, {}
        for param, text in zip(fwd_spec.args, self.spec.invoke.args):
            if text in call.tensors:
                tensors[param.name] = call.tensors[text]
                renames[param.name] = text
            elif text in call.attrs:
                attrs[param.name] = call.attrs[text]
            else:
                attrs[param.name] = _literal(text)
        return BoundCall(fwd_spec, tensors, attrs, call.options), renames

    def _speak_for(self, exc: Exception, renames: dict[str, str]) -> Exception:
        """The forward op's error as this op's: its name, and the YAML names of this op's
        arguments in place of the forward's (``stack: x[1]`` -> ``unbind_grad: out_grad[1]``)."""
        fwd = self.forward.name
        text = str(exc)
        if text.startswith(f"{fwd}: "):
            text = text[len(fwd) + 2:]
        # the forward op named in the text (not a quoted attribute of the same name: scale's 'scale')
        text = re.sub(rf"(?<![\w.'\"]){re.escape(fwd)}(?![\w'\"])", self.name, text)
        text = rename_args(text, renames)
        try:
            new = type(exc)(f"{self.name}: {text}")
        except Exception:  # noqa: BLE001 - an exception type with another constructor
            new = (TypeError if isinstance(exc, TypeError) else ValueError)(f"{self.name}: {text}")
        return new

    def _renames(self) -> dict[str, str]:
        """forward argument name -> this op's YAML name (tensors and attributes)."""
        out = {}
        names = {p.name for p in self.spec.args}
        for param, text in zip(self.forward.spec.args, self.spec.invoke.args):
            if text in names:
                out[param.name] = text
        return out

    def infer(self, call: BoundCall) -> list:
        fwd_call, _ = self._forward_call(call)
        try:
            return infer_outputs(self.forward, fwd_call)
        except (ValueError, TypeError) as exc:
            raise self._speak_for(exc, self._renames()) from None

    def plan(self, call, outs):
        fwd_call, renames = self._forward_call(call)
        try:
            plan = self.forward.impl.plan(fwd_call, outs)
        except (ValueError, TypeError) as exc:
            raise self._speak_for(exc, self._renames()) from None
        out_names = dict(zip(self.forward.spec.output_names, self.spec.output_names))
        args = []
        for a in plan.args:
            if a.kind == "input":
                a = type(a)(a.kind, renames[a.name], a.index, a.shape, a.dtype, a.value)
            elif a.kind == "output":
                a = type(a)(a.kind, out_names[a.name], a.index, a.shape, a.dtype, a.value)
            args.append(a)
        plan.args = tuple(args)
        plan.aliases = {out_names[o]: (renames[i], shape) for o, (i, shape) in plan.aliases.items()}
        return plan


def _call_text(call: Call) -> str:
    return f"{call.name}({', '.join(call.args)})"
