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


# ------------------------------------------------------------------------------------------
# the classes of tests/test_fuzz.py, one test each (the fuzz sweeps every op; these pin the
# examples the issues named)

def _sample(op, **changes):
    from tvmgrad.examples import sample
    inputs, attrs = sample(op)
    return {**inputs, **{k: v for k, v in changes.items() if k in inputs}}, \
        {**attrs, **{k: v for k, v in changes.items() if k not in inputs}}


def test_accepted_shapes_must_agree_with_each_other():
    """Silent garbage from accepted bad shapes: an out_grad that is not the expansion the
    attribute describes, or wider than the broadcast of the forward's inputs, is refused."""
    x = np.ones((3, 1))
    with pytest.raises(ValueError, match=r"expand_grad: input 'out_grad' has shape \[2, 3, 5\], "
                                         r"but expanding 'x' \[3, 1\] to attribute 'shape'"):
        tvmgrad.run("expand_grad", {"x": x, "out_grad": np.ones((2, 3, 5))}, {"shape": [2, 3, 4]})
    with pytest.raises(ValueError, match=r"expand_as_grad: input 'out_grad' has shape \[3, 4\]"):
        tvmgrad.run("expand_as_grad", {"x": x, "out_grad": np.ones((3, 4))},
                    {"target_shape": [2, 3, 4]})
    with pytest.raises(ValueError, match=r"atan2_grad: input 'out_grad' has shape \[2, 3, 4\], "
                                         r"expected \[3, 4\] \(the broadcast of x\[3, 4\], y\[4\]\)"):
        tvmgrad.run("atan2_grad", {"x": X, "y": X[0], "out_grad": np.stack([X, X])})


def test_inputs_that_share_a_dtype_are_checked_to():
    """Mixed dtypes: tensors that must share a dtype (real/imag, x/out_grad of a loss, the
    logsumexp of attention, meshgrid's inputs and grads) are checked to."""
    r = np.ones((3, 4))
    with pytest.raises(TypeError, match=r"complex_grad: input 'imag' has dtype float32 but 'real' "
                                        r"has float64"):
        tvmgrad.run("complex_grad", {"real": r, "imag": r.astype("float32"),
                                     "out_grad": r.astype("complex128")})
    with pytest.raises(TypeError, match=r"angle_grad: input 'out_grad' has dtype float32; for 'x' "
                                        r"of dtype complex128 it must be float64"):
        tvmgrad.run("angle_grad", {"x": r.astype("complex128"), "out_grad": r.astype("float32")})
    with pytest.raises(TypeError, match=r"identity_loss_grad: input 'x' has dtype int64"):
        tvmgrad.run("identity_loss_grad", {"x": np.ones((3, 4), np.int64), "out_grad": np.ones(())},
                    {"reduction": 0})
    with pytest.raises(ValueError, match=r"meshgrid_grad: inputs\[0\] has dtype int64"):
        tvmgrad.run("meshgrid_grad", {"inputs": [np.arange(3), np.ones(2)],
                                      "outputs_grad": [np.ones((3, 2))] * 2})
    inputs, attrs = _sample("flash_attn_grad")
    inputs = {k: (v.astype("float32") if k != "softmax_lse" and v.dtype.kind == "f" else v)
              for k, v in inputs.items()}
    with pytest.raises(TypeError, match=r"flash_attn_grad: input 'softmax_lse' has dtype float64; "
                                        r"it must be float32"):
        tvmgrad.run("flash_attn_grad", inputs, attrs)


def test_errors_are_raised_before_any_build(monkeypatch):
    """Internal exceptions leak: a wrong dtype in mean_all_grad used to reach TVM's argument check
    after the build; segment_pool_grad leaked numpy's message for a 0-D segment_ids."""
    from tvmgrad import cache

    def no_build(*args, **kwargs):
        raise AssertionError("a kernel was fetched for a call that must be refused")

    monkeypatch.setattr(cache.KernelCache, "get", no_build)
    with pytest.raises(TypeError, match=r"mean_all_grad: input 'out_grad' has dtype float64 but "
                                        r"'x' has float32"):
        tvmgrad.run("mean_all_grad", {"x": X, "out_grad": np.ones((), np.float64)})
    inputs, attrs = _sample("segment_pool_grad")
    with pytest.raises(ValueError, match=r"segment_pool_grad: input 'segment_ids' has shape \[\]"):
        tvmgrad.run("segment_pool_grad", {**inputs, "segment_ids": np.array(0)}, attrs)


def test_errors_speak_of_the_op_called_with_its_yaml_names():
    """Invoke ops (sign_grad -> scale, unbind_grad -> stack) and InferMetas shared under other
    parameter names report the op the user called and its own argument names."""
    with pytest.raises(ValueError, match=r"^scale_grad: attribute 'scale' = inf has no int64 value"):
        tvmgrad.run("scale_grad", {"out_grad": np.ones((3, 4), np.int64)}, {"scale": float("inf")})
    with pytest.raises(ValueError, match=r"^unbind_grad: out_grad\[1\] has shape \[3\] but "
                                         r"out_grad\[0\] has \[4\]"):
        tvmgrad.run("unbind_grad", {"out_grad": [X[0], X[:, 0]]}, {"axis": 0})
    with pytest.raises(ValueError, match=r"^cumprod_grad: attribute 'dim' = 5 is out of range"):
        tvmgrad.run("cumprod_grad", {"x": X, "out": X, "out_grad": X}, {"dim": 5})
    with pytest.raises(ValueError, match=r"^pad3d_double_grad: grad_x_grad has rank 2"):
        tvmgrad.run("pad3d_double_grad", {"grad_x_grad": X}, {"paddings": [0] * 6})


def test_values_of_lengths_indices_and_attributes_are_range_checked():
    """Unchecked values: length tensors, start-row indices, arg_max and attributes outside their
    documented ranges are refused (they used to change the result silently)."""
    inputs, attrs = _sample("warpctc_grad")
    for bad in (-1, 10 ** 6):
        lengths = inputs["logits_length"].copy()
        lengths[0] = bad
        with pytest.raises(ValueError, match=rf"warpctc_grad: input 'logits_length' holds {bad}"):
            tvmgrad.run("warpctc_grad", {**inputs, "logits_length": lengths}, attrs)
    inputs, attrs = _sample("warprnnt_grad")
    with pytest.raises(ValueError, match=r"warprnnt_grad: input 'input_lengths' holds -5"):
        tvmgrad.run("warprnnt_grad", {**inputs, "input_lengths": -5 * np.ones_like(
            inputs["input_lengths"])}, attrs)
    inputs, attrs = _sample("flash_attn_with_sparse_mask_grad")
    rows = inputs["attn_mask_start_row_indices"].copy()
    rows.flat[0] = 10 ** 6
    with pytest.raises(ValueError, match=r"flash_attn_with_sparse_mask_grad: input "
                                         r"'attn_mask_start_row_indices' holds 1000000, out of range"):
        tvmgrad.run("flash_attn_with_sparse_mask_grad", {**inputs, "attn_mask_start_row_indices": rows},
                    attrs)
    inputs, attrs = _sample("roi_pool_grad")
    arg_max = inputs["arg_max"].copy()
    arg_max.flat[0] = -10 ** 6
    with pytest.raises(ValueError, match=r"roi_pool_grad: input 'arg_max' holds -1000000 .*"
                                         r"expected -1 <= value"):
        tvmgrad.run("roi_pool_grad", {**inputs, "arg_max": arg_max}, attrs)
    with pytest.raises(ValueError, match=r"polygamma_grad: attribute 'n' = 1000000 is out of range"):
        tvmgrad.run("polygamma_grad", {"x": X + 2, "out_grad": X}, {"n": 10 ** 6})
    with pytest.raises(ValueError, match=r"kthvalue_grad: attribute 'k' = 0 is out of range"):
        tvmgrad.run("kthvalue_grad", {"x": X, "indices": np.zeros((3,), np.int64),
                                      "out_grad": X[:, 0]}, {"k": 0, "axis": -1, "keepdim": False})


def test_read_only_inputs_are_taken_without_a_copy(tmp_path):
    """Read-only inputs: a read-only, 64-byte aligned array (np.load(mmap_mode='r'), or one with
    writeable=False) is read in place, like a writable one, and never written."""
    from tvmgrad.runtime import aligned_empty
    calls = [("relu_grad", {"out": X, "out_grad": X * 2}, {}),
             ("layer_norm_grad", None, None), ("cumsum_grad", None, None)]
    for op, inputs, attrs in calls:
        if inputs is None:
            inputs, attrs = _sample(op)
        want = tvmgrad.run(op, inputs, attrs)
        mapped, frozen = {}, {}
        for k, v in inputs.items():
            if v is None:
                continue
            path = tmp_path / f"{op}-{k}.npy"
            np.save(path, v)
            mapped[k] = np.load(path, mmap_mode="r")
            a = aligned_empty(v.shape, v.dtype)
            a[...] = v
            a.setflags(write=False)
            frozen[k] = a
        for variant in (mapped, frozen):
            assert all(not a.flags.writeable for a in variant.values())
            got = tvmgrad.run(op, variant, attrs)
            for name, value in want.items():
                if value is not None:
                    np.testing.assert_array_equal(got[name], value)
        for k, v in inputs.items():
            if v is not None:
                np.testing.assert_array_equal(mapped[k], v)


def test_read_only_input_is_zero_copy():
    from tvmgrad.runtime import aligned_empty, to_tvm
    from tvmgrad.dtypes import dtype as as_dtype
    a = aligned_empty((4, 6), np.float32)
    a[...] = 1.5
    a.setflags(write=False)
    t = to_tvm(a, None, as_dtype("float32"))
    assert np.from_dlpack(t).ctypes.data == a.ctypes.data
