"""Distributed / parameter-server grads (te_defs/distributed.py), world size 1.

Paddle 3.3.1's CPU build has no kernels for these (``_C_ops.global_scatter`` raises "Do not
support global scatter op for cpu kernel now"; push_gpups_sparse / push_sparse_v2 have no
binding): the oracle is numpy, written from the semantics documented in the module (Paddle's
GPU kernels / FleetWrapper / PSGPUWrapper), for the local (one-rank) computation. A world size
above 1 (registered through ``set_communicator``) must raise, not silently compute.
"""

import numpy as np
import pytest

import tvmgrad
from harness import assert_close, cast
from tvmgrad.te_defs import distributed

FLOATS = ("float32", "float64", "float16", "bfloat16")


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.fixture
def two_ranks():
    distributed.set_communicator(lambda ring_id: 2)
    try:
        yield
    finally:
        distributed.set_communicator(None)


# ------------------------------------------------------------------------------------------
# global_gather_grad (invokes global_scatter) / global_scatter_grad (invokes global_gather)

@pytest.mark.parametrize("op", ["global_gather_grad", "global_scatter_grad"])
@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
def test_exchange_world_size_one(op, dtype):
    """With one rank every row goes to and comes from this rank: x_grad = out_grad."""
    g = (_rng().standard_normal((7, 5)) * 10)
    g = g.astype(dtype) if dtype.startswith("int") else cast(g, dtype)
    for counts in ([3, 0, 4], [7], [0, 0, 7, 0]):
        c = np.array(counts, np.int64)
        out = tvmgrad.run(op, {"out_grad": g, "local_count": c, "global_count": c.copy()},
                          {"ring_id": 0})["x_grad"]
        assert out.dtype == g.dtype and out.shape == g.shape
        np.testing.assert_array_equal(out, g)


def test_exchange_forward_ops_and_int32_counts():
    g = _rng().standard_normal((4, 3))
    c = np.array([1, 3], np.int32)
    for op in ("global_scatter", "global_gather"):
        out = tvmgrad.run(op, {"x": g, "local_count": c, "global_count": c})["out"]
        np.testing.assert_array_equal(out, g)


def test_exchange_empty():
    c = np.array([0, 0], np.int64)
    out = tvmgrad.run("global_gather_grad", {"out_grad": np.zeros((0, 4)), "local_count": c,
                                             "global_count": c})["x_grad"]
    assert out.shape == (0, 4)


@pytest.mark.parametrize("op", ["global_gather_grad", "global_scatter_grad"])
def test_exchange_bad_input(op):
    g = np.ones((7, 5))
    c = np.array([3, 4], np.int64)

    def run(**kw):
        return tvmgrad.run(op, {"out_grad": g, "local_count": c, "global_count": c, **kw})

    with pytest.raises(ValueError, match="global_count.*must equal 'local_count'"):
        run(global_count=np.array([4, 3], np.int64))
    with pytest.raises(ValueError, match=rf"^{op}: the counts sum to 6 rows but input 'out_grad' has 7"):
        run(local_count=np.array([2, 4], np.int64), global_count=np.array([2, 4], np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        run(local_count=np.array([8, -1], np.int64), global_count=np.array([8, -1], np.int64))
    with pytest.raises(ValueError, match="same length"):
        run(global_count=np.array([3, 4, 0], np.int64))
    with pytest.raises(ValueError, match="'local_count' must be 1-D"):
        run(local_count=c[None], global_count=c[None])
    with pytest.raises(ValueError, match=rf"^{op}: out_grad must be 2-D"):     # its own names
        run(out_grad=np.ones((7,)))


@pytest.mark.parametrize("op", ["global_gather_grad", "global_scatter_grad"])
def test_exchange_multi_rank_raises(op, two_ranks):
    c = np.array([3, 4], np.int64)
    with pytest.raises(NotImplementedError, match="world size 2.*all-to-all"):
        tvmgrad.run(op, {"out_grad": np.ones((7, 5)), "local_count": c, "global_count": c},
                    {"ring_id": 3})


# ------------------------------------------------------------------------------------------
# parameter-server pushes

def _merge_ref(ids, grads, groups, skip=None, scale=1.0):
    ids = [np.asarray(i).reshape(-1) for i in ids]
    grads = [np.asarray(g, np.float64) for g in grads]
    outs = []
    for s, (i, g) in enumerate(zip(ids, grads)):
        out = np.zeros_like(g)
        for r, key in enumerate(i):
            if skip is not None and key == skip:
                continue
            for s2 in range(len(ids)):
                if groups[s2] != groups[s]:
                    continue
                out[r] += grads[s2][ids[s2] == key].sum(0)
        outs.append(out * scale)
    return outs


def _close(got, want, dtype):
    for s, (g, w) in enumerate(zip(got, want)):
        assert_close(f"slot{s}", g, cast(w, dtype), dtype,
                     atol={"float16": 4e-3, "bfloat16": 3e-2}.get(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("attrs", [{}, {"padding_id": 3}, {"padding_id": 0,
                                                            "scale_sparse_grad": False}])
def test_pull_sparse_v2_grad(dtype, attrs):
    rng = _rng(1)
    ids = [np.array([[3], [1], [3], [0], [5]], np.int64), np.array([3, 7, 0, 3, 1], np.int64)]
    grads = [cast(rng.standard_normal((5, 11)), dtype) for _ in ids]
    out = tvmgrad.run("pull_sparse_v2_grad", {"ids": ids, "w": [cast(rng.standard_normal((8, 11)), dtype)],
                                              "out_grad": grads}, attrs)["out_grad_out"]
    scale = 5.0 if attrs.get("scale_sparse_grad", True) else 1.0
    want = _merge_ref(ids, [cast(g, "float64") for g in grads], [0, 0],
                      skip=attrs.get("padding_id", 0), scale=scale)
    _close(out, want, dtype)
    skip = attrs.get("padding_id", 0)
    assert (out[0][ids[0][:, 0] == skip] == 0).all()


def test_pull_sparse_v2_grad_shapes():
    rng = _rng(2)
    ids = [rng.integers(0, 4, (9,)).astype(np.int64)]
    g = [rng.standard_normal((9, 3))]
    out = tvmgrad.run("pull_sparse_v2_grad", {"ids": ids, "w": [np.zeros((4, 3))], "out_grad": g},
                      {"embedding_dim": 3, "padding_id": -1})["out_grad_out"]
    _close(out, _merge_ref(ids, g, [0], skip=-1, scale=9.0), "float64")
    out = tvmgrad.run("pull_sparse_v2_grad", {"ids": [np.zeros((0, 1), np.int64)],
                                              "w": [np.zeros((4, 3))],
                                              "out_grad": [np.zeros((0, 3))]},
                      {"embedding_dim": 3})["out_grad_out"]
    assert out[0].shape == (0, 3)


def test_pull_sparse_v2_grad_bad_input(two_ranks):
    ids, g = [np.array([1, 2], np.int64)], [np.ones((2, 11))]
    with pytest.raises(NotImplementedError, match="pull_sparse_v2_grad.*world size 2"):
        tvmgrad.run("pull_sparse_v2_grad", {"ids": ids, "w": [np.ones((3, 11))], "out_grad": g})


def test_pull_sparse_v2_grad_bad_shapes():
    ids, w = [np.array([1, 2], np.int64)], [np.ones((3, 11))]
    op = "pull_sparse_v2_grad"
    with pytest.raises(ValueError, match=f"{op}.*'out_grad\\[0\\]' must have 11 columns"):
        tvmgrad.run(op, {"ids": ids, "w": w, "out_grad": [np.ones((2, 4))]})
    with pytest.raises(ValueError, match=f"{op}.*ids\\[0\\]"):
        tvmgrad.run(op, {"ids": [np.array([1, 2, 3], np.int64)], "w": w,
                         "out_grad": [np.ones((2, 11))]})
    with pytest.raises(ValueError, match=f"{op}.*same batch size"):
        tvmgrad.run(op, {"ids": [ids[0], np.array([1], np.int64)], "w": w,
                         "out_grad": [np.ones((2, 11)), np.ones((1, 11))]})
    with pytest.raises(ValueError, match=f"{op}.*as many"):
        tvmgrad.run(op, {"ids": ids * 2, "w": w, "out_grad": [np.ones((2, 11))]})
    with pytest.raises((ValueError, TypeError), match=f"{op}.*ids"):
        tvmgrad.run(op, {"ids": [np.array([1.0, 2.0])], "w": w, "out_grad": [np.ones((2, 11))]})


@pytest.mark.parametrize("dtype", FLOATS)
def test_push_gpups_sparse(dtype):
    rng = _rng(3)
    ids = [np.array([[3], [1], [3], [9]], np.int64), np.array([[1], [7], [2], [3]], np.int64),
           np.array([[3], [3], [1], [1]], np.int64)]
    grads = [cast(rng.standard_normal((4, w)), dtype) for w in (6, 6, 4)]
    out = tvmgrad.run("push_gpups_sparse", {"ids": ids, "out_grad": grads},
                      {"size": [6, 6, 4]})["out_grad_grad"]
    _close(out, _merge_ref(ids, [cast(g, "float64") for g in grads], [6, 6, 4]), dtype)


def test_push_gpups_sparse_no_size():
    rng = _rng(4)
    ids = [np.array([5, 5, 2], np.int64), np.array([2, 0, 5], np.int64)]
    grads = [rng.standard_normal((3, 2)) for _ in ids]
    out = tvmgrad.run("push_gpups_sparse", {"ids": ids, "out_grad": grads},
                      {"size": []})["out_grad_grad"]
    _close(out, _merge_ref(ids, grads, [0, 0]), "float64")
    with pytest.raises(ValueError, match="push_gpups_sparse.*different widths.*'size'"):
        tvmgrad.run("push_gpups_sparse", {"ids": ids, "out_grad": [grads[0], np.ones((3, 4))]},
                    {"size": []})


def test_push_gpups_sparse_bad_input(two_ranks):
    ids, g = [np.array([1, 2], np.int64)], [np.ones((2, 3))]
    with pytest.raises(NotImplementedError, match="push_gpups_sparse.*world size 2.*HeterComm"):
        tvmgrad.run("push_gpups_sparse", {"ids": ids, "out_grad": g}, {"size": [3]})


def test_push_gpups_sparse_bad_shapes():
    op = "push_gpups_sparse"
    ids, g = [np.array([1, 2], np.int64)], [np.ones((2, 3))]
    with pytest.raises(ValueError, match=f"{op}.*'size'.*one embedding width per slot"):
        tvmgrad.run(op, {"ids": ids, "out_grad": g}, {"size": [3, 3]})
    with pytest.raises(ValueError, match=f"{op}.*'out_grad\\[0\\]' must have 4 columns"):
        tvmgrad.run(op, {"ids": ids, "out_grad": g}, {"size": [4]})
    with pytest.raises(ValueError, match=f"{op}.*out_grad\\[0\\]' must be 2-D"):
        tvmgrad.run(op, {"ids": ids, "out_grad": [np.ones(2)]}, {"size": [3]})
    with pytest.raises(ValueError, match=f"{op}.*as many"):
        tvmgrad.run(op, {"ids": ids * 2, "out_grad": g}, {"size": [3]})
