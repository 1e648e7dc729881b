"""GPU bundles (scripts/gpu_bundle.py, scripts/gpu_run.py) as a CPU dry run: a small LLVM bundle is
built here and run by a Python that can import numpy, ml_dtypes and yaml and nothing else (no TVM,
no checkout, no venv): what the device gets. Faulting workers are reported and skipped."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from tvmgrad import gpu_bundle as gb

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNNER = ROOT / "scripts" / "gpu_run.py"
# pointwise (two bool variants), indexing (a deterministic scatter), shape (Tensor[] output),
# norm (row reductions), scan: five te_defs modules, five shards
OPS = ["relu_grad", "gelu_grad", "gather_grad", "concat_grad", "layer_norm_grad", "cumsum_grad"]
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-bundle") / "bundle"
    manifest = gb.build_bundle(out, target="llvm", dtypes=("float32",), ops=OPS, jobs=2,
                               python_version=HERE, progress=False, log=lambda *a: None)
    return out, manifest


@pytest.fixture(scope="module")
def clean_site(tmp_path_factory):
    """A folder holding only what the device's Python has of its own: numpy, ml_dtypes, yaml."""
    site = tmp_path_factory.mktemp("clean-site")
    for name in ("numpy", "ml_dtypes", "yaml", "_yaml"):
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        folder = pathlib.Path(list(spec.submodule_search_locations)[0])
        (site / name).symlink_to(folder)
        libs = folder.parent / f"{name}.libs"               # numpy's bundled OpenBLAS
        if libs.is_dir():
            (site / libs.name).symlink_to(libs)
    return site


def _run_clean(clean_site, cwd, *args, timeout=240):
    """gpu_run.py under ``python -S -s`` with PYTHONPATH = the clean site only, outside the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=str(clean_site), PYTHONNOUSERSITE="1")
    cmd = [sys.executable, "-S", "-s", str(RUNNER), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_clean_python_cannot_see_tvm_or_tvmgrad(clean_site, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(clean_site)
    code = ("import importlib.util as u, numpy, ml_dtypes, yaml; "
            "print([u.find_spec(m) is None for m in ('tvm', 'tvm_ffi', 'tvmgrad', 'filelock')])")
    proc = subprocess.run([sys.executable, "-S", "-s", "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[True, True, True, True]"


def test_bundle_manifest(bundle):
    out, manifest = bundle
    assert json.loads((out / gb.MANIFEST).read_text())["shards"] == manifest["shards"]
    assert manifest["target"] == "llvm" and manifest["ops"] == sorted(OPS)
    assert len(manifest["shards"]) == 5 and manifest["cases"] == manifest["entries"] >= len(OPS) + 1
    assert not manifest["uncovered_entries"] and not manifest["skipped"]
    assert manifest["references"]["method"] == "run"
    assert f"-cp{HERE.replace('.', '')}-" in manifest["wheel"]["file"]
    assert set(manifest["native"]) == {"libtvm_runtime.so"}
    assert manifest["python"]["deps"].keys() == set(gb.PURE_DEPS)
    for name, record in manifest["files"].items():
        assert (out / name).stat().st_size == record["bytes"]
    assert manifest["bytes"] < manifest["limit_bytes"]


def test_dry_run_passes_every_entry_without_tvm(bundle, clean_site, tmp_path):
    out, manifest = bundle
    proc = _run_clean(clean_site, tmp_path, out, "--out", tmp_path / "res", "--work", tmp_path / "work",
                      "--check-no-tvm", "--jobs", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "res" / "results.json").read_text())
    summary = result["summary"]
    assert summary["all_passed"] and summary["tvm_free"], summary
    assert summary["entries"] == manifest["cases"] == summary["passed"]
    assert {e["op"] for e in result["entries"]} == set(OPS)
    for e in result["entries"]:
        assert e["status"] == "passed" and e["bit_identical"], e
        assert e["time_us"] > 0 and e["nbytes"] > 0, e
        assert e["max_abs"] <= e["tol"]
    bench = {b["op"]: b for b in result["bench"]}
    for op in ("relu_grad", "gelu_grad"):                  # pointwise: the bench call has a kernel
        assert bench[op]["status"] == "ok" and bench[op]["ours_us"] > 0 and bench[op]["copy_us"] > 0
    work = str(tmp_path / "work")
    for shard in result["shards"]:
        tvm = shard["tvm"]
        assert shard["complete"] and not shard["error"]
        assert tvm["modules"] == [] and tvm["stub_import_attempts"] == 0 and not tvm["compiler_mapped"]
        assert tvm["tvmgrad_from"].startswith(work) and tvm["tvm_ffi_from"].startswith(work)
        assert any(p.endswith("libtvm_runtime.so") and p.startswith(work) for p in tvm["mapped"])
        assert tvm["cache_files"] == 0                    # nothing was compiled
    text = (tmp_path / "res" / "results.txt").read_text()
    assert f"entries: {summary['entries']}/{summary['entries']} passed" in text and "relu_grad" in text


def test_faulting_workers_are_reported_and_skipped(bundle, clean_site, tmp_path):
    out, manifest = bundle
    bad = tmp_path / "bundle"
    shutil.copytree(out, bad)
    stems = {s["ops"][0]: s["stem"] for s in manifest["shards"]}
    norm = next(s for s in manifest["shards"] if "layer_norm_grad" in s["ops"])
    cases = bad / norm["cases_file"]
    cases.write_bytes(cases.read_bytes()[: cases.stat().st_size // 2])          # truncated
    proc = _run_clean(clean_site, tmp_path, bad, "--out", tmp_path / "res", "--jobs", "2",
                      "--bench-size", "0", "--shard-timeout", "12",
                      "--inject-fault", f"{stems['gelu_grad']}:segv",        # dies in its first call
                      "--inject-fault", f"{stems['cumsum_grad']}:hang",      # hangs in its first call
                      timeout=200)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "res" / "results.json").read_text())
    by_shard = {}
    for e in result["entries"]:
        by_shard.setdefault(e["shard"], []).append(e["status"])
    assert by_shard[stems["gelu_grad"]][0] == "crashed"
    assert by_shard[stems["cumsum_grad"]][0] == "timeout"
    assert set(by_shard[norm["stem"]]) == {"shard_failed"}
    # the rest of each faulting shard ran in a fresh worker, and the other shards ran as usual
    for stem in (stems["gelu_grad"], stems["cumsum_grad"]):
        assert by_shard[stem][1:] and set(by_shard[stem][1:]) == {"passed"}
    for stem in (stems["concat_grad"], stems["gather_grad"]):
        assert set(by_shard[stem]) == {"passed"}
    shards = {s["stem"]: s for s in result["shards"]}
    assert [a["outcome"] for a in shards[stems["gelu_grad"]]["attempts"]] == \
        ["killed by SIGSEGV", "exit status 0"]
    assert shards[stems["cumsum_grad"]]["attempts"][0]["outcome"] == "timeout"
    assert "sha256" in shards[norm["stem"]]["error"]
    assert result["summary"]["wall_s"] < 150


def test_cases_round_trip_types_and_half_dtypes(tmp_path):
    bf = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    value = {"x": bf, "xs": [np.ones(2, np.float16), None], "idx": np.arange(3, dtype=np.int64),
             "attrs": {"axis": (0, 1), "scale": np.float32(0.5), "flag": True, "name": "NCHW",
                       "lst": [1, 2.5]}}
    arrays = {}
    tree = gb.encode(value, arrays, "c0")
    gb.save_cases(tmp_path / "c.npz", {"tree": tree}, arrays)
    index, loaded = gb.load_cases(tmp_path / "c.npz")
    back = gb.decode(index["tree"], loaded)
    assert back["x"].dtype == bf.dtype and np.array_equal(back["x"].view(np.uint16), bf.view(np.uint16))
    assert back["xs"][0].dtype == np.float16 and back["xs"][1] is None
    assert back["attrs"]["axis"] == (0, 1) and isinstance(back["attrs"]["axis"], tuple)
    assert type(back["attrs"]["scale"]) is np.float32 and back["attrs"]["lst"] == [1, 2.5]
    assert gb.bit_identical(back, value)


def test_compare_uses_the_gpu_test_tolerances():
    w = np.array([1.0, np.nan, 2.0], np.float32)
    assert gb.compare({"g": w * (1 + 1e-4)}, {"g": w}, "float32")["ok"]
    bad = gb.compare({"g": w * (1 + 1e-2)}, {"g": w}, "float32")
    assert not bad["ok"] and "off by more than" in bad["problems"][0]
    assert gb.compare({"g": w.astype(ml_dtypes.bfloat16)}, {"g": w.astype(ml_dtypes.bfloat16)}, "bfloat16")["ok"]
    assert not gb.compare({"g": np.array([1.0, 1.0, 2.0], np.float32)}, {"g": w}, "float32")["ok"]
    assert not gb.compare({"g": [w, None]}, {"g": [w, w]}, "float32")["ok"]


def test_torch_tensors_through_the_library_give_torch_results_equal_to_numpy(bundle, tmp_path):
    """gpu_run's device-path section (run with torch tensors by DLPack) on the CPU: the bundle's
    library called with torch tensors returns torch tensors with the numpy call's values."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("gpu_run", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    out, manifest = bundle
    files = json.loads((out / runner.MANIFEST).read_text())
    runner.unpack(out, tmp_path / "work", files)
    lib = tvmgrad.load_library(tmp_path / "work" / "lib")
    checked = 0
    for shard in files["shards"]:
        index, arrays = gb.load_cases(out / shard["cases_file"])
        for case in index["cases"]:
            inputs, attrs = gb.decode(case["inputs"], arrays), gb.decode(case["attrs"], arrays)
            got = lib.run(case["op"], inputs, attrs)
            verdict = runner._resident_check(lib, case["op"], case["dtype"], inputs, attrs, got,
                                             False, gb, np)
            assert verdict == "passed", (case["op"], verdict)
            checked += 1
    assert checked == manifest["cases"]
