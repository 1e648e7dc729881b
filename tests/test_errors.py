"""Bad input raises a clear ValueError/TypeError naming the op and the argument, before any build."""

import ml_dtypes
import numpy as np
import pytest

import tvmgrad

X = np.linspace(-1, 1, 12).reshape(3, 4).astype("float32")


def test_unknown_op_suggests_close_names():
    with pytest.raises(ValueError, match=r"unknown op 'relu_gard'.*relu_grad"):
        tvmgrad.run("relu_gard", {"out": X, "out_grad": X})


def test_unknown_input_names_op_and_input():
    with pytest.raises(ValueError, match=r"relu_grad: unknown input 'x'"):
        tvmgrad.run("relu_grad", {"x": X, "out": X, "out_grad": X})


def test_attribute_passed_as_input_gets_a_hint():
    with pytest.raises(ValueError, match=r"leaky_relu_grad: unknown input 'negative_slope'.*attrs"):
        tvmgrad.run("leaky_relu_grad", {"x": X, "out_grad": X, "negative_slope": 0.1})


def test_missing_input():
    with pytest.raises(ValueError, match=r"relu_grad: missing input 'out_grad'"):
        tvmgrad.run("relu_grad", {"out": X})


def test_unknown_attribute():
    with pytest.raises(ValueError, match=r"relu_grad: unknown attribute 'alpha'"):
        tvmgrad.run("relu_grad", {"out": X, "out_grad": X}, {"alpha": 1.0})


def test_missing_required_attribute():
    with pytest.raises(ValueError, match=r"leaky_relu_grad: missing attribute 'negative_slope'"):
        tvmgrad.run("leaky_relu_grad", {"x": X, "out_grad": X})


@pytest.mark.parametrize("value", ["0.1", object(), [0.1], True])
def test_wrong_attribute_type(value):
    with pytest.raises(TypeError, match=r"leaky_relu_grad: attribute 'negative_slope' \(float\)"):
        tvmgrad.run("leaky_relu_grad", {"x": X, "out_grad": X}, {"negative_slope": value})


def test_wrong_string_attribute_type():
    with pytest.raises(TypeError, match=r"prelu_grad: attribute 'mode' \(str\)"):
        tvmgrad.run("prelu_grad", {"x": X, "alpha": X[:1, :1].ravel(), "out_grad": X}, {"mode": 1})


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "complex64"])
def test_wrong_dtype_names_input(dtype):
    bad = np.ones((3, 4), dtype=dtype)
    with pytest.raises(TypeError, match=r"relu_grad: input 'out' has dtype " + dtype):
        tvmgrad.run("relu_grad", {"out": bad, "out_grad": X})


def test_mixed_dtypes_rejected():
    with pytest.raises(TypeError, match=r"relu_grad: input 'out_grad' has dtype float64 but 'out' has float32"):
        tvmgrad.run("relu_grad", {"out": X, "out_grad": X.astype("float64")})
    with pytest.raises(TypeError, match=r"bfloat16"):
        tvmgrad.run("relu_grad", {"out": X, "out_grad": X.astype(ml_dtypes.bfloat16)})


def test_unsupported_dtype_object():
    with pytest.raises(TypeError, match="relu_grad: input 'out'"):
        tvmgrad.run("relu_grad", {"out": np.array(["a", "b"]), "out_grad": X})


def test_shape_mismatch_in_unary_grad():
    with pytest.raises(ValueError, match=r"relu_grad: input 'out_grad' has shape \[4\], expected \[3, 4\]"):
        tvmgrad.run("relu_grad", {"out": X, "out_grad": X[0]})


def test_no_valid_broadcast():
    with pytest.raises(ValueError, match=r"atan2_grad: shapes do not broadcast: x\[3, 4\], y\[3\]"):
        tvmgrad.run("atan2_grad", {"x": X, "y": X[:, 0], "out_grad": X})


def test_out_grad_must_have_the_broadcast_shape():
    with pytest.raises(ValueError, match=r"atan2_grad: input 'out_grad' has shape \[4\]"):
        tvmgrad.run("atan2_grad", {"x": X, "y": X[0], "out_grad": X[0]})


def test_list_for_single_tensor():
    with pytest.raises(TypeError, match=r"relu_grad: input 'out' is a single Tensor"):
        tvmgrad.run("relu_grad", {"out": [X, X], "out_grad": X})


def test_inputs_must_be_a_dict():
    with pytest.raises(TypeError, match=r"relu_grad: inputs and attrs must be dicts"):
        tvmgrad.run("relu_grad", [X, X])


def test_bad_output_buffer():
    launch = tvmgrad.prepare("relu_grad", {"out": X, "out_grad": X})
    with pytest.raises(ValueError, match=r"relu_grad: output 'x_grad' must have shape \[3, 4\]"):
        launch(out={"x_grad": np.empty((4, 3), "float32")})
    with pytest.raises(ValueError, match=r"writable C-contiguous"):
        launch(out={"x_grad": np.empty((4, 3), "float32").T})


def test_unknown_target():
    with pytest.raises(ValueError, match="unknown target"):
        tvmgrad.run("relu_grad", {"out": X, "out_grad": X}, target="tpu")
