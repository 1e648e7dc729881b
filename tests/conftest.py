"""Test session setup: kernels go to a cache inside the checkout unless TVMGRAD_CACHE_DIR is set."""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
os.environ.setdefault("TVMGRAD_CACHE_DIR", str(ROOT / ".cache" / "test-kernels"))
