"""The command line as scripts use it: --version, --json, quiet logs, errors, cache management."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tvmgrad
from tvmgrad import cache, cli


def _tvmgrad(*args, env=None, check=True):
    proc = subprocess.run([sys.executable, "-m", "tvmgrad", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tvmgrad {tvmgrad.__version__} (apache-tvm 0.27")


def test_list_json_respects_filters(capsys):
    assert cli.main(["list", "--family", "scan", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    names = [op["name"] for op in record["ops"]]
    assert "cumsum_grad" in names and all(op["family"] == "scan" for op in record["ops"])
    assert record["total"] == len(names) < record["backward_ops"]
    assert cli.main(["list", "--family", "scan", "--summary"]) == 0
    assert f"(filtered: {len(names)} of {record['backward_ops']} ops)" in capsys.readouterr().out


def test_unknown_family_is_an_error(capsys):
    assert cli.main(["list", "--family", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown family 'nosuch'" in err and "activation" in err


def test_bench_relax_names_its_models(capsys):
    assert cli.main(["bench", "--relax", "resnet50"]) == 2
    err = capsys.readouterr().err
    assert "unknown model(s) resnet50 for --relax" in err and "resnet18" in err


def test_info_json_matches_the_spec(capsys):
    assert cli.main(["info", "cumprod_grad", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    spec = tvmgrad.registry.get("cumprod_grad").spec
    assert [a["name"] for a in record["args"]] == [p.name for p in spec.args]
    assert [o["name"] for o in record["outputs"]] == list(spec.output_names)
    assert "float32" in record["dtypes"] and record["te"]["file"].endswith("scan.py")


def test_verbosity_flags_before_and_after_the_command():
    args = cli._parser().parse_args(["-v", "list"])
    assert args.verbose == 1 and not args.quiet
    args = cli._parser().parse_args(["list", "-vv", "-q"])
    assert args.verbose == 2 and args.quiet


def test_no_progress_bar_in_a_log(tmp_path):
    """stderr is a pipe here: no tqdm `\\r` updates, and stdout holds only the JSON result."""
    proc = _tvmgrad("build", "--ops", "relu_grad", "--out", str(tmp_path / "lib"), "--jobs", "1",
                    "--json", env={"TVMGRAD_CACHE_DIR": str(tmp_path / "cache")})
    assert "\r" not in proc.stderr and "tvmgrad build" not in proc.stderr
    record = json.loads(proc.stdout)
    assert record["ops"] == 1 and record["cpu"]["mcpu"]


def _fill(root):
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    kc = cache.KernelCache(root)
    tvmgrad.run("relu_grad", {"out": x, "out_grad": x}, cache=kc)
    tvmgrad.run("sigmoid_grad", {"out": x, "out_grad": x}, cache=kc)


def test_cache_info_prune_clear(tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(root))
    _fill(root)
    stale = root / "tvm-0.1.0" / "llvm" / "relu_grad"          # another TVM's entry
    stale.mkdir(parents=True)
    (stale / "abc.so").write_bytes(b"x" * 100)
    assert cli.main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    current = info["current"][0]
    assert info["parts"][current]["entries"] == 2 and info["parts"]["tvm-0.1.0"]["entries"] == 1
    assert info["bytes"] > 0
    # nothing is 30 days old: prune removes only the other TVM's entry
    assert cli.main(["cache", "prune", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 1
    assert not stale.exists()
    # an entry last used 40 days ago goes; the fresh one stays
    old = time.time() - 40 * 86400
    for f in (root / current).rglob("relu_grad*/*"):
        os.utime(f, (old, old))
    for f in (root / current).glob("*/relu_grad/*"):
        os.utime(f, (old, old))
    r = cache.prune(older_than=30 * 86400)
    assert r["removed"] == 1 and r["kept"] == 1
    assert cache.usage()["parts"][current]["entries"] == 1
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert cache.usage()["entries"] == 0


def test_duration_parsing():
    assert cli._duration("30d") == 30 * 86400
    assert cli._duration("12h") == 12 * 3600
    assert cli._duration("2") == 2 * 86400
    with pytest.raises(Exception, match="not a duration"):
        cli._duration("soon")
