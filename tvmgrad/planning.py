"""One path from a call to its kernel plan: bind -> InferMeta -> the family's planner -> the
tuned variant where a tuning database has a record -> on a CPU target, the streamed variant of a
large enough kernel that can stream its stores (tvmgrad/streaming.py).

Every user plans a call here (``run``/``prepare`` and launches given new shapes, AOT libraries,
GPU bundles, Relax's ``emit``, tuning), so each gets the same checks, the same errors (each names
the op) and the same plan; ``tvmgrad.build.lower`` then turns the plan into code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from . import registry, rt
from .call import BoundCall, bind
from .families.base import Plan
from .streaming import streamed
from .targets import Resolved, resolve

__all__ = ["PlannedCall", "plan_call", "calls_planned"]


@dataclass
class PlannedCall:
    """A call planned: the registry entry, the bound call, its output metas (YAML output order,
    None for an output not produced), the plan, the resolved target (None when planned for no
    target: never tuned) and ``data_free`` (only known when planned with ``probe``: the planner
    used nothing but the inputs' shapes and dtypes, so the plan serves every call of the same
    signature)."""

    entry: registry.Op
    call: BoundCall
    outputs: list
    plan: Plan
    target: Resolved | None = None
    data_free: bool = False

    def tuned_for(self, target: Resolved, db=None) -> Plan:
        """The plan, or its size-specialised tuned variant when the database (``db``, else the
        active one) has a record for this call on ``target``; a call with symbolic sizes (a
        Relax graph) has none."""
        if not (self.call.has_data or _static(self.call, self.outputs)):
            return self.plan
        from .tuned import tuned_plan
        tuned = tuned_plan(self.plan, self.call, self.outputs, target, db)
        return self.plan if tuned is self.plan else replace(tuned, tuned_from=self.plan.key)


_PLANNED = [0]        # calls planned in this process (a reused Launch or run's signature cache adds none)


def calls_planned() -> int:
    """How many calls this process has planned (bound, inferred and planned): what a reused
    ``Launch`` or ``run``'s signature cache saves is visible as this count not moving."""
    return _PLANNED[0]


def plan_call(op, inputs: dict | None, attrs: dict | None = None, *, target=None, db=None,
              metas_only: bool = False, probe: bool = False, **options) -> PlannedCall:
    """Plan a call of ``op`` (a name or a registry entry) on ``inputs`` (arrays; TensorMetas
    with ``metas_only``) and ``attrs``; ``options`` as ``bind`` takes them.

    ``target`` (a target spec or ``Resolved``): resolved after planning, and the plan replaced by
    its tuned variant where ``db`` (default: the active database) has one. ``probe``: plan first
    with stand-ins for the arrays that notice any use of their data (``data_free``).

    Bad input raises ValueError/TypeError naming the op; an op backward.yaml lists without a
    kernel, NotImplementedError."""
    entry = op if isinstance(op, registry.Op) else registry.get(op)
    call = bind(entry.spec, inputs, attrs, metas_only=metas_only, **options)
    if not entry.available:
        raise NotImplementedError(f"{entry.name}: listed in backward.yaml but not implemented yet")
    outs, plan, data_free = _plan(entry, call, probe)
    _PLANNED[0] += 1
    planned = PlannedCall(entry, call, outs, plan, data_free=data_free)
    if target is not None:
        planned.target = resolve(target)
        planned.plan = planned.tuned_for(planned.target, db)
        if planned.target.kind == "llvm":
            planned.plan = streamed(planned.plan)
    return planned


def _static(call: BoundCall, outs: list) -> bool:
    """Every size of the call's tensors and outputs is a number (not a Relax shape variable)."""
    metas = [call.meta(name) for name in call.tensors] + list(outs)
    flat = [m for x in metas for m in (x if isinstance(x, list) else [x]) if m is not None]
    return all(isinstance(d, int) for m in flat for d in m.shape)


# ------------------------------------------------------------------------------------------
# InferMeta and the planner, with a probe for plans that read data

def _plan(entry, call: BoundCall, probe: bool):
    """(outputs, plan, data_free) of a bound call."""
    op = call.op
    if probe and call.has_data:
        log: list = []
        real = dict(call.tensors)
        probes = {}
        for name, value in real.items():
            if isinstance(value, (np.ndarray, rt.Foreign)):
                probes[name] = _Probe(value, log)
            elif isinstance(value, list):
                probes[name] = [_Probe(v, log) if isinstance(v, (np.ndarray, rt.Foreign)) else v
                                for v in value]
        call.tensors.update(probes)
        try:
            outs = registry.infer_outputs(entry, call)
            plan = entry.impl.plan(call, outs)
        except Exception:  # noqa: BLE001 - a stand-in may not do: plan again with the arrays
            log.append("error")
        finally:
            for name, value in probes.items():
                if call.tensors.get(name) is value:
                    call.tensors[name] = real[name]
                else:                               # the planner replaced the input
                    log.append("replaced")
        if not log:
            return outs, plan, True
    try:
        outs = registry.infer_outputs(entry, call)
        plan = entry.impl.plan(call, outs)
    except (ValueError, TypeError) as exc:
        # every error of a bad call names the op (a check deep in a planner, or numpy's own
        # message about an array it was given, may not)
        if str(exc).startswith(f"{op}: "):
            raise
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f"{op}: {exc}") from exc
    return outs, plan, False


class _Probe:
    """A stand-in for an input array while planning: its shape and dtype as they are; any other
    use (``np.asarray``, indexing, attributes) works too but is logged, so the plan is known to
    depend on the data."""

    __slots__ = ("_value", "_log")

    def __init__(self, value, log):
        self._value, self._log = value, log

    @property
    def shape(self):
        return self._value.shape

    @property
    def dtype(self):
        return self._value.dtype

    @property
    def ndim(self):
        return len(self._value.shape)

    @property
    def size(self):
        return math.prod(self._value.shape)

    def __array__(self, dtype=None, copy=None):
        self._log.append("__array__")
        return np.asarray(self._value, dtype=dtype)

    def __getattr__(self, name):
        self._log.append(name)
        return getattr(self._value, name)

    def __len__(self):
        self._log.append("__len__")
        return len(self._value)

    def __getitem__(self, item):
        self._log.append("__getitem__")
        return self._value[item]

    def __iter__(self):
        self._log.append("__iter__")
        return iter(self._value)
