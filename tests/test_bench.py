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


def test_bench_prints_one_row_per_op_with_ratios():
    out = _bench("relu_grad", "atan2_grad:bcast", "--size", "65536", "--repeat", "3")
    lines = out.splitlines()
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("---"))) + 1:-1]
    rows = {line.split()[0]: line for line in table}
    assert len(rows) == 2, out
    assert "relu_grad" in rows and "atan2_grad" in rows, out
    assert "(broadcast)" in rows["atan2_grad"]
    assert "copy roofline" in out and "x paddle" in out


@pytest.mark.slow
def test_bench_reports_gflops_for_compute_bound_ops():
    out = _bench("bmm_grad", "--repeat", "2")
    assert "GFLOP/s" in out, out


def _bench_here(monkeypatch, capsys, *ops, missing=()):
    """``tvmgrad bench`` in this process with the frameworks in ``missing`` made unimportable
    (``sys.modules[name] = None`` makes ``import name`` raise ImportError, as when not installed)."""
    import argparse

    from tvmgrad import bench
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)
    assert bench.main(argparse.Namespace(ops=list(ops), size=4096, dtype="float32", repeat=2)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("---"))) + 1:-1]
    return out, {line.split()[0]: line.split() for line in table}


def test_bench_without_paddle_or_torch_prints_na(monkeypatch, capsys):
    out, rows = _bench_here(monkeypatch, capsys, "relu_grad", "atan2_grad:bcast", missing=("paddle", "torch"))
    assert set(rows) == {"relu_grad", "atan2_grad"}, out
    # op, tvmgrad ms, GB/s, %roof, then paddle ms, x paddle, torch ms, x torch
    assert rows["relu_grad"][4:] == ["n/a"] * 4, out
    assert rows["atan2_grad"][5:] == ["n/a"] * 4, out          # "(broadcast)" is one more word
    float(rows["relu_grad"][1])                                # our own timing is still there
    assert "paddle is not installed: its columns read n/a" in out, out
    assert "torch is not installed: its columns read n/a" in out, out


def test_bench_reference_calls_without_the_frameworks(monkeypatch):
    from tvmgrad import bench
    monkeypatch.setitem(sys.modules, "paddle", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    inputs, attrs = bench.make_inputs("relu_grad", 64, "float32", False)
    assert bench._paddle_fn("relu_grad", inputs, attrs) is None
    assert bench._torch_fn("relu_grad", inputs, attrs) is None
