"""Where tvmgrad keeps what it builds on this machine (kernels, cubins, AOT staging, downloaded
wheels): ``$TVMGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvmgrad``, else ``~/.cache/tvmgrad``.
A leaf: the kernel cache, the CUDA compiler and the AOT builder all ask it."""

from __future__ import annotations

import os
import pathlib

__all__ = ["cache_dir"]


def cache_dir() -> pathlib.Path:
    env = os.environ.get("TVMGRAD_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "tvmgrad"
