"""Reference implementations the benchmark times ours against, one module per op family.

A module defines ``TORCH = {op: make(tensors, attrs) -> callable}`` (PyTorch CPU, the way a torch
user computes that grad: an ``aten.*_backward`` op or autograd on the forward) and may define
``PADDLE = {op: make(tensors, attrs) -> callable}`` where ``paddle._C_ops.<op>`` with the YAML args
is not the right call. ``tensors`` are the op's inputs (torch / paddle tensors) keyed by YAML name.
``INPUTS = {op: make(size, dtype) -> (inputs, attrs)}`` gives an op realistic benchmark inputs of
about ``size`` elements (numpy arrays); without it every tensor input is a flat array of ``size``.
``FLOPS = {op: count(inputs, attrs) -> float}`` gives compute-bound ops their conventional FLOP
count, which the benchmark reports as GFLOP/s next to GB/s.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["torch_refs", "paddle_refs", "input_makers", "flop_counts"]


def _collect(attr: str) -> dict:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.update(getattr(module, attr, {}))
    return found


def torch_refs() -> dict:
    return _collect("TORCH")


def paddle_refs() -> dict:
    return _collect("PADDLE")


def input_makers() -> dict:
    return _collect("INPUTS")


def flop_counts() -> dict:
    return _collect("FLOPS")
