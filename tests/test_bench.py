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
