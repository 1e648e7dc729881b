"""A process pool that cannot hang when a worker dies.

``multiprocessing.Pool`` silently replaces a worker killed by a signal (SIGILL from code built for
a CPU feature the host lacks, SIGSEGV or SIGBUS in native code, SIGKILL from the out-of-memory
killer): the job it was running is lost and ``imap_unordered`` waits for its result forever.
``concurrent.futures.ProcessPoolExecutor`` notices the death but cannot say which job died.
Pebble's pool fails exactly the dead worker's future (``ProcessExpired``, with the exit code), so
``imap_unordered`` here raises :class:`WorkerDied` naming that job and its signal at once, and
stops the rest.

Every process pool of tvmgrad (``tvmgrad check --build``, the shard builds of ``tvmgrad build``,
the CUDA build tests) goes through it. Jobs and ``fn`` must pickle (``fn`` importable by name):
workers are spawned, never forked, since TVM's threads do not survive a fork.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import as_completed

from pebble import ProcessExpired, ProcessPool

__all__ = ["imap_unordered", "WorkerDied"]

_HINTS = {
    "SIGILL": "an illegal instruction: code for a CPU feature this host does not enable?",
    "SIGKILL": "killed from outside, e.g. by the out-of-memory killer?",
    "SIGSEGV": "a crash in native code",
    "SIGBUS": "a crash in native code (a truncated or changed mapped file?)",
}


class WorkerDied(RuntimeError):
    """A worker process died (killed by a signal or exited) while running a job.

    ``jobs``: the described job it was running; ``cause``: "SIGILL", "exit code 3", ...
    """

    def __init__(self, message: str, jobs=(), cause: str | None = None):
        super().__init__(message)
        self.jobs = list(jobs)
        self.cause = cause


def _cause(code) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def imap_unordered(fn, jobs, *, workers: int, describe=str):
    """Yield ``fn(job)`` for each job, in completion order, from ``workers`` spawned processes.

    An exception raised by ``fn`` is raised here (the other jobs are cancelled); a worker that
    dies raises :class:`WorkerDied` naming ``describe(job)`` of the job it ran and its signal.
    """
    jobs = list(jobs)
    if not jobs:
        return
    workers = max(1, min(int(workers), len(jobs)))
    pool = ProcessPool(max_workers=workers, context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.schedule(fn, args=(job,)): job for job in jobs}
        for done, future in enumerate(as_completed(futures)):
            try:
                result = future.result()
            except ProcessExpired as exc:
                raise _died(describe(futures[future]), exc, len(jobs) - done - 1) from None
            yield result
    finally:
        pool.stop()                   # ends running workers, never waits for their jobs
        pool.join(timeout=10)


def _died(job: str, exc: ProcessExpired, left: int) -> WorkerDied:
    cause = _cause(exc.exitcode)
    hint = f" ({cause} is {_HINTS[cause]})" if cause in _HINTS else ""
    rest = f"; {left} other job(s) cancelled" if left else ""
    return WorkerDied(f"{job}: worker process {exc.pid} died of {cause}{hint}{rest}", [job], cause)
