"""Auto-scheduling with TVM's meta_schedule, and databases of tuned schedules to ship.

``tune(ops, target=..., db=DIR)`` tunes the kernels of representative calls (shape buckets: one
call per op from its benchmark inputs or example, or sizes the caller gives), times our rule-based
schedule on the same sizes, and records the tuned schedule when it wins. ``--only-below F`` first
benchmarks the rule schedule and tunes only kernels under F × the memory roofline.

Records are stored as meta_schedule *traces* (Python that replays the schedule decisions) in one JSON
file per target and dtype: ``DIR/<target>/<dtype>.json``. (meta_schedule's own JSON database
serialises IR, which segfaults in TVM 0.27's wheel; a trace is a stable, readable, shippable form of
the same decisions.) Each record names the kernel (plan key) and the sizes it was tuned for; a call
with exactly those sizes is compiled with the trace (a size-specialised kernel, cached like any other)
and every other call keeps the symbolic rule-based kernel. The file is rewritten atomically after
every kernel, so an interrupted run leaves a usable database; a corrupt or foreign file is rejected
with a clear error.

Measurement runs in-process, or on a fleet through TVM's own RPC tracker with meta_schedule's
RPC runner (``rpc="host:port:key"``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import tempfile
import time
from dataclasses import dataclass, replace

import numpy as np

from .planning import plan_call

__all__ = ["Database", "DatabaseError", "tune", "use_database", "active_database", "apply_trace",
           "tuned_plan"]

FORMAT = "tvmgrad-tuning-db"
VERSION = 1


class DatabaseError(ValueError):
    """A tuning database that is corrupt, or was made for another target or TVM."""


# ------------------------------------------------------------------------------------------
# Database

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


@dataclass
class Record:
    op: str
    key: str                 # repr of the plan key
    shapes: list             # the sizes of every kernel argument it was tuned for
    trace: str               # meta_schedule trace, as Python (def apply_trace(sch): ...)
    tuned_us: float
    rules_us: float
    trials: int
    inputs: dict | None = None   # the tuned call's inputs as {name: shape or [shapes]} and dtype
    attrs: dict | None = None    # and its attributes: enough to rebuild the call (AOT libraries)

    @property
    def match(self) -> tuple:
        return (self.key, json.dumps(self.shapes))


class Database:
    """The tuned schedules for every target and dtype under one directory."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self._files: dict[tuple[str, str], dict] = {}

    def _path(self, target_key: str, dtype: str) -> pathlib.Path:
        digest = hashlib.sha256(target_key.encode()).hexdigest()[:10]
        return self.root / f"{_slug(_target_kind(target_key))}-{digest}" / f"{dtype}.json"

    def _load(self, target_key: str, dtype: str) -> dict:
        ident = (target_key, dtype)
        if ident not in self._files:
            self._files[ident] = _read(self._path(target_key, dtype), target_key, dtype)
        return self._files[ident]

    def lookup(self, target_key: str, dtype: str, key: str, shapes) -> Record | None:
        data = self._load(target_key, dtype)
        for raw in data["records"]:
            if raw["key"] == key and raw["shapes"] == shapes:
                return Record(**raw)
        return None

    def records(self, target_key: str, dtype: str) -> list[Record]:
        return [Record(**raw) for raw in self._load(target_key, dtype)["records"]]

    def add(self, target_key: str, dtype: str, record: Record) -> None:
        """Add (or replace) a record and rewrite the file atomically."""
        data = self._load(target_key, dtype)
        data["records"] = [r for r in data["records"]
                           if (r["key"], json.dumps(r["shapes"])) != record.match]
        data["records"].append(record.__dict__)
        path = self._path(target_key, dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def _target_kind(target_key: str) -> str:
    try:
        return json.loads(target_key).get("kind", "target")
    except ValueError:
        return "target"


def _read(path: pathlib.Path, target_key: str, dtype: str) -> dict:
    import tvm
    fresh = {"format": FORMAT, "version": VERSION, "target": target_key, "dtype": dtype,
             "tvm": tvm.__version__, "records": []}
    if not path.exists():
        return fresh
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise DatabaseError(f"tuning database {path} is corrupt (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DatabaseError(f"{path} is not a tvmgrad tuning database")
    if data.get("version") != VERSION:
        raise DatabaseError(f"{path}: database version {data.get('version')} is not {VERSION}")
    if data.get("target") != target_key or data.get("dtype") != dtype:
        raise DatabaseError(f"{path} was tuned for target {data.get('target')} / {data.get('dtype')}, "
                            f"not {target_key} / {dtype}")
    if data.get("tvm") != tvm.__version__:
        raise DatabaseError(f"{path} was tuned with TVM {data.get('tvm')}, this is {tvm.__version__}; "
                            f"traces do not carry across TVM versions: re-tune")
    records = data.get("records")
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and {"op", "key", "shapes", "trace"} <= set(r) for r in records):
        raise DatabaseError(f"{path}: malformed records")
    return data


_ACTIVE: Database | None = None


def use_database(root) -> Database | None:
    """Make ``run``/``prepare``/``build`` consult the tuning database under ``root`` (None: stop)."""
    global _ACTIVE
    _ACTIVE = Database(root) if root is not None else None
    return _ACTIVE


def active_database() -> Database | None:
    if _ACTIVE is None and os.environ.get("TVMGRAD_TUNING_DB"):
        use_database(os.environ["TVMGRAD_TUNING_DB"])
    return _ACTIVE


# ------------------------------------------------------------------------------------------
# Applying records

def call_shapes(plan, call, outs) -> list:
    """The sizes of every buffer argument of a plan's kernel for this call."""
    spec = call.spec
    shapes = []
    for a in plan.args:
        if a.kind == "scalar":
            continue
        if a.shape is not None:
            shapes.append([int(d) for d in a.shape])
            continue
        if a.kind == "input":
            meta = call.meta(a.name)
        else:
            meta = outs[spec.output_names.index(a.name)]
        meta = meta[a.index] if a.index is not None else meta
        shapes.append([int(d) for d in meta.shape])
    return shapes


def tuned_plan(plan, call, outs, target, db: Database | None = None):
    """The plan, or its size-specialised tuned variant when the database has a record for it."""
    db = db or active_database()
    if db is None or plan.make_static is None or plan.make is None:
        return plan
    dtype = _plan_dtype(call)
    record = db.lookup(target.key, dtype, repr(plan.key), call_shapes(plan, call, outs))
    if record is None:
        return plan
    tag = hashlib.sha1(record.trace.encode()).hexdigest()[:10]
    return replace(plan, key=plan.key + ("tuned", json.dumps(record.shapes), tag),
                   symbol=f"{plan.symbol}_tuned_{tag}", trace=record.trace)


def _plan_dtype(call) -> str:
    from .dtypes import dtype as as_dtype
    for value in call.tensors.values():
        for v in (value if isinstance(value, list) else [value]):
            if v is not None and as_dtype(v.dtype).kind in ("float", "complex"):
                return as_dtype(v.dtype).name
    return "none"


def apply_trace(func, trace: str):
    """Replay a meta_schedule trace (Python source) on a PrimFunc; -> IRModule."""
    import tvm
    from tvm import s_tir, tirx
    sch = s_tir.Schedule(func)
    namespace = {"s_tir": s_tir, "tirx": tirx, "tvm": tvm, "T": tirx}
    exec(compile(trace, "<tvmgrad tuned trace>", "exec"), namespace)  # noqa: S102 - our own DB
    namespace["apply_trace"](sch)
    return sch.mod


# ------------------------------------------------------------------------------------------
# Tuning

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

    from . import schedules
    from .bench import copy_roofline, make_inputs
    from .logs import stdout_to_log

    resolved, ms_target = _tuning_target(target)
    from .fastmath import install
    install()
    database = db if isinstance(db, Database) else Database(db)
    database._load(resolved.key, dtype)               # a corrupt/foreign DB fails before any work
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
        func = plan.make_static().with_attr("global_symbol", "main")
        searchable = plan.make_static(inline=True).with_attr("global_symbol", "main")
        rules_mod = schedules.apply(func, resolved.target, plan.pattern)
        sd = _param_shapes(func)
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
        tuned_s = _time_func(apply_trace(searchable, trace), ms_target, sd)   # what run will use
        recorded = tuned_s < rules_s or keep == "always"
        if recorded:
            database.add(resolved.key, dtype, Record(
                op, repr(plan.key), shapes, trace, tuned_s * 1e6, rules_s * 1e6, trials,
                inputs={k: _shape_of(v) for k, v in inputs.items()},
                attrs={k: _jsonable(v) for k, v in call.attrs.items()}))
        results.append(TuneResult(op, repr(plan.key), shapes, rules_s * 1e6, tuned_s * 1e6, recorded))
        log(f"{op}: rules {rules_s * 1e6:.1f} us, tuned {tuned_s * 1e6:.1f} us "
            f"({'recorded' if recorded else 'rules kept'})")
    return results


def _shape_of(value):
    if value is None:
        return None
    if isinstance(value, list):
        return [_shape_of(v) for v in value]
    return {"shape": list(value.shape), "dtype": str(value.dtype)}


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def record_call(record: Record):
    """(inputs, attrs) reproducing a record's call (zero arrays of the tuned shapes)."""
    from .dtypes import dtype as as_dtype

    def make(v):
        if v is None:
            return None
        if isinstance(v, list):
            return [make(x) for x in v]
        return np.zeros(v["shape"], dtype=as_dtype(v["dtype"]).numpy)
    return {k: make(v) for k, v in (record.inputs or {}).items()}, dict(record.attrs or {})


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
