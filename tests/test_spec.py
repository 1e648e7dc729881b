"""backward.yaml grammar and the YAML-driven registry."""

import textwrap

import pytest
import yaml

from tvmgrad import registry
from tvmgrad.families.pointwise import Pointwise
from tvmgrad.spec import (NO_DEFAULT, SpecError, load_specs, parse_entry, parse_outputs, parse_params,
                          parse_signature)


def test_all_263_entries_parse():
    specs = load_specs()
    assert len(specs) == 263
    assert sum(bool(s.inplace) for s in specs.values()) == 79
    assert sum(bool(s.invoke) for s in specs.values()) == 16
    assert sum(bool(s.composite) for s in specs.values()) == 38
    assert sum(bool(s.backward) for s in specs.values()) == 34
    assert sum(bool(s.no_need_buffer) for s in specs.values()) == 35
    assert sum(bool(s.optional) for s in specs.values()) == 37


def test_signature_grammar():
    params = parse_params('(Tensor x, Tensor[] y, int[] strides={1, 1}, Scalar min=0., '
                          'str data_format="NCHW", int64_t[] dims = {}, IntArray shape, '
                          'DataType dtype = DataType::INT64, float eps = 1e-6f, bool flag=true)')
    got = {p.name: (p.type, p.default) for p in params}
    assert got == {
        "x": ("Tensor", NO_DEFAULT), "y": ("Tensor[]", NO_DEFAULT), "strides": ("int[]", (1, 1)),
        "min": ("Scalar", 0.0), "data_format": ("str", "NCHW"), "dims": ("int64_t[]", ()),
        "shape": ("IntArray", NO_DEFAULT), "dtype": ("DataType", "int64"), "eps": ("float", 1e-6),
        "flag": ("bool", True),
    }
    assert params[1].is_tensor_list and params[0].is_tensor and not params[2].is_tensor


def test_output_grammar():
    outs = parse_outputs("Tensor(x_grad), Tensor[](y_grad){y.size()}, Tensor (z)")
    assert [(o.name, o.is_list, o.size) for o in outs] == [
        ("x_grad", False, None), ("y_grad", True, "y.size()"), ("z", False, None)]


@pytest.mark.parametrize("bad", ["(Tensor)", "(Tensor x, float y=)", "(Matrix x)", "(Tensor x, Tensor x)",
                                 "Tensor x", "(int[] s={1, 2)"])
def test_malformed_params_fail_loudly(bad):
    with pytest.raises(SpecError):
        parse_params(bad)


def test_malformed_outputs_and_signatures_fail_loudly():
    with pytest.raises(SpecError):
        parse_outputs("Tensor x_grad")
    with pytest.raises(SpecError):
        parse_signature("relu (Tensor x)")


ENTRY = """
- backward_op : foo_grad
  forward : foo (Tensor x, float alpha=0.5, int k=3) -> Tensor(out)
  args : (Tensor x, Tensor out_grad, float alpha, int k=7)
  output : Tensor(x_grad)
  infer_meta{sep}
    func : UnchangedInferMeta
    param : [x]
  kernel :
    func : foo_grad
    data_type : x
  inplace{sep} (out_grad -> x_grad)
  optional : out_grad
  no_need_buffer : x
  backward : foo_double_grad
"""


@pytest.mark.parametrize("sep", [" :", ":"])
def test_entry_keys_in_both_spellings(sep):
    spec = parse_entry(yaml.safe_load(textwrap.dedent(ENTRY.format(sep=sep)))[0])
    assert spec.name == "foo_grad" and spec.forward.name == "foo"
    assert spec.infer_meta.func == "UnchangedInferMeta" and spec.infer_meta.param == ("x",)
    assert spec.kernel.data_type == "x"
    assert spec.inplace == (("out_grad", "x_grad"),)
    assert spec.optional == {"out_grad"} and spec.no_need_buffer == {"x"}
    assert spec.backward == "foo_double_grad"
    # defaults: the backward args win, else the forward signature
    assert spec.defaults == {"alpha": 0.5, "k": 7}


def test_unknown_key_fails_loudly():
    entry = yaml.safe_load(textwrap.dedent(ENTRY.format(sep=":")))[0]
    entry["fancy_new_key"] = 1
    with pytest.raises(SpecError, match="foo_grad.*fancy_new_key"):
        parse_entry(entry)


def test_bad_cross_references_fail_loudly():
    entry = yaml.safe_load(textwrap.dedent(ENTRY.format(sep=":")))[0]
    entry["inplace"] = "(nope -> x_grad)"
    with pytest.raises(SpecError, match="inplace"):
        parse_entry(entry)


def test_real_defaults_and_links():
    specs = load_specs()
    assert specs["hardtanh_grad"].defaults == {"t_min": 0.0, "t_max": 24.0}   # from the forward
    assert specs["pow_grad"].defaults == {"y": -1}                            # backward beats forward
    assert specs["cos_triple_grad"].optional == {"grad_out_forward", "grad_x_grad_forward",
                                                  "grad_out_grad_grad"}
    assert specs["sign_grad"].invoke.name == "scale"
    assert specs["sign_grad"].invoke.args == ("out_grad", "0.0f", "0.0f", "true")
    assert specs["tanh_grad"].backward == "tanh_double_grad"
    assert specs["cudnn_lstm_grad"].outputs[-1].is_list


def test_registry_lists_every_yaml_op_and_passes_its_self_check():
    table = registry.ops()
    assert set(load_specs()) <= set(table)
    assert registry.check() == []
    assert registry.get("sign_grad").state == "invoke"
    assert registry.get("scale").is_forward


def test_self_check_catches_a_builder_that_disagrees_with_the_yaml():
    def relu_grad(x, out_grad):  # YAML says (out, out_grad)
        return out_grad
    problems = registry.check_builder(load_specs()["relu_grad"], Pointwise(relu_grad))
    assert problems and "builder parameters" in problems[0]
