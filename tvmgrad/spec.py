"""Paddle's ``backward.yaml`` grammar, parsed into typed, immutable op specs.

Knows nothing about TVM. Every key of an entry is either understood here or rejected, so that a
new Paddle release with new keys fails loudly instead of being half-read.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

__all__ = [
    "SpecError", "Param", "Output", "Signature", "Call", "InferMetaSpec", "KernelSpec", "OpSpec",
    "parse_params", "parse_outputs", "parse_signature", "parse_call", "parse_entry", "load_specs",
]


class SpecError(ValueError):
    """A malformed or unknown construct in backward.yaml."""


NO_DEFAULT = object()

# Types seen in Paddle's signatures. "Scalar(int)" style qualifiers are accepted too.
TENSOR_TYPES = {"Tensor", "Tensor[]"}
ATTR_TYPES = {
    "int", "int64_t", "float", "double", "bool", "str", "Scalar", "IntArray", "DataType", "Place",
    "int[]", "int64_t[]", "float[]", "double[]", "bool[]", "str[]", "Scalar[]",
}


@dataclass(frozen=True)
class Param:
    """One argument of a signature: ``Type name [= default]``."""

    type: str
    name: str
    default: Any = NO_DEFAULT

    @property
    def is_tensor(self) -> bool:
        return self.type in TENSOR_TYPES

    @property
    def is_tensor_list(self) -> bool:
        return self.type == "Tensor[]"

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    @property
    def base_type(self) -> str:
        """The type without a ``(...)`` qualifier: ``Scalar(int)`` -> ``Scalar``."""
        return self.type.split("(")[0]


@dataclass(frozen=True)
class Output:
    """One output: ``Tensor(name)`` or ``Tensor[](name){size expr}``."""

    name: str
    is_list: bool = False
    size: str | None = None


@dataclass(frozen=True)
class Signature:
    """A forward signature: ``name (params) -> outputs``."""

    name: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]


@dataclass(frozen=True)
class Call:
    """An ``invoke``/``composite`` expression: ``name(arg, arg, ...)`` with raw argument text."""

    name: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class InferMetaSpec:
    func: str
    param: tuple[str, ...] | None = None
    spmd_rule: str | None = None


@dataclass(frozen=True)
class KernelSpec:
    func: tuple[str, ...]
    param: tuple[str, ...] | None = None
    data_type: str | None = None


@dataclass(frozen=True)
class OpSpec:
    """Everything backward.yaml says about one backward op."""

    name: str
    forward: Signature
    args: tuple[Param, ...]
    outputs: tuple[Output, ...]
    infer_meta: InferMetaSpec | None = None
    kernel: KernelSpec | None = None
    inplace: tuple[tuple[str, str], ...] = ()          # (input, output) pairs
    optional: frozenset[str] = frozenset()
    no_need_buffer: frozenset[str] = frozenset()
    intermediate: frozenset[str] = frozenset()
    invoke: Call | None = None
    composite: Call | None = None
    backward: str | None = None
    data_transform: tuple[tuple[str, tuple[str, ...]], ...] = ()
    attr_defaults: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    @property
    def tensor_args(self) -> tuple[Param, ...]:
        return tuple(p for p in self.args if p.is_tensor)

    @property
    def attrs(self) -> tuple[Param, ...]:
        return tuple(p for p in self.args if not p.is_tensor)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    @property
    def defaults(self) -> dict[str, Any]:
        """Attribute defaults: the backward ``args`` first, else the ``forward`` signature."""
        return dict(self.attr_defaults)

    def arg(self, name: str) -> Param:
        for p in self.args:
            if p.name == name:
                return p
        raise KeyError(name)


# --------------------------------------------------------------------------------------------
# Grammar

def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, False, []
    for ch in text:
        if ch == '"':
            quote = not quote
        elif not quote and ch in "([{":
            depth += 1
        elif not quote and ch in ")]}":
            depth -= 1
            if depth < 0:
                raise SpecError(f"unbalanced brackets in {text!r}")
        if ch == sep and depth == 0 and not quote:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth or quote:
        raise SpecError(f"unbalanced brackets or quotes in {text!r}")
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fF]?$")


def _parse_value(text: str, type_: str) -> Any:
    """A C++ default literal as a Python value of the parameter's type."""
    text = text.strip()
    base = type_.split("(")[0]
    if base.endswith("[]") or base == "IntArray":
        if not (text.startswith("{") and text.endswith("}")):
            raise SpecError(f"list default {text!r} for {type_} must be {{...}}")
        inner = text[1:-1].strip()
        elem = {"IntArray": "int"}.get(base, base[:-2])
        return tuple(_parse_value(t, elem) for t in _split_top(inner)) if inner else ()
    if base == "bool":
        if text not in ("true", "false"):
            raise SpecError(f"bad bool default {text!r}")
        return text == "true"
    if base == "str":
        if not (len(text) >= 2 and text[0] == text[-1] == '"'):
            raise SpecError(f"bad string default {text!r}")
        return text[1:-1]
    if base == "DataType":
        if not text.startswith("DataType::"):
            raise SpecError(f"bad DataType default {text!r}")
        return text.split("::", 1)[1].lower()
    if base in ("int", "int64_t", "float", "double", "Scalar"):
        if not _NUMBER.match(text):
            raise SpecError(f"bad numeric default {text!r} for {type_}")
        num = text.rstrip("fF")
        if base in ("int", "int64_t"):
            if not re.match(r"^[+-]?\d+$", num):
                raise SpecError(f"bad integer default {text!r}")
            return int(num)
        if base == "Scalar" and re.match(r"^[+-]?\d+$", num):
            return int(num)
        return float(num)
    raise SpecError(f"no default literal grammar for type {type_!r}")


_PARAM = re.compile(r"^(?P<type>[A-Za-z_][\w:]*(\([\w]+\))?(\[\])?)\s+(?P<name>\w+)\s*(=\s*(?P<default>.+))?$")


def parse_params(text: str) -> tuple[Param, ...]:
    """``(Tensor x, float alpha=1.0, ...)`` -> Params."""
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        raise SpecError(f"parameter list must be parenthesised: {text!r}")
    params = []
    for piece in _split_top(text[1:-1]):
        m = _PARAM.match(piece)
        if not m:
            raise SpecError(f"malformed parameter {piece!r}")
        type_ = m.group("type")
        if type_.split("(")[0] not in TENSOR_TYPES | ATTR_TYPES:
            raise SpecError(f"unknown type {type_!r} in {piece!r}")
        default = m.group("default")
        params.append(Param(type_, m.group("name"),
                            NO_DEFAULT if default is None else _parse_value(default, type_)))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise SpecError(f"duplicate parameter names in {text!r}")
    return tuple(params)


_OUTPUT = re.compile(r"^Tensor\s*(?P<list>\[\])?\s*\(\s*(?P<name>\w+)\s*\)\s*(\{(?P<size>[^}]*)\})?$")


def parse_outputs(text: str) -> tuple[Output, ...]:
    """``Tensor(a), Tensor[](b){x.size()}`` -> Outputs."""
    outs = []
    for piece in _split_top(text):
        m = _OUTPUT.match(piece)
        if not m:
            raise SpecError(f"malformed output {piece!r}")
        outs.append(Output(m.group("name"), bool(m.group("list")),
                           m.group("size").strip() if m.group("size") else None))
    if not outs:
        raise SpecError(f"no outputs in {text!r}")
    return tuple(outs)


def parse_signature(text: str) -> Signature:
    """``name (params) -> outputs``."""
    m = re.match(r"^\s*(?P<name>\w+)\s*(?P<params>\(.*\))\s*->\s*(?P<outs>.+)$", text, re.S)
    if not m:
        raise SpecError(f"malformed signature {text!r}")
    return Signature(m.group("name"), parse_params(m.group("params")), parse_outputs(m.group("outs")))


def parse_call(text: str) -> Call:
    """``name(a, b, 0.0f)`` -> Call with raw argument strings."""
    m = re.match(r"^\s*(?P<name>\w+)\s*\((?P<args>.*)\)\s*$", text, re.S)
    if not m:
        raise SpecError(f"malformed call {text!r}")
    return Call(m.group("name"), tuple(_split_top(m.group("args"))))


def _name_list(value: Any) -> tuple[str, ...]:
    """``x, y`` or ``[x, y]`` -> names."""
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(v).strip() for v in value)
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _parse_inplace(value: Any) -> tuple[tuple[str, str], ...]:
    pairs = []
    for piece in _split_top(str(value)):
        m = re.match(r"^\(?\s*(\w+)\s*->\s*(\w+)\s*\)?$", piece)
        if not m:
            raise SpecError(f"malformed inplace {piece!r}")
        pairs.append((m.group(1), m.group(2)))
    return tuple(pairs)


_TOP_KEYS = {"backward_op", "forward", "args", "output", "infer_meta", "kernel", "inplace", "optional",
             "no_need_buffer", "intermediate", "invoke", "composite", "backward", "data_transform"}
_INFER_KEYS = {"func", "param", "spmd_rule"}
_KERNEL_KEYS = {"func", "param", "data_type"}
_TRANSFORM_KEYS = {"support_trans_dtype", "skip_transform"}


def _check_keys(where: str, got: dict, allowed: set[str]) -> None:
    unknown = set(got) - allowed
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {sorted(unknown)}")


def parse_entry(entry: dict) -> OpSpec:
    """One YAML mapping -> OpSpec, with every cross-reference checked."""
    name = entry.get("backward_op")
    if not name:
        raise SpecError(f"entry without backward_op: {entry!r}")
    try:
        _check_keys(name, entry, _TOP_KEYS)
        for key in ("forward", "args", "output"):
            if key not in entry:
                raise SpecError(f"missing {key!r}")
        forward = parse_signature(entry["forward"])
        args = parse_params(entry["args"])
        outputs = parse_outputs(entry["output"])
        arg_names = {p.name for p in args}
        out_names = {o.name for o in outputs}

        infer = None
        if "infer_meta" in entry:
            im = entry["infer_meta"]
            _check_keys(f"{name}.infer_meta", im, _INFER_KEYS)
            infer = InferMetaSpec(str(im["func"]).strip(),
                                  _name_list(im["param"]) if "param" in im else None,
                                  im.get("spmd_rule"))
        kernel = None
        if "kernel" in entry:
            k = entry["kernel"]
            _check_keys(f"{name}.kernel", k, _KERNEL_KEYS)
            kernel = KernelSpec(_name_list(k["func"]),
                                _name_list(k["param"]) if "param" in k else None,
                                str(k["data_type"]).strip() if "data_type" in k else None)

        inplace = _parse_inplace(entry["inplace"]) if "inplace" in entry else ()
        for src, dst in inplace:
            if src not in arg_names or dst not in out_names:
                raise SpecError(f"inplace ({src} -> {dst}) names no input/output")
        optional = frozenset(_name_list(entry.get("optional")))
        no_need_buffer = frozenset(_name_list(entry.get("no_need_buffer")))
        # optional may name inputs or outputs (an output that is not always produced).
        for group, names, known in (("optional", optional, arg_names | out_names),
                                    ("no_need_buffer", no_need_buffer, arg_names)):
            if names - known:
                raise SpecError(f"{group} names unknown args {sorted(names - known)}")
        intermediate = frozenset(_name_list(entry.get("intermediate")))

        transform = []
        if "data_transform" in entry:
            _check_keys(f"{name}.data_transform", entry["data_transform"], _TRANSFORM_KEYS)
            transform = [(k, _name_list(v)) for k, v in entry["data_transform"].items()]

        # Defaults: the backward args first, else the forward signature's.
        fwd_defaults = {p.name: p.default for p in forward.params if p.has_default}
        defaults = []
        for p in args:
            if p.is_tensor:
                continue
            if p.has_default:
                defaults.append((p.name, p.default))
            elif p.name in fwd_defaults:
                defaults.append((p.name, _parse_value_again(fwd_defaults[p.name], p.type)))

        return OpSpec(
            name=name, forward=forward, args=args, outputs=outputs, infer_meta=infer, kernel=kernel,
            inplace=inplace, optional=optional, no_need_buffer=no_need_buffer,
            intermediate=intermediate,
            invoke=parse_call(entry["invoke"]) if "invoke" in entry else None,
            composite=parse_call(entry["composite"]) if "composite" in entry else None,
            backward=str(entry["backward"]).strip() if "backward" in entry else None,
            data_transform=tuple(transform), attr_defaults=tuple(defaults),
        )
    except SpecError as exc:
        raise SpecError(f"backward.yaml entry {name!r}: {exc}") from None


def _parse_value_again(value: Any, type_: str) -> Any:
    """A forward default re-typed for the backward param (e.g. forward ``float`` -> ``Scalar``)."""
    base = type_.split("(")[0]
    if base in ("float", "double") and isinstance(value, int):
        return float(value)
    return value


def spec_path() -> str:
    return str(resources.files("tvmgrad.specs") / "backward.yaml")


@functools.cache
def load_specs(path: str | None = None) -> dict[str, OpSpec]:
    """All entries of backward.yaml by op name, in file order."""
    with open(path or spec_path(), encoding="utf-8") as fh:
        entries = yaml.safe_load(fh)
    if not isinstance(entries, list):
        raise SpecError("backward.yaml must be a list of entries")
    specs: dict[str, OpSpec] = {}
    for entry in entries:
        spec = parse_entry(entry)
        if spec.name in specs:
            raise SpecError(f"duplicate backward_op {spec.name!r}")
        specs[spec.name] = spec
    for spec in specs.values():
        if spec.backward and spec.backward not in specs:
            raise SpecError(f"{spec.name}: backward link {spec.backward!r} names no op")
    return specs
