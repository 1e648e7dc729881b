"""``tvmgrad check --build``: build every implemented op's kernels and run each once.

Builds go through the kernel cache in a process pool (each worker builds its share; the file locks
keep workers from building the same kernel twice), with a progress bar. A worker that dies (SIGILL,
SIGSEGV, SIGKILL) ends the run at once with ``tvmgrad.workers.WorkerDied`` naming the op and
dtype it was on. On a CPU target each op then
runs on its example call (tvmgrad.examples; each dtype it supports) and its outputs are checked against shape inference; on CUDA the device code
is compiled to cubin for the target arch and checked for spills.
"""

from __future__ import annotations

import os

__all__ = ["build_and_run_all"]


def _ops() -> list[str]:
    from . import registry
    return [op.name for op in registry.ops().values() if op.available and not op.is_forward]


def _work(job) -> list[str]:
    """Build and (on CPU) run one op for one dtype; return problems."""
    op, dtype, target = job
    from .examples import cast, each_tensor, sample
    from .runtime import prepare
    problems = []
    try:
        inputs, attrs = sample(op)
        launch = prepare(op, {k: cast(v, dtype) for k, v in inputs.items()}, attrs, target=target)
        if not launch.target.is_gpu:
            result = launch()
            for o, meta in zip(launch.op.spec.outputs, launch.outputs):
                if meta is None:
                    continue
                for m, got in each_tensor(meta, result[o.name]):
                    if got.shape != m.shape or got.dtype != m.dtype.numpy:
                        problems.append(f"{op} [{dtype}]: {o.name} is {got.shape} {got.dtype}, "
                                        f"shape inference says {m}")
    except Exception as exc:  # noqa: BLE001 - report every failure, keep going
        problems.append(f"{op} [{dtype}]: {type(exc).__name__}: {exc}")
    return problems


def _describe(job) -> str:
    op, dtype, _ = job
    return f"{op} [{dtype}]"


def build_and_run_all(target: str, dtypes, jobs: int = 0, progress: bool = True) -> tuple[list[str], str]:
    """Build and run every op x dtype in a process pool; -> (problems found, a summary line).
    A worker that dies raises ``WorkerDied`` naming its op and dtype."""
    from tqdm import tqdm

    from .examples import float_dtypes
    from .workers import imap_unordered
    work = [(op, dt, target) for op in _ops() for dt in dtypes if dt in float_dtypes(op)]
    jobs = jobs or len(os.sched_getaffinity(0))
    problems: list[str] = []
    results = imap_unordered(_work, work, workers=jobs, describe=_describe)
    for found in tqdm(results, total=len(work), unit="kernel", desc=f"build+run {target}",
                      disable=not progress):
        problems += found
    summary = (f"built {'and ran ' if not target.startswith('cuda') else ''}{len(work)} op x dtype "
               f"combinations on {target}: {len(problems)} problem(s)")
    return problems, summary
