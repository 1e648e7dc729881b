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

import numpy as np

__all__ = ["tables", "torch_refs", "paddle_refs", "input_makers", "flop_counts", "aten", "uniform"]


def tables(attr: str) -> dict[str, dict]:
    """Module name -> its table ``attr`` (TORCH, PADDLE, INPUTS or FLOPS), for the modules that
    define one (``tvmgrad check`` names the module of a bad key)."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, attr):
            found[module.__name__] = getattr(module, attr)
    return found


def _collect(attr: str) -> dict:
    merged = {}
    for table in tables(attr).values():
        merged.update(table)
    return merged


def torch_refs() -> dict:
    return _collect("TORCH")


def paddle_refs() -> dict:
    return _collect("PADDLE")


def input_makers() -> dict:
    return _collect("INPUTS")


def flop_counts() -> dict:
    return _collect("FLOPS")


# -- shared by the reference modules ----------------------------------------------------------

def aten():
    """``torch.ops.aten`` (torch is imported when a reference is made, never to list them)."""
    import torch
    return torch.ops.aten


def uniform(shape, dtype: str, seed: int = 0, scale: float = 1.0):
    """Benchmark data: uniform in (-scale, scale), of tvmgrad dtype ``dtype`` (bfloat16 too)."""
    from ..examples import np_dtype
    return (np.random.default_rng(seed).uniform(-1, 1, size=shape) * scale).astype(np_dtype(dtype))
