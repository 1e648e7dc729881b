"""``tvmgrad check``: the side tables that name ops agree with the registry (``facet_problems``);
with ``--build``, every implemented op's kernels built and run once (``build_and_run_all``).

An op's facets live in tables keyed by its name, next to the code that uses them: its example
call (tvmgrad.examples: FACTORIES, DOMAINS, ATTRS), its benchmark references and inputs
(tvmgrad.benchrefs: TORCH, PADDLE, INPUTS, FLOPS; tvmgrad.bench: SUITE; tvmgrad.workloads: BENCH_ATTRS), the Relax
gradient rules that emit it (tvmgrad.relax.rules.GRADIENTS), the GPU bundle's scatter list, its
InferMeta. Nothing but this check ties those keys to the registry: a typo'd key would silently
never be used.

Builds go through the kernel cache in a process pool (each worker builds its share; the file locks
keep workers from building the same kernel twice), with a progress bar. A worker that dies (SIGILL,
SIGSEGV, SIGKILL) ends the run at once with ``tvmgrad.workers.WorkerDied`` naming the op and
dtype it was on. On a CPU target each op then runs on its example call (tvmgrad.examples; each
dtype it supports) and its outputs are checked against shape inference; on CUDA the device code
is compiled to cubin for the target arch and checked for spills.
"""

from __future__ import annotations

import difflib
import os

__all__ = ["facet_problems", "build_and_run_all"]


# -- facets: the side tables against the registry ----------------------------------------------

def facet_problems() -> list[str]:
    """Problems with the tables that name ops: a key that is no op (with the closest names), an
    entry naming arguments its op does not have or missing ones it needs, an implemented op
    without an example, a Relax rule emitting no op or naming outputs it does not have, an
    InferMeta no op uses. Each problem names its table."""
    return (_example_problems() + _benchref_problems() + _bench_problems() + _relax_problems()
            + _bundle_problems() + _infer_meta_problems())


def _op(table: str, name, problems: list[str]):
    """The registry entry ``name`` of ``table``'s key, or None with the problem noted."""
    from . import registry
    try:
        return registry.get(name)
    except registry.UnknownOpError as exc:
        problems.append(f"{table}: {exc}")
        return None


def _names_problems(where: str, op, inputs: dict, attrs: dict) -> list[str]:
    """A call's input and attribute names against ``op``'s YAML args: unknown names (with the
    closest args) and required ones missing."""
    spec = op.spec
    tensors = [p.name for p in spec.tensor_args]
    attr_names = [p.name for p in spec.attrs]
    problems = []
    for names, known, kind in ((inputs, tensors, "input"), (attrs, attr_names, "attribute")):
        for name in names:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=2)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                problems.append(f"{where}: {name!r} is not an {kind} of {op.name}{hint}; its "
                                f"{kind}s: {', '.join(known) or 'none'}")
    given = {n for n, v in inputs.items() if v is not None}
    missing = [n for n in tensors if n not in spec.optional and n not in given]
    missing += [n for n in attr_names if n not in spec.defaults and n not in attrs]
    if missing:
        problems.append(f"{where}: no value for {op.name}'s required {', '.join(missing)}")
    return problems


def _call_problems(where: str, op, make) -> list[str]:
    """A table entry's call, ``make() -> (inputs, attrs)``: its failure, or its names against
    ``op``'s YAML args."""
    try:
        inputs, attrs = make()
    except Exception as exc:  # noqa: BLE001 - report every broken entry
        return [f"{where} fails: {type(exc).__name__}: {exc}"]
    return _names_problems(where, op, inputs, attrs)


def _example_problems() -> list[str]:
    from . import examples
    problems: list[str] = []
    for op_name, make in examples.FACTORIES.items():
        _op(f"examples.FACTORIES ({make.__module__.removeprefix('tvmgrad.')}.{make.__name__})",
            op_name, problems)
    for table, kind in ((examples.DOMAINS, "input"), (examples.ATTRS, "attribute")):
        label = "examples.DOMAINS" if kind == "input" else "examples.ATTRS"
        for op_name, values in table.items():
            op = _op(label, op_name, problems)
            if op is None:
                continue
            if op_name in examples.FACTORIES:
                problems.append(f"{label}[{op_name!r}]: never used, the op has a factory")
            args = op.spec.tensor_args if kind == "input" else op.spec.attrs
            known = [p.name for p in args]
            for name in values:
                if name not in known:
                    problems.append(f"{label}[{op_name!r}]: {name!r} is not an {kind} of "
                                    f"{op_name}; its {kind}s: {', '.join(known) or 'none'}")
    from . import registry
    for op_name in examples.implemented_ops():
        op = registry.get(op_name)
        if op_name not in examples.FACTORIES and op.implementation.family_kind != "pointwise":
            problems.append(f"examples: {op_name} ({op.family}) has no example: only pointwise ops "
                            f"get one generically; register a @factory")
            continue
        problems += _call_problems(f"examples[{op_name!r}]", op,
                                   lambda name=op_name: examples.sample(name))
    return problems


def _benchref_problems() -> list[str]:
    """Every key of every benchrefs table an op; INPUTS makers give the op's args (called at a
    small size: makers of the realistic shapes may ignore it); FLOPS only where INPUTS fix the
    shapes it counts."""
    from .benchrefs import input_makers, tables
    problems: list[str] = []
    for attr in ("TORCH", "PADDLE", "INPUTS", "FLOPS"):
        for module, table in tables(attr).items():
            for op_name, make in table.items():
                where = f"{module.removeprefix('tvmgrad.')}.{attr}"
                op = _op(where, op_name, problems)
                if op is None:
                    continue
                if attr == "FLOPS" and op_name not in input_makers():
                    problems.append(f"{where}[{op_name!r}]: no INPUTS give the shapes it counts")
                if attr == "INPUTS":
                    problems += _call_problems(f"{where}[{op_name!r}]", op,
                                               lambda make=make: make(64, "float32"))
    return problems


def _bench_problems() -> list[str]:
    """The bench suite's ops exist and have inputs: INPUTS, or flat arrays (pointwise ops only)."""
    from . import bench, workloads
    from .benchrefs import input_makers
    problems: list[str] = []
    makers = input_makers()
    for op_name in bench.SUITE:
        op = _op("bench.SUITE", op_name, problems)
        if op is not None and op_name not in makers and op.implementation.family_kind != "pointwise":
            problems.append(f"bench.SUITE: {op_name} has no benchrefs INPUTS (flat arrays of the "
                            f"size only fit pointwise ops)")
    for op_name, attrs in workloads.BENCH_ATTRS.items():
        op = _op("workloads.BENCH_ATTRS", op_name, problems)
        if op is not None:
            known = {p.name for p in op.spec.attrs}
            problems += [f"workloads.BENCH_ATTRS[{op_name!r}]: {a!r} is not an attribute of {op_name}"
                         for a in attrs if a not in known]
    for op_name, _ in bench.PADDLE_CRASHES:
        _op("bench.PADDLE_CRASHES", op_name, problems)
    return problems


def _relax_problems() -> list[str]:
    """Each Relax rule emits an available op (unless its kernel is tvmgrad.relax's own) whose
    outputs its ``results`` name."""
    from .relax.rules import GRADIENTS
    problems: list[str] = []
    for relax_op, rule in GRADIENTS.items():
        if rule.local:
            continue
        op = _op(f"relax.rules.GRADIENTS[{relax_op!r}]", rule.op, problems)
        if op is None:
            continue
        if not op.available:
            problems.append(f"relax.rules.GRADIENTS[{relax_op!r}]: {rule.op} is not implemented")
        outputs = op.spec.output_names
        for name in rule.results:
            if name is not None and name not in outputs:
                problems.append(f"relax.rules.GRADIENTS[{relax_op!r}]: {name!r} is not an output of "
                                f"{rule.op}; its outputs: {', '.join(outputs)}")
    return problems


def _bundle_problems() -> list[str]:
    from .gpu_bundle import SCATTERS
    problems: list[str] = []
    for op_name in SCATTERS:
        _op("gpu_bundle.SCATTERS", op_name, problems)
    return problems


def _infer_meta_problems() -> list[str]:
    """Every InferMeta some op's shape inference (the YAML's, or its builder's) uses; a builder
    that declares one must agree with the YAML."""
    from . import infer_meta, registry
    used = set()
    problems = []
    for op in registry.ops().values():
        yaml_im = op.spec.infer_meta.func if op.spec.infer_meta else None
        declared = op.impl.infer_meta if op.state == "implemented" else None
        used.update(n for n in (yaml_im, declared) if n)
        if yaml_im and declared and yaml_im != declared:
            problems.append(f"{op.name}: its builder declares InferMeta {declared}, the YAML says "
                            f"{yaml_im} (the YAML's is used)")
    problems += [f"infer_meta: {name} is registered but no op uses it"
                 for name in infer_meta.names() if name not in used]
    return problems


# -- build and run -----------------------------------------------------------------------------


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
