"""Test session setup: kernels go to a cache inside the checkout unless TVMGRAD_CACHE_DIR is set."""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
os.environ.setdefault("TVMGRAD_CACHE_DIR", str(ROOT / ".cache" / "test-kernels"))

import zlib

import pytest

# A ``@pytest.mark.sweep`` test's cases beyond a deterministic eighth (by their id; the first case
# always) are also marked slow: the default run samples the sweep within its time budget and
# ``-m sweep`` (CI: ``-m "sweep and slow"`` after the default run) runs all of it.
SWEEP_SAMPLE = 8


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    seen = set()
    for item in items:
        if item.get_closest_marker("sweep") is None:
            continue
        base = item.nodeid.split("[", 1)[0]
        first = base not in seen
        seen.add(base)
        if not first and zlib.crc32(item.nodeid.encode()) % SWEEP_SAMPLE:
            item.add_marker(pytest.mark.slow)
