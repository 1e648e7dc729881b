"""tvmgrad: PaddlePaddle's backward operators as compiled Apache TVM kernels.

    tvmgrad.run(op, inputs, attrs=None, *, target="llvm") -> dict
"""

import os as _os

# TVM's CPU pool starts with one thread on some machines; use every core unless told otherwise.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))
                                              if hasattr(_os, "sched_getaffinity") else _os.cpu_count()))

from ._version import __version__  # noqa: E402
from .infer_meta import TensorMeta  # noqa: E402
from .runtime import Launch, prepare, run  # noqa: E402

__all__ = ["run", "prepare", "Launch", "TensorMeta", "load_library", "__version__"]


def load_library(path):
    """Open an ahead-of-time kernel library built by ``tvmgrad build`` (see tvmgrad.aot)."""
    from .aot import load_library as _load
    return _load(path)
