"""An op's facets (its example, benchmark references and inputs, Relax rules, InferMeta, the
tests' own per-op tables) are keyed by its name in tables that nothing else ties to the registry:
``tvmgrad check`` cross-checks the package's (tvmgrad.check.facet_problems), this file the tests'."""

import ast
import difflib
import json
import pathlib

import numpy as np

from tvmgrad import benchrefs, cli, examples, registry
from tvmgrad.benchrefs import shape as shape_refs
from tvmgrad.relax import rules

TESTS = pathlib.Path(__file__).resolve().parent


def _check_json(capsys) -> tuple[int, dict]:
    rc = cli.main(["check", "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_check_passes_on_the_package(capsys):
    rc, record = _check_json(capsys)
    assert record["facets"] == [] and record["self_check"] == []
    assert rc == 0


def test_check_names_the_table_the_key_and_a_close_op(capsys, monkeypatch):
    monkeypatch.setitem(examples.DOMAINS, "acos_gard", {"x": (-0.9, 0.9)})
    monkeypatch.setitem(examples.DOMAINS, "asin_grad", {"xx": (-0.9, 0.9)})
    monkeypatch.setitem(examples.ATTRS, "prelu_grad", {"mode": "all"})
    monkeypatch.setitem(examples.FACTORIES, "bmm_grd", examples.FACTORIES["bmm_grad"])
    monkeypatch.setitem(examples.FACTORIES, "dot_grad", lambda rng: (
        {"x": np.ones((2, 3)), "yy": np.ones((2, 3)), "out_grad": np.ones(2)}, {}))
    dense = benchrefs.tables("TORCH")["tvmgrad.benchrefs.dense"]
    monkeypatch.setitem(dense, "conv2d_grd", dense["conv2d_grad"])
    monkeypatch.setitem(shape_refs.INPUTS, "concat_grad",
                        lambda size, dtype: ({"xs": [np.ones(3)], "out_grad": np.ones(3)}, {}))
    monkeypatch.setitem(rules.GRADIENTS, "relax.fake",
                        rules.RelaxGrad("sigmoid_gard", None, ("x_grad",)))
    monkeypatch.setitem(rules.GRADIENTS, "relax.fake2", rules.RelaxGrad("tanh_grad", None, ("y_grad",)))
    rc, record = _check_json(capsys)
    assert rc == 1
    found = "\n".join(record["facets"])
    expected = [
        "examples.DOMAINS: unknown op 'acos_gard'; did you mean acos_grad",
        "examples.DOMAINS['asin_grad']: 'xx' is not an input of asin_grad",
        "examples.ATTRS['prelu_grad']: never used, the op has a factory",
        "examples.FACTORIES (examples.dense._bmm): unknown op 'bmm_grd'; did you mean bmm_grad",
        "examples['dot_grad']: 'yy' is not an input of dot_grad (did you mean y?)",
        "examples['dot_grad']: no value for dot_grad's required y",
        "benchrefs.dense.TORCH: unknown op 'conv2d_grd'; did you mean conv2d_grad",
        "benchrefs.shape.INPUTS['concat_grad']: 'xs' is not an input of concat_grad (did you mean x?)",
        "relax.rules.GRADIENTS['relax.fake']: unknown op 'sigmoid_gard'; did you mean sigmoid_grad",
        "relax.rules.GRADIENTS['relax.fake2']: 'y_grad' is not an output of tanh_grad",
    ]
    for line in expected:
        assert line in found, f"{line!r} not in:\n{found}"
    assert "benchrefs.shape.INPUTS['concat_grad']: no value for concat_grad's required x" in found
    assert len(record["facets"]) == len(expected) + 1, found


# -- the tests' own tables -------------------------------------------------------------------------

def _string_keys(node) -> list[str] | None:
    """The keys of a dict / elements of a set, list or tuple literal when every one is a string
    or a tuple led by a string (``("atan2_grad", True)``); else None."""
    if isinstance(node, ast.Dict):
        items = node.keys
    elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
        items = node.elts
    else:
        return None
    keys = []
    for item in items:
        if isinstance(item, ast.Tuple) and item.elts:
            item = item.elts[0]
        if not (isinstance(item, ast.Constant) and isinstance(item.value, str)):
            return None
        keys.append(item.value)
    return keys


def op_table_problems(source: str, where: str, ops) -> list[str]:
    """Literal tables of ``source`` keyed by op names (most of their keys are ops: oracles,
    parametrized op lists, per-op tolerances): the keys that are no op but nearly one (a typo;
    other names, tvmgrad.relax's own kernels, a Relax op, may stand next to ops)."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        keys = _string_keys(node)
        if not keys:
            continue
        named = [k for k in keys if k in ops]
        if len(named) < 2 or 2 * len(named) < len(keys):
            continue
        for key in keys:
            close = [] if key in ops else difflib.get_close_matches(key, ops, n=1, cutoff=0.8)
            if close:
                problems.append(f"{where}:{node.lineno}: {key!r} is not an op (did you mean "
                                f"{close[0]}?)")
    return problems


def test_the_tests_tables_name_ops():
    ops = registry.ops()
    problems = []
    for path in sorted(TESTS.glob("*.py")):
        problems += op_table_problems(path.read_text(), path.name, ops)
    assert problems == []


def test_a_typo_in_a_tests_table_is_found():
    source = 'ORACLES = {"relu_grad": 1, "tanh_grad": 2, "sigmoid_gard": 3}\nSHAPES = {"x": 1, "y": 2}\n'
    assert op_table_problems(source, "t.py", registry.ops()) == [
        "t.py:1: 'sigmoid_gard' is not an op (did you mean sigmoid_grad?)"]
