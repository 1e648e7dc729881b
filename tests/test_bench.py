"""``tvmgrad bench`` runs end to end: our kernel, Paddle, PyTorch (when installed) and the roofline
in one table (figures are reported, never asserted)."""

import subprocess
import sys

import pytest


def _bench(*args):
    proc = subprocess.run([sys.executable, "-m", "tvmgrad.cli", "bench", *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow      # the default run keeps test_bench_without_paddle_or_torch_prints_na's table
def test_bench_prints_one_row_per_op_with_ratios():
    out = _bench("relu_grad", "atan2_grad:bcast", "--size", "65536", "--repeat", "3", "--rounds", "2")
    lines = out.splitlines()
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("---"))) + 1:-1]
    rows = {line.split()[0]: line for line in table}
    assert len(rows) == 2, out
    assert "relu_grad" in rows and "atan2_grad" in rows, out
    assert "(broadcast)" in rows["atan2_grad"]
    assert "copy of the same bytes" in out and "x paddle" in out
    assert "taking turns op by op, 2 turns each" in out


def test_rounds_keep_the_best_time_and_the_median_of_medians():
    from tvmgrad.bench import _merge_turn
    rounds = [{"best_ms": 3.0, "median_ms": 4.0, "roofline_gbs": 30.0},
              {"missing": "its process failed"},
              {"best_ms": 2.0, "median_ms": 5.0, "roofline_gbs": 20.0},
              {"best_ms": 2.5, "median_ms": 9.0, "roofline_gbs": 35.0}]
    kept = None
    for r in rounds:
        kept = _merge_turn(kept, r)
    assert (kept["best_ms"], kept["median_ms"], kept["roofline_gbs"]) == (2.0, 5.0, 35.0)
    assert _merge_turn({"missing": "x"}, rounds[0])["best_ms"] == 3.0
    assert "missing" in _merge_turn(None, {"missing": "no reference for this op"})


@pytest.mark.slow
def test_bench_reports_gflops_for_compute_bound_ops():
    out = _bench("bmm_grad", "--repeat", "2")
    assert "GFLOP/s" in out, out


def _hide(tmp_path, *names) -> dict:
    """An environment in which ``import name`` fails, in every process (as when not installed)."""
    import os
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_bench_without_paddle_or_torch_prints_na(tmp_path):
    import os
    env = {**os.environ, **_hide(tmp_path, "paddle", "torch")}
    proc = subprocess.run([sys.executable, "-m", "tvmgrad.cli", "bench", "relu_grad", "atan2_grad:bcast",
                           "--size", "4096", "--repeat", "2"], capture_output=True, text=True,
                          timeout=600, env=env)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    lines = out.splitlines()
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("---"))) + 1:-1]
    rows = {line.split()[0]: line.split() for line in table}
    assert set(rows) == {"relu_grad", "atan2_grad"}, out
    # op, tvmgrad ms, median, GB/s, %roof, then torch ms, x torch, paddle ms, x paddle
    assert rows["relu_grad"][5:] == ["n/a"] * 4, out
    assert rows["atan2_grad"][6:] == ["n/a"] * 4, out          # "(broadcast)" is one more word
    float(rows["relu_grad"][1])                                # our own timing is still there
    assert "paddle is not installed: its columns read n/a" in out, out
    assert "torch is not installed: its columns read n/a" in out, out


@pytest.mark.slow
def test_bench_json_and_suite_cover_every_family(capsys):
    import json

    from tvmgrad import bench, cli, registry
    families = {registry.get(op).family for op in bench.SUITE}
    want = {"conv", "matmul", "attention", "fft", "linalg", "norm", "softmax", "indexing", "shape",
            "interp", "activation", "binary", "linear", "seqloss", "scan", "pool", "sort", "roi"}
    assert want <= families, want - families
    assert cli.main(["bench", "relu_grad", "--size", "4096", "--repeat", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    (row,) = record["rows"]
    assert row["op"] == "relu_grad" and row["ms"] > 0 and 0 < row["roofline"]
    assert row["roofline_gbs"] > 0 and record["threads"] >= 1


def test_bench_reference_calls_without_the_frameworks(monkeypatch):
    from tvmgrad import bench
    from tvmgrad.workloads import make_inputs
    monkeypatch.setitem(sys.modules, "paddle", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    inputs, attrs = make_inputs("relu_grad", 64, "float32", False)
    assert bench._paddle_fn("relu_grad", inputs, attrs) is None
    assert bench._torch_fn("relu_grad", inputs, attrs) is None


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="x86 CPU names")
def test_references_are_held_to_the_targets_isa(monkeypatch):
    from tvmgrad import bench
    monkeypatch.setenv("TVMGRAD_CPU", "x86-64-v3")           # AVX2, no AVX-512: both sides AVX2
    assert bench.same_isa_caps() == bench.AVX2_CAPS
    monkeypatch.setenv("TVMGRAD_CPU", "x86-64-v4")           # AVX-512: each side as the host has it
    assert bench.same_isa_caps() == {}


def test_bytes_count_only_the_inputs_the_kernel_reads():
    """silu_grad is passed ``out`` and never reads it; index_select_grad reads x's shape only:
    counting their bytes would overstate the GB/s and the share of the roofline."""
    import numpy as np

    from tvmgrad import planning
    from tvmgrad.bench import _read_by_kernel
    x = np.ones((4, 8), "float32")
    cases = [("silu_grad", {"x": x, "out": x, "out_grad": x}, None, {"x", "out_grad"}),
             ("relu_grad", {"out": x, "out_grad": x}, None, {"out", "out_grad"}),
             ("index_select_grad", {"x": x, "index": np.array([1, 0], "int64"),
                                    "out_grad": x[:2]}, {"axis": 0}, {"index", "out_grad"})]
    for op, inputs, attrs, want in cases:
        plan = planning.plan_call(op, inputs, attrs, target="llvm").plan
        assert _read_by_kernel(plan) == want, op


def test_a_worker_killed_by_a_signal_costs_one_job_and_the_next_starts_afresh():
    from tvmgrad.bench import _Worker
    job = {"op": "relu_grad", "broadcast": False, "size": 4096, "dtype": "float32", "repeat": 2}
    worker = _Worker("tvmgrad", 1)
    try:
        assert worker.measure(job)["best_ms"] > 0
        worker.proc.kill()
        lost = worker.measure(job)
        assert lost["missing"].startswith("its process failed"), lost
        assert worker.measure(job)["best_ms"] > 0
    finally:
        worker.close()


def test_a_kernel_and_its_roofline_take_turns_by_blocks():
    from tvmgrad.workloads import taking_turns
    calls = []
    timings = taking_turns([lambda: calls.append("kernel"), lambda: calls.append("copy")], 3)
    # blocks of consecutive calls, each started by untimed ones (the other evicted its data)
    assert calls == ["kernel"] * 2 + ["copy"] * 2 + (["kernel"] * 3 + ["copy"] * 3) * 3
    calls.clear()
    taking_turns([lambda: calls.append("kernel"), lambda: calls.append("copy")], 20)
    assert calls[4:] == (["kernel"] * 7 + ["copy"] * 7) * 4        # 2 untimed + 5 timed each
    calls.clear()
    taking_turns([lambda: calls.append("alone")], 3)
    assert calls == ["alone"] * 5
    assert len(timings) == 2 and all(best <= median for best, median in timings)
