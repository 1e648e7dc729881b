"""Lazily imported TVM modules for te_defs.

Op definitions are imported whenever the registry is (to plan a call), but their TE math runs only
when a kernel is built. Importing ``tvm`` loads the whole compiler, which a process that only calls
prebuilt kernels (an ahead-of-time library) must not need: te_defs modules take ``te`` and ``tirx``
from here, and ``import tvm`` happens at the first attribute access.
"""

from __future__ import annotations

import importlib

__all__ = ["te", "tirx", "topi"]


class _LazyModule:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}>"


te = _LazyModule("tvm.te")
tirx = _LazyModule("tvm.tirx")
topi = _LazyModule("tvm.topi")
