"""Auto-scheduling with TVM's meta_schedule: the search that fills a tuning database.

``tune(ops, target=..., db=DIR)`` tunes the kernels of representative calls (shape buckets: one
call per op from its benchmark inputs or example, or sizes the caller gives), times our rule-based
schedule on the same sizes, and records the tuned schedule (a trace, ``tvmgrad.tuned``, which also
holds the database format and how run-time calls use it) when it wins. ``--only-below F`` first
benchmarks the rule schedule and tunes only kernels under F × the memory roofline.

Measurement runs in-process, or on a fleet through TVM's own RPC tracker with meta_schedule's
RPC runner (``rpc="host:port:key"``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace

import numpy as np

from .build import lower
from .planning import plan_call
from .tuned import Database, Record, call_shapes, describe_call
from .workloads import copy_roofline, make_inputs

__all__ = ["tune", "TuneResult"]


def _tuning_target(target: str):
    import tvm

    from .targets import resolve
    t = resolve(target)
    if t.kind == "llvm":
        cores = len(os.sched_getaffinity(0))
        spec = dict(t.target.export())
        spec = {k: v for k, v in spec.items() if k in ("kind", "mcpu", "mtriple", "mattr")}
        spec["num-cores"] = cores
        return t, tvm.target.Target(spec)
    return t, t.target


def _ms_space(kind: str):
    from tvm.s_tir import meta_schedule as ms
    bad = ("MutateComputeLocation", "MutateParallel", "MutateThreadBinding")   # segfault (SaveJSON)
    mutators = {m: p for m, p in ms.Mutator.create(kind).items() if type(m).__name__ not in bad}
    return ms.space_generator.PostOrderApply(sch_rules=ms.ScheduleRule.create(kind),
                                             postprocs=ms.Postproc.create(kind), mutator_probs=mutators)


def _builder_and_runner(rpc: str | None):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class InProcBuilder(ms.builder.PyBuilder):
        """Builds in this process (the stock builders pickle IR, which segfaults here)."""

        def build(self, build_inputs):
            out = []
            for bi in build_inputs:
                try:
                    with bi.target:                 # fastmath's rules read the target
                        rt_mod = ms.builder.local_builder.default_build(bi.mod, bi.target, None)
                    path = os.path.join(tempfile.mkdtemp(prefix="tvmgrad-ms-"), "k.so")
                    rt_mod.export_library(path)
                    out.append(ms.builder.BuilderResult(path, None))
                except Exception as exc:  # noqa: BLE001 - a candidate that does not build
                    out.append(ms.builder.BuilderResult(None, str(exc)))
            return out

    if rpc:
        host, port, key = rpc.rsplit(":", 2)
        runner = ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key,
                                           session_timeout_sec=60),
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=0,
                                                       enable_cpu_cache_flush=False))
        return InProcBuilder(), runner

    @derived_object
    class InProcRunner(ms.runner.PyRunner):
        def __init__(self):
            super().__init__()
            self.cfg = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=0,
                                                 enable_cpu_cache_flush=False)

        def run(self, runner_inputs):
            import tvm
            futures = []
            for ri in runner_inputs:
                try:
                    mod = tvm.runtime.load_module(str(ri.artifact_path))
                    dev = tvm.runtime.device(str(ri.device_type), 0)
                    args = ms.runner.utils.alloc_argument_common(
                        lambda t: None, dev, tuple(a.as_json() for a in ri.args_info), 1)
                    costs = ms.runner.utils.run_evaluator_common(mod, dev, self.cfg, args)
                    futures.append(ms.runner.local_runner.LocalRunnerFuture(res=costs, error_message=None))
                except Exception as exc:  # noqa: BLE001
                    futures.append(ms.runner.local_runner.LocalRunnerFuture(res=None, error_message=str(exc)))
            return futures

    return InProcBuilder(), InProcRunner()


def _time_func(mod, target, shapes_dtypes, repeat=5) -> float:
    """Best-of time (seconds) of a compiled one-function module on random inputs."""
    import tvm
    with target:
        ex = tvm.compile(mod, target=target)
    dev = tvm.cpu(0) if target.kind.name == "llvm" else tvm.cuda(0)
    args = [tvm.runtime.tensor(np.random.default_rng(0).random(s).astype(d) if d.startswith("float")
                               else np.zeros(s, d), dev) for s, d in shapes_dtypes]
    name = [k for k in mod.functions][0].name_hint
    f = ex.mod.time_evaluator(name, dev, number=5, repeat=repeat)
    return min(f(*args).results)


def _param_shapes(func):
    out = []
    for p in func.params:
        shape = getattr(p, "shape", None)
        if shape is None:
            continue
        out.append(([int(d) for d in shape], str(p.dtype) if hasattr(p, "dtype") else "float32"))
    return out


@dataclass
class TuneResult:
    op: str
    key: str
    shapes: list
    rules_us: float
    tuned_us: float | None
    recorded: bool
    skipped: str | None = None


def tune(ops, *, target="llvm", db, dtype="float32", trials: int = 64, size: int = 1 << 18,
         only_below: float | None = None, rpc: str | None = None, keep: str = "faster",
         log=print) -> list[TuneResult]:
    """Tune each op's representative kernel; record it in the database under ``db`` when it beats
    the rule-based schedule (``keep="always"``: record it anyway)."""
    if keep not in ("faster", "always"):
        raise ValueError(f"keep must be 'faster' or 'always', not {keep!r}")
    from tvm.s_tir import meta_schedule as ms

    from .logs import stdout_to_log

    resolved, ms_target = _tuning_target(target)
    from .fastmath import install
    install()
    database = db if isinstance(db, Database) else Database(db)
    database.validate(resolved.key, dtype)             # a corrupt/foreign DB fails before any work
    builder, runner = _builder_and_runner(rpc)
    roofline = copy_roofline(8 * size, 5) if only_below is not None else None
    results = []
    for op in ops:
        inputs, attrs = make_inputs(op, size, dtype, broadcast=False)
        planned = plan_call(op, inputs, attrs)
        call, outs, plan = planned.call, planned.outputs, planned.plan
        shapes = call_shapes(plan, call, outs)
        if plan.make is None or plan.make_static is None:
            results.append(TuneResult(op, repr(plan.key), shapes, 0, None, False, "not tunable (no static form)"))
            continue
        searchable = plan.make_static(inline=True).with_attr("global_symbol", "main")
        # both sides through build.lower, as run builds them: the rules on this call's sizes
        # (index narrowing, buffer alignment), then the trace found
        static = replace(plan, make=plan.make_static, symbol="main")
        rules_mod = lower(static, resolved)
        sd = _param_shapes(rules_mod["main"])
        rules_s = _time_func(rules_mod, ms_target, sd)
        nbytes = sum(int(np.prod(s)) * np.dtype(d if d != "bfloat16" else "uint16").itemsize for s, d in sd)
        if only_below is not None and nbytes / rules_s / 1e9 >= only_below * roofline:
            results.append(TuneResult(op, repr(plan.key), shapes, rules_s * 1e6, None, False,
                                      f"rules reach {nbytes / rules_s / 1e9 / roofline:.0%} of the roofline"))
            log(f"{op}: skipped ({results[-1].skipped})")
            continue
        _name_ms_log_handlers()
        with tempfile.TemporaryDirectory(prefix="tvmgrad-tune-") as work, stdout_to_log():
            ms_db = ms.tune_tir(searchable, ms_target, work_dir=work, max_trials_global=trials,
                                num_trials_per_iter=min(16, trials), builder=builder, runner=runner,
                                database="memory", cost_model="random",
                                space=_ms_space("cuda" if resolved.is_gpu else "llvm"),
                                strategy="replay-func", num_tuning_cores=1, seed=0)
            sch = ms.tir_integration.compile_tir(ms_db, searchable, ms_target)
        if sch is None:
            results.append(TuneResult(op, repr(plan.key), shapes, rules_s * 1e6, None, False, "no valid schedule"))
            continue
        trace = _trace_source(sch)
        tuned_s = _time_func(lower(replace(static, trace=trace), resolved), ms_target, sd)
        recorded = tuned_s < rules_s or keep == "always"
        if recorded:
            call_inputs, call_attrs = describe_call(inputs, call.attrs)
            database.add(resolved.key, dtype, Record(
                op, repr(plan.key), shapes, trace, tuned_s * 1e6, rules_s * 1e6, trials,
                inputs=call_inputs, attrs=call_attrs))
        results.append(TuneResult(op, repr(plan.key), shapes, rules_s * 1e6, tuned_s * 1e6, recorded))
        log(f"{op}: rules {rules_s * 1e6:.1f} us, tuned {tuned_s * 1e6:.1f} us "
            f"({'recorded' if recorded else 'rules kept'})")
    return results


def _name_ms_log_handlers() -> None:
    """meta_schedule re-lists its logger's handlers by name on every run and fails on one without a
    name (test runners and applications attach such handlers): drop those from its logger."""
    import logging
    log = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(log.handlers):
        if handler.get_name() is None:
            log.removeHandler(handler)


def _trace_source(sch) -> str:
    """The trace as standalone Python: ``def apply_trace(sch): ...``."""
    text = str(sch.trace)
    if "def apply_trace" not in text:
        raise RuntimeError("unexpected meta_schedule trace format")
    return text
