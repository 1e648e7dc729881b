"""Process pools fail fast, naming the job, when a worker dies (tvmgrad.workers).

The job functions live at the top of this module: spawned workers import them by name
(``test_workers``, from the sys.path the parent hands them, which holds tests/).
"""

import os
import signal
import time

import pytest

from tvmgrad import cli, workers
from tvmgrad.workers import WorkerDied

FAST = 30          # seconds: a dead worker must be reported at once, not after a hang


def _job(job):
    """("name", action): return the name, sleep ("sleep", "sleep60"), raise or kill this process
    with a signal ("SIGKILL")."""
    name, action = job
    if action == "sleep":
        time.sleep(0.3)
    elif action == "sleep60":
        time.sleep(60)
    elif action == "raise":
        raise ValueError(f"{name} refused")
    elif action != "ok":
        os.kill(os.getpid(), getattr(signal, action))
        time.sleep(10)                      # the signal is delivered before this returns
    return name


def _describe(job):
    return f"{job[0]} [float32]"


def _run(jobs, workers_=2):
    return list(workers.imap_unordered(_job, jobs, workers=workers_, describe=_describe))


def test_results_of_every_job():
    jobs = [(f"op{i}", "sleep" if i % 3 == 0 else "ok") for i in range(7)]
    assert sorted(_run(jobs)) == sorted(name for name, _ in jobs)
    assert _run([]) == []


def test_an_exception_in_a_job_is_raised():
    with pytest.raises(ValueError, match="op1 refused"):
        _run([("op0", "ok"), ("op1", "raise"), ("op2", "sleep")])


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGILL", "SIGSEGV"])
def test_a_dead_worker_names_its_job_and_signal(sig):
    jobs = [("gelu_grad", "sleep"), ("relu_grad", sig)] + [(f"op{i}", "sleep") for i in range(8)]
    start = time.monotonic()
    with pytest.raises(WorkerDied) as info:
        _run(jobs)
    assert time.monotonic() - start < FAST
    message = str(info.value)
    assert "relu_grad [float32]" in message and sig in message, message
    assert info.value.jobs == ["relu_grad [float32]"] and info.value.cause == sig
    assert "gelu_grad" not in message                # the other worker's job did not die
    assert "cancelled" in message


def test_a_death_is_seen_while_the_other_worker_is_busy():
    # the executor may not watch a worker spawned while it waited; the dead one is still found
    for _ in range(3):
        start = time.monotonic()
        with pytest.raises(WorkerDied, match=r"relu_grad \[float32\].*SIGKILL"):
            _run([("busy", "sleep60"), ("relu_grad", "SIGKILL")])
        assert time.monotonic() - start < FAST


def test_a_dead_single_worker():
    start = time.monotonic()
    with pytest.raises(WorkerDied, match=r"shard activation-0 \[float32\].*SIGKILL"):
        list(workers.imap_unordered(_job, [("shard activation-0", "SIGKILL")], workers=1,
                                    describe=_describe))
    assert time.monotonic() - start < FAST


def _dies_on_relu(job):
    """Stands in for tvmgrad.check._work: relu_grad's worker dies of SIGILL."""
    op, dtype, target = job
    if op == "relu_grad" and dtype == "float32":
        os.kill(os.getpid(), signal.SIGILL)
        time.sleep(10)
    return []


def test_check_build_fails_fast_naming_the_op(monkeypatch, capsys):
    from tvmgrad import check
    monkeypatch.setattr(check, "_ops", lambda: ["gelu_grad", "relu_grad", "sign_grad"])
    monkeypatch.setattr(check, "_work", _dies_on_relu)      # pickled by name: crosses spawn
    start = time.monotonic()
    with pytest.raises(WorkerDied, match=r"relu_grad \[float32\].*SIGILL"):
        check.build_and_run_all("llvm", ["float32", "float64"], jobs=2)
    # the command line reports it as an error
    assert cli.main(["check", "--build", "--dtype", "float32", "--jobs", "2"]) == 2
    assert time.monotonic() - start < 2 * FAST
    err = capsys.readouterr().err
    assert "tvmgrad: error:" in err and "relu_grad [float32]" in err and "SIGILL" in err


def _dies_on_shard(job):
    """Stands in for tvmgrad.aot._obtain_shard: the worker of a relu_grad shard is killed."""
    shard = job[0]
    if "relu_grad" in shard.ops:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)                          # the other shard: ended when its sibling dies


def test_build_fails_fast_naming_the_shard(monkeypatch, tmp_path, capsys):
    from tvmgrad import aot
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(tmp_path / "cache"))   # nothing cached
    monkeypatch.setattr(aot, "_obtain_shard", _dies_on_shard)
    out = tmp_path / "lib"
    start = time.monotonic()
    code = cli.main(["build", "--out", str(out), "--ops", "relu_grad", "concat_grad",
                     "--jobs", "2"])
    assert time.monotonic() - start < 2 * FAST
    err = capsys.readouterr().err
    assert code == 2
    assert "tvmgrad: error:" in err and "SIGKILL" in err, err
    assert "shard activation-0 [float32] (relu_grad)" in err and "linear" not in err, err
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp dirs


SIGPIPE_DEFAULT = """
import signal, sys
sys.path[:0] = [{tests!r}]
signal.signal(signal.SIGPIPE, signal.SIG_DFL)       # as tvmgrad's command line sets it
import test_workers as t
from tvmgrad import workers
if __name__ == "__main__":
    for _ in range(2):
        for jobs in ([("op0", "ok"), ("op1", "raise"), ("op2", "sleep")],
                     [("op0", "sleep"), ("op1", "SIGKILL")], [("op0", "sleep60"), ("op1", "SIGKILL")]):
            try:
                t._run(jobs)
            except (ValueError, workers.WorkerDied) as exc:
                print(type(exc).__name__)
    print("alive")
"""


def test_a_dead_worker_does_not_kill_the_parent_by_sigpipe(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "pipe.py"
    script.write_text(SIGPIPE_DEFAULT.format(tests=os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    # without SIGPIPE ignored during the pool, this died with exit code 141 within 2 rounds
    assert proc.stdout.split() == ["ValueError", "WorkerDied", "WorkerDied"] * 2 + ["alive"]
