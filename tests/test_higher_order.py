"""Every higher-order grad is the VJP of the lower-order kernel it differentiates (YAML `backward:`).

For a link G -> D (e.g. tanh_grad -> tanh_double_grad), D's inputs are G's primal inputs (named as
in D's ``forward:`` signature; some D take G's output instead, e.g. sqrt_double_grad's grad_x) plus
one cotangent ``<out>_grad`` per output of G, and D's outputs are ``<primal>_grad``. With a random direction t over the primals D differentiates and cotangents c
(JAX's check_vjp, one direction instead of per element), in float64:

    < c, (G(p + e t) - G(p - e t)) / 2e >  ==  sum_p < D(p, c)[p_grad], t_p >

G is *our* kernel, so this checks our kernels against each other, independently of Paddle.
"""

import numpy as np
import pytest

import tvmgrad
from samples import implemented_ops, sample
from tvmgrad import registry
from tvmgrad.spec import load_specs

EPS = 1e-6

# Primals of G that D does not take or differentiate but that depend on one it does
# (G reads a forward output): recomputed from the forward after each perturbation.
def _instance_stats(p, a):
    flat = p["x"].reshape(p["x"].shape[0] * p["x"].shape[1], -1)
    return flat.mean(1), 1 / np.sqrt(flat.var(1) + np.float32(a["epsilon"]))


TIES = {
    # instance_norm_grad reads saved statistics of x (mean and 1/std per sample and channel)
    "instance_norm_double_grad": {"saved_mean": lambda p, a: _instance_stats(p, a)[0],
                                  "saved_variance": lambda p, a: _instance_stats(p, a)[1]},
    "elu_double_grad": {"out": lambda p, a: np.where(p["x"] > 0, p["x"], a["alpha"] * np.expm1(p["x"]))},
    "silu_double_grad": {"out": lambda p, a: p["x"] / (1 + np.exp(-p["x"]))},
}


def _links():
    specs = load_specs()
    available = set(implemented_ops())
    return sorted((g, s.backward) for g, s in specs.items()
                  if s.backward and g in available and s.backward in available)


def _g_call(g_spec, sig, primals, attrs):
    """Run G (our kernel) on primals keyed by D's forward-signature names."""
    inputs = {yp.name: primals.get(sp.name) for sp, yp in zip(sig.params, g_spec.args) if yp.is_tensor}
    out = tvmgrad.run(g_spec.name, inputs, attrs)
    return {so.name: out[yo.name] for so, yo in zip(sig.outputs, g_spec.outputs)}


@pytest.mark.parametrize("g,d", _links(), ids=lambda x: x)
@pytest.mark.sweep
def test_higher_order_grad_is_vjp_of_lower(g, d):
    specs = load_specs()
    g_spec, d_spec = specs[g], specs[d]
    sig = d_spec.forward                       # G's signature with D's names
    assert sig.name == g
    g_inputs, g_attrs = sample(g, seed=3)
    primals = {sp.name: g_inputs.get(yp.name) for sp, yp in zip(sig.params, g_spec.args) if sp.is_tensor}
    attrs = {sp.name: g_attrs[yp.name] for sp, yp in zip(sig.params, g_spec.args)
             if not sp.is_tensor and yp.name in g_attrs}
    d_attrs = {p.name: attrs[p.name] for p in d_spec.attrs if p.name in attrs}
    full_attrs = {**g_spec.defaults, **g_attrs}
    ties = TIES.get(d, {})

    def tied(p):
        p = dict(p)
        for name, fn in ties.items():
            p[name] = fn(p, full_attrs)
        return p

    primals = tied(primals)
    rng = np.random.default_rng(7)
    d_outputs = {o.name for o in d_spec.outputs}
    wrt = [n for n in primals if f"{n}_grad" in d_outputs and _is_float(primals[n])]
    assert wrt, f"{d} differentiates none of {list(primals)}"
    direction = {n: _like(primals[n], rng) for n in wrt}
    forward_out = _g_call(g_spec, sig, primals, g_attrs)     # D may take G's outputs (sqrt's grad_x)
    cot = {f"{o}_grad": _like(v, rng) for o, v in forward_out.items() if v is not None}

    d_inputs = {}
    for p in d_spec.tensor_args:
        for source in (primals, forward_out, cot):
            if p.name in source:
                d_inputs[p.name] = source[p.name]
                break
        else:
            d_inputs[p.name] = None
    for name, value in d_inputs.items():
        if value is None and name not in d_spec.optional:
            pytest.fail(f"{d}: no value for input {name}")
    got = tvmgrad.run(d, d_inputs, d_attrs)
    lhs = sum(_dot(got[f"{n}_grad"], direction[n]) for n in wrt)

    def shifted(sign):
        return tied({n: (_axpy(v, sign * EPS, direction[n]) if n in direction else v)
                     for n, v in primals.items()})
    gp, gm = _g_call(g_spec, sig, shifted(1), g_attrs), _g_call(g_spec, sig, shifted(-1), g_attrs)
    rhs = sum(_dot(cot[f"{o}_grad"], _axpy(gp[o], -1, gm[o])) / (2 * EPS)
              for o in gp if d_inputs.get(f"{o}_grad") is not None)
    scale = max(1.0, abs(lhs), abs(rhs))
    assert abs(lhs - rhs) <= 1e-6 * scale, f"{d}: <D(c), t> = {lhs!r} but <c, dG.t> = {rhs!r}"


def _is_float(value) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_is_float(v) for v in value)
    return value is not None and np.asarray(value).dtype.kind == "f"


def _like(value, rng):
    """A random float64 array (or list of them) shaped like ``value``."""
    if isinstance(value, list):
        return [_like(v, rng) for v in value]
    return rng.standard_normal(np.shape(value))


def _dot(a, b) -> float:
    if isinstance(a, list):
        return sum(_dot(x, y) for x, y in zip(a, b))
    return float(np.sum(np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)))


def _axpy(x, alpha, y):
    """x + alpha * y, elementwise over lists."""
    if isinstance(x, list):
        return [_axpy(a, alpha, b) for a, b in zip(x, y)]
    return np.asarray(x, dtype=np.float64) + alpha * np.asarray(y, dtype=np.float64)


def test_links_are_found():
    # the YAML has 34 backward links; once both ends are implemented each is checked above
    assert len([s for s in load_specs().values() if s.backward]) == 34
    assert all(registry.get(d).spec.forward.name == g for g, d in _links())
