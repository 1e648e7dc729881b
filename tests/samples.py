"""The package's example calls (tvmgrad.examples, one module per op family) as the tests use
them."""

from tvmgrad.examples import (ATTR_BY_TYPE, ATTRS, DOMAINS, FACTORIES, SHAPE,  # noqa: F401
                              broadcast_variant, factory, implemented_ops, sample)
