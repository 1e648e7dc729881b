"""The package's example calls (tvmgrad.examples), plus factories registered by the test modules
``tests/samples_<family>.py`` (``from samples import factory``)."""

import importlib
import pathlib

from tvmgrad.examples import (ATTR_BY_TYPE, ATTRS, DOMAINS, FACTORIES, SHAPE,  # noqa: F401
                              broadcast_variant, factory, implemented_ops, sample)

for _path in sorted(pathlib.Path(__file__).parent.glob("samples_*.py")):
    importlib.import_module(_path.stem)
