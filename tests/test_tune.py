"""meta_schedule tuning: databases that are written, shipped, applied and rejected when broken."""

import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import tvmgrad
from tvmgrad import aot, tune, tuned
from tvmgrad.build import lower
from tvmgrad.targets import resolve

# meta_schedule searches (minutes on 2 cores): with -m slow, which CI runs after the default run
pytestmark = pytest.mark.slow

SIZE = 4096


@pytest.fixture
def no_db():
    yield
    tuned.use_database(None)


@pytest.fixture(scope="module")
def tuned_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuning")
    results = tune.tune(["relu_grad"], db=root, trials=4, size=SIZE, keep="always", log=lambda *_: None)
    return root, results


def _inputs():
    x = np.linspace(-1, 1, SIZE).astype("float32")
    return {"out": x, "out_grad": x * 3}


def test_tuning_writes_a_shippable_database(tuned_db):
    root, results = tuned_db
    (result,) = results
    assert result.recorded and result.tuned_us > 0 and result.rules_us > 0
    (path,) = list(root.rglob("float32.json"))
    data = json.loads(path.read_text())
    assert data["format"] == "tvmgrad-tuning-db" and data["dtype"] == "float32"
    assert data["target"] == resolve("llvm").key
    (record,) = data["records"]
    assert record["op"] == "relu_grad" and record["shapes"] == [[SIZE]] * 3
    assert record["trace"].lstrip().startswith(("# from tvm", "def apply_trace"))


def test_database_is_applied_to_matching_calls_only(tuned_db, no_db):
    root, _ = tuned_db
    plain = tvmgrad.prepare("relu_grad", _inputs())
    tuned.use_database(root)
    specialised = tvmgrad.prepare("relu_grad", _inputs())
    assert specialised.plan.trace is not None and specialised.plan.symbol != plain.plan.symbol
    # the compiled kernel differs: static sizes and the tuned loop nest
    assert lower(specialised.plan, resolve("llvm")).script() != lower(plain.plan, resolve("llvm")).script()
    np.testing.assert_array_equal(specialised()["x_grad"], plain()["x_grad"])
    other = tvmgrad.prepare("relu_grad", {k: v[:100] for k, v in _inputs().items()})
    assert other.plan.trace is None                      # other sizes keep the rule-based kernel


def test_environment_variable_selects_the_database(tuned_db, no_db, monkeypatch):
    root, _ = tuned_db
    monkeypatch.setenv("TVMGRAD_TUNING_DB", str(root))
    tuned.use_database(None)
    assert tvmgrad.prepare("relu_grad", _inputs()).plan.trace is not None


def test_corrupt_and_foreign_databases_are_rejected(tuned_db, tmp_path, no_db):
    root, _ = tuned_db
    (path,) = list(root.rglob("float32.json"))
    bad = tmp_path / "bad" / path.parent.name
    bad.mkdir(parents=True)
    (bad / "float32.json").write_text("{ not json")
    tuned.use_database(tmp_path / "bad")
    with pytest.raises(tuned.DatabaseError, match="corrupt"):
        tvmgrad.prepare("relu_grad", _inputs())
    data = json.loads(path.read_text())
    data["target"] = '{"kind": "cuda", "arch": "sm_90"}'
    (bad / "float32.json").write_text(json.dumps(data))
    tuned.use_database(tmp_path / "bad")
    with pytest.raises(tuned.DatabaseError, match="was tuned for target"):
        tvmgrad.prepare("relu_grad", _inputs())
    (bad / "float32.json").write_text(json.dumps({"hello": 1}))
    tuned.use_database(tmp_path / "bad")
    with pytest.raises(tuned.DatabaseError, match="not a tvmgrad tuning database"):
        tvmgrad.prepare("relu_grad", _inputs())


def test_interrupted_tuning_leaves_a_usable_database(tmp_path, monkeypatch, no_db):
    from tvm.s_tir import meta_schedule as ms
    real = ms.tune_tir
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(ms, "tune_tir", flaky)
    with pytest.raises(KeyboardInterrupt):
        tune.tune(["relu_grad", "sigmoid_grad"], db=tmp_path, trials=4, size=SIZE, keep="always",
                  log=lambda *_: None)
    db = tuned.Database(tmp_path)
    assert [r.op for r in db.records(resolve("llvm").key, "float32")] == ["relu_grad"]
    assert not list(tmp_path.rglob("*.tmp"))
    tuned.use_database(tmp_path)
    assert tvmgrad.prepare("relu_grad", _inputs()).plan.trace is not None


def test_only_below_skips_kernels_that_reach_the_roofline(tmp_path):
    results = tune.tune(["relu_grad"], db=tmp_path, trials=4, size=SIZE, only_below=0.0,
                        log=lambda *_: None)
    assert results[0].skipped and not results[0].recorded


def test_aot_library_carries_tuned_kernels(tuned_db, tmp_path):
    root, _ = tuned_db
    manifest = aot.build(tmp_path / "lib", ops=["relu_grad"], jobs=1, progress=False, tuning_db=str(root),
                         cpu="host")      # the records were tuned for the host
    entries = manifest["libraries"][0]["entries"]
    assert {e["schedule"] for e in entries} == {"rules", "tuned"}
    lib = tvmgrad.load_library(tmp_path / "lib")
    got = lib.run("relu_grad", _inputs())["x_grad"]
    x = _inputs()["out"]
    np.testing.assert_array_equal(got, np.where(x > 0, x * 3, 0))


def test_a_tuned_plan_names_the_plan_it_was_tuned_from(tuned_db, no_db):
    root, _ = tuned_db
    plain = tvmgrad.prepare("relu_grad", _inputs()).plan
    tuned.use_database(root)
    specialised = tvmgrad.prepare("relu_grad", _inputs()).plan
    assert specialised.key != plain.key and specialised.base_key == plain.key == plain.base_key
    assert specialised.tuned_from == plain.key and plain.tuned_from is None


def _relu_grad_graph(target):
    from tvm import relax

    import tvmgrad.relax as tr
    x = relax.Var("out", relax.TensorType((SIZE,), "float32"))
    g = relax.Var("out_grad", relax.TensorType((SIZE,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g]):
        with bb.dataflow():
            out = bb.emit_output(tr.emit(bb, "relu_grad", {"out": x, "out_grad": g}, target=target))
        bb.emit_func_output(out)
    return bb.get()


def _assert_same_kernel(a, b):
    """The same parameters and loop nest (attributes aside: Relax's carry tvmgrad.op...)."""
    import tvm
    from tvm import tirx
    tvm.ir.assert_structural_equal(tirx.PrimFunc(a.params, a.body), tirx.PrimFunc(b.params, b.body))


@pytest.mark.parametrize("when", ["at emit", "by schedule_kernels"])
def test_relax_kernels_are_tuned_like_run_s(tuned_db, no_db, when):
    """A Relax kernel of the sizes a record was tuned for gets its trace, through build.lower."""
    import tvmgrad.relax as tr
    root, _ = tuned_db
    tuned.use_database(root)
    specialised = tvmgrad.prepare("relu_grad", _inputs()).plan
    import tvm
    from tvm import relax, tirx
    want = lower(specialised, resolve("llvm"))["main"]
    if when == "at emit":
        mod = _relu_grad_graph("llvm")
    else:
        mod = tr.schedule_kernels(_relu_grad_graph(None), "llvm")
    (got,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    _assert_same_kernel(got, want)
    vm = relax.VirtualMachine(tvm.compile(mod, target=resolve("llvm").target), tvm.cpu())
    x = _inputs()
    got = vm["main"](*(tvm.runtime.tensor(x[k]) for k in ("out", "out_grad"))).numpy()
    np.testing.assert_array_equal(got, np.where(x["out"] > 0, x["out_grad"], 0))


def _wait_for_port(port, log, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    pytest.fail(f"the RPC tracker did not open port {port}: {log.read_text()[-2000:]}")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tuning_through_an_rpc_tracker_with_two_servers(tmp_path):
    """TVM's own tracker and RPC servers on loopback; meta_schedule's RPC runner measures there."""
    port = _free_port()
    key = "tvmgrad-test"
    py = sys.executable
    tracker_log = tmp_path / "tracker.log"
    procs = [subprocess.Popen([py, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                               "--port-end", str(port + 1)],
                              stdout=open(tracker_log, "w"), stderr=subprocess.STDOUT)]
    logs = [tmp_path / f"server{i}.log" for i in range(2)]
    try:
        _wait_for_port(port, tracker_log)
        for log in logs:
            server_port = _free_port()
            procs.append(subprocess.Popen(
                [py, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", key,
                 "--host", "127.0.0.1", "--port", str(server_port), "--port-end", str(server_port + 1)],
                stdout=open(log, "w"), stderr=subprocess.STDOUT))
        deadline = time.time() + 90
        status = ""
        while time.time() < deadline:
            status = subprocess.run([py, "-m", "tvm.exec.query_rpc_tracker", "--host", "127.0.0.1",
                                     "--port", str(port)], capture_output=True, text=True).stdout
            if any(line.split()[:2] == [key, "2"] for line in status.splitlines()):
                break
            time.sleep(2)
        else:
            pytest.fail(f"the RPC servers did not register with the tracker:\n{status}")
        results = tune.tune(["relu_grad"], db=tmp_path / "db", trials=4, size=SIZE, keep="always",
                            rpc=f"127.0.0.1:{port}:{key}", log=lambda *_: None)
        assert results[0].recorded
        served = [log.read_text().count("load_module") for log in logs]
        assert sum(served) >= 1, "no candidate was measured on the RPC servers"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
