"""Tuned schedules at run time: the trace database ``tvmgrad tune`` writes, and how a call uses it.

Records are stored as meta_schedule *traces* (Python that replays the schedule decisions) in one JSON
file per target and dtype: ``DIR/<target>/<dtype>.json``. (meta_schedule's own JSON database
serialises IR, which segfaults in TVM 0.27's wheel; a trace is a stable, readable, shippable form of
the same decisions.) Each record names the kernel (plan key) and the sizes it was tuned for; a call
with exactly those sizes is compiled with the trace (``tuned_plan``: a size-specialised kernel,
cached like any other) and every other call keeps the symbolic rule-based kernel. The file is
rewritten atomically after every record, so an interrupted tuning run leaves a usable database; a
corrupt or foreign file is rejected with a clear error.

This module is what ``run``/``prepare``, the kernel cache, the compiler and AOT builds need; the
search that fills a database (meta_schedule) is ``tvmgrad.tune``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import tempfile
from dataclasses import dataclass, replace

import numpy as np

__all__ = ["Database", "DatabaseError", "Record", "use_database", "active_database", "call_shapes",
           "tuned_plan", "apply_trace", "describe_call", "record_call"]

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

    def validate(self, target_key: str, dtype: str) -> None:
        """Read the file for a target and dtype now: a corrupt or foreign one raises DatabaseError
        (before a tuning run does any work)."""
        self._load(target_key, dtype)

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
# The call a record was tuned for

def describe_call(inputs: dict, attrs: dict) -> tuple[dict, dict]:
    """(inputs, attrs) of a call as a record stores them: each input's shape and dtype, the
    attributes as JSON values (``record_call`` rebuilds the call)."""
    return ({k: _shape_of(v) for k, v in inputs.items()}, {k: _jsonable(v) for k, v in attrs.items()})


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
