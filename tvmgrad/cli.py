"""The ``tvmgrad`` command line.

Commands: ``list`` (coverage), ``info OP``, ``check`` (self-check of the registry and of the side
tables that name ops; ``--build`` builds and runs every op), ``build`` (ahead-of-time libraries), ``tune`` (meta_schedule), ``bench`` (against Paddle and
PyTorch), ``cache`` (info, clear, prune). Results go to stdout (``--json``: one JSON document),
logs and progress to stderr; progress bars only on a terminal. Exit status: 0 ok, 1 problems found
(``check``), 2 bad usage or a failed build.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

__all__ = ["main"]


def _emit(args, record, text_lines) -> None:
    """Print a command's result: its JSON record with ``--json``, else its text lines."""
    if getattr(args, "json", False):
        print(json.dumps(record, indent=1, default=str))
    else:
        for line in text_lines:
            print(line)


# -- list ------------------------------------------------------------------------------------

def _cmd_list(args) -> int:
    from . import registry
    all_ops = [op for op in registry.ops().values() if not op.is_forward]
    families = sorted({op.family for op in all_ops if op.family})
    if args.family and args.family not in families:
        raise ValueError(f"unknown family {args.family!r}; families are {', '.join(families)}")
    ops = [op for op in all_ops if (not args.state or op.state == args.state)
           and (not args.family or op.family == args.family)]
    states = collections.Counter(op.state for op in ops)
    fams = collections.Counter(op.family for op in ops if op.available)
    available = states["implemented"] + states["invoke"]
    scope = "" if len(ops) == len(all_ops) else f" (filtered: {len(ops)} of {len(all_ops)} ops)"
    record = {"ops": [{"name": op.name, "state": op.state, "family": op.family} for op in ops],
              "total": len(ops), "available": available, "states": dict(states),
              "families": dict(sorted(fams.items())), "backward_ops": len(all_ops)}
    lines = []
    if not args.summary:
        width = max((len(op.name) for op in ops), default=10)
        lines += [f"{op.name:<{width}}  {op.state:<11}  {op.family}" for op in ops]
    lines.append(f"{available}/{len(ops)} backward ops available{scope} "
                 f"({states['implemented']} implemented, {states['invoke']} invoke, "
                 f"{states['missing']} missing)")
    if args.summary:
        lines.append("by family: " + ", ".join(f"{f} {n}" for f, n in sorted(fams.items())))
    _emit(args, record, lines)
    return 0


# -- info ------------------------------------------------------------------------------------

def _info_record(name: str) -> dict:
    from . import registry
    op = registry.get(name)
    spec = op.spec
    defaults = spec.defaults
    record = {
        "name": spec.name, "state": op.state, "family": op.family,
        "args": [{"name": p.name, "type": p.type, **({"default": p.default} if p.has_default else {})}
                 for p in spec.args],
        "outputs": [{"name": o.name, "list": o.is_list} for o in spec.outputs],
        "forward": {"name": spec.forward.name, "params": [p.name for p in spec.forward.params]},
        "attributes": {p.name: defaults.get(p.name, "(required)") for p in spec.attrs},
        "infer_meta": ({"func": spec.infer_meta.func,
                        "params": list(spec.infer_meta.param or [p.name for p in spec.args])}
                       if spec.infer_meta else None),
        "optional": sorted(spec.optional), "no_need_buffer": sorted(spec.no_need_buffer),
        "inplace": [list(pair) for pair in spec.inplace],
        "invoke": ({"name": spec.invoke.name, "args": list(spec.invoke.args)} if spec.invoke else None),
        "composite": ({"name": spec.composite.name, "args": list(spec.composite.args)}
                      if spec.composite else None),
        "backward": spec.backward,
    }
    if op.impl is not None:
        from . import schedules
        impl = op.implementation
        pattern = getattr(impl, "pattern", "generic")
        record.update({
            "dtypes": list(impl.dtypes), "te": {"file": impl.source_file, "builder":
                                                f"{impl.module}.{impl.name}", "kind": type(impl).__name__},
            "schedules": {kind: schedules.pattern_module(kind, pattern).__file__ for kind in ("llvm", "cuda")},
            "pattern": pattern, "formula": impl.doc or None,
        })
        from .tuned import active_database
        db = active_database()
        if db is not None:
            from .targets import resolve
            key = resolve("llvm").key
            record["tuned"] = {"database": str(db.root), "records": [
                {"shapes": r.shapes, "tuned_us": r.tuned_us, "rules_us": r.rules_us}
                for dt in impl.dtypes for r in _records(db, key, dt) if r.op == op.name]}
    return record


def _info_lines(r: dict) -> list[str]:
    sig = ", ".join(f"{a['type']} {a['name']}" + (f"={a['default']!r}" if "default" in a else "")
                    for a in r["args"])
    lines = [f"{r['name']}({sig})",
             f"  outputs     : {', '.join(('Tensor[] ' if o['list'] else 'Tensor ') + o['name'] for o in r['outputs'])}",
             f"  forward     : {r['forward']['name']}({', '.join(r['forward']['params'])})",
             f"  state       : {r['state']}   family: {r['family']}"]
    if r["attributes"]:
        lines.append("  attributes  : " + ", ".join(
            f"{k} (required)" if v == "(required)" else f"{k}={v!r}" for k, v in r["attributes"].items()))
    if r["infer_meta"]:
        lines.append(f"  infer_meta  : {r['infer_meta']['func']}({', '.join(r['infer_meta']['params'])})")
    for label in ("optional", "no_need_buffer"):
        if r[label]:
            lines.append(f"  {label:<12}: {', '.join(r[label])}")
    if r["inplace"]:
        lines.append(f"  inplace     : {', '.join(f'{a} -> {b}' for a, b in r['inplace'])}")
    for label in ("invoke", "composite"):
        if r[label]:
            lines.append(f"  {label:<12}: {r[label]['name']}({', '.join(r[label]['args'])})")
    if r["backward"]:
        lines.append(f"  backward    : {r['backward']}")
    if "tuned" in r:
        t = r["tuned"]
        lines.append(f"  tuned       : {len(t['records'])} record(s) in {t['database']} for llvm"
                     + "".join(f"\n                {x['shapes']}: {x['tuned_us']:.1f} us tuned vs "
                               f"{x['rules_us']:.1f} us rules" for x in t["records"]))
    if "dtypes" in r:
        te = r["te"]
        lines += [f"  dtypes      : {', '.join(r['dtypes'])}",
                  f"  te          : {te['file']} ({te['builder']}, {te['kind']})",
                  f"  schedules   : {r['schedules']['llvm']} (llvm), {r['schedules']['cuda']} (cuda)"
                  + ("" if r["pattern"] != "generic" else ": a rule per block by loop-nest shape")]
        if r["formula"]:
            lines.append("  formula     : " + r["formula"].replace("\n", "\n                "))
    return lines


def _cmd_info(args) -> int:
    record = _info_record(args.op)
    _emit(args, record, _info_lines(record))
    return 0


def _records(db, target_key, dtype):
    try:
        return db.records(target_key, dtype)
    except ValueError:
        return []


# -- check, build, tune, bench -----------------------------------------------------------------

def _cmd_check(args) -> int:
    from . import registry
    from .check import build_and_run_all, facet_problems
    from .logs import show_progress
    problems = registry.check()
    facets = facet_problems()
    record = {"self_check": problems, "facets": facets}
    lines = problems + facets + [f"self-check: {len(problems)} problem(s), side tables: "
                                 f"{len(facets)} problem(s)"]
    problems = problems + facets
    if args.build:
        found, summary = build_and_run_all(args.target, dtypes=args.dtype.split(","), jobs=args.jobs,
                                           progress=show_progress())
        record.update(build=found, summary=summary)
        lines += found + [summary]
        problems = problems + found
    _emit(args, record, lines)
    return 1 if problems else 0


def _cmd_build(args) -> int:
    from . import aot
    from .logs import show_progress
    ops = None
    if args.ops:
        ops = [o for part in args.ops for o in part.split(",") if o]
    manifest = aot.build(args.out, target=args.target, cpu=args.cpu, dtypes=args.dtype.split(","),
                         ops=ops, archs=args.arch.split(","), jobs=args.jobs, progress=show_progress())
    entries = sum(len(lib["entries"]) for lib in manifest["libraries"])
    skipped = [s for lib in manifest["libraries"] for s in lib["skipped"]]
    record = {"out": str(args.out), "libraries": len(manifest["libraries"]), "entries": entries,
              "ops": len(manifest["ops"]), "target": manifest["target"], "archs": manifest["archs"],
              "cpu": manifest.get("cpu"), "skipped": skipped}
    lines = [f"skipped {s['op']} [{s['dtype']}]: {s['reason']}" for s in skipped]
    lines.append(f"{args.out}: {len(manifest['libraries'])} libraries, {entries} entry points for "
                 f"{len(manifest['ops'])} ops on {manifest['target']}"
                 + (f" ({', '.join(manifest['archs'])})" if manifest["archs"] else "")
                 + (f" (cpu {aot._describe_cpu(manifest['cpu'])})" if manifest.get("cpu") else "")
                 + f", {len(skipped)} skipped")
    _emit(args, record, lines)
    return 0


def _cmd_tune(args) -> int:
    from . import registry, tune
    ops = [o for part in (args.ops or []) for o in part.split(",") if o]
    if args.family:
        family = [op.name for op in registry.ops().values()
                  if op.available and not op.is_forward and op.family == args.family]
        if not family:
            raise ValueError(f"unknown family {args.family!r} (tvmgrad list --summary lists them)")
        ops += family
    if not ops:
        raise ValueError("name ops (--ops) or a family (--family)")
    results = tune.tune(ops, target=args.target, db=args.db, dtype=args.dtype, trials=args.trials,
                        size=args.size, only_below=args.only_below, rpc=args.rpc, keep=args.keep)
    recorded = sum(r.recorded for r in results)
    print(f"{len(results)} kernels: {recorded} tuned schedules recorded in {args.db}")
    return 0


def _cmd_bench(args) -> int:
    if args.relax:
        return _bench_relax(args)
    from . import bench
    return bench.main(args)


def _bench_relax(args) -> int:
    """One training step of real models in the Relax VM against PyTorch (tvmgrad.relax.bench)."""
    from .relax.bench import bench_training_step, report
    from .relax.models import MODELS
    models = args.ops or list(MODELS)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)} for --relax (have {', '.join(MODELS)})")
    rows = [bench_training_step(m, repeat=args.repeat, threads=args.threads or None,
                                batch=args.batch) for m in models]
    print(json.dumps(rows, indent=1) if args.json else report(rows))
    return 0


# -- cache -----------------------------------------------------------------------------------

def _duration(text: str) -> float:
    """Seconds of '30d', '12h', '90m', '45s' or a plain number of days."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text) * 86400
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m)") from None


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _cmd_cache(args) -> int:
    from . import cache
    if args.action == "info":
        u = cache.usage()
        lines = [f"{u['root']}: {u['entries']} entries, {_mb(u['bytes'])}"
                 + ("" if u["exists"] else " (does not exist yet)")]
        lines += [f"  {part:<28} {p['entries']:>6} entries  {_mb(p['bytes']):>10}"
                  + ("" if part in u["current"] else "  (another TVM: prune removes it)")
                  for part, p in u["parts"].items()]
        _emit(args, u, lines)
        return 0
    if args.action == "clear":
        r = cache.clear()
    else:
        r = cache.prune(older_than=args.older_than, dry_run=args.dry_run)
    verb = "would remove" if r.get("dry_run") else "removed"
    _emit(args, r, [f"{r['root']}: {verb} {r['removed']} entries ({_mb(r['bytes'])}), "
                    f"kept {r['kept']}"])
    return 0


# -- the parser --------------------------------------------------------------------------------

def _version() -> str:
    from importlib import metadata

    from ._version import __version__
    try:
        tvm = metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        tvm = "not installed"
    return f"tvmgrad {__version__} (apache-tvm {tvm}, Python {sys.version.split()[0]})"


def _verbosity(defaults: bool) -> argparse.ArgumentParser:
    """-v/-q, accepted before and after the command (a subcommand's copy leaves the value alone
    unless given: argparse would otherwise reset what came before the command)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="count", default=0 if defaults else argparse.SUPPRESS,
                   help="log what is built and tuned (-vv: also TVM's meta_schedule output)")
    p.add_argument("-q", "--quiet", action="store_true", default=False if defaults else argparse.SUPPRESS,
                   help="no progress bars and no warnings, only results and errors")
    return p


def _parser() -> argparse.ArgumentParser:
    common = _verbosity(defaults=False)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the result as one JSON document")

    parser = argparse.ArgumentParser(
        prog="tvmgrad", parents=[_verbosity(defaults=True)],
        description="PaddlePaddle's backward operators as compiled TVM kernels.",
        epilog="Environment variables are listed in the README (TVMGRAD_CACHE_DIR, TVMGRAD_CPU, "
               "TVMGRAD_TUNING_DB, TVMGRAD_CUDA_ARCH, TVM_NUM_THREADS).")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", parents=[common, as_json], help="every backward.yaml op with its state and family")
    p.add_argument("--summary", action="store_true", help="only the counts, by family")
    p.add_argument("--state", choices=("implemented", "invoke", "missing"), help="only ops in this state")
    p.add_argument("--family", help="only ops of this family (te_defs module, e.g. activation)")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("info", parents=[common, as_json],
                       help="signature, defaults, shape inference, dtypes and sources of one op")
    p.add_argument("op", help="a backward op, e.g. gelu_grad")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("check", parents=[common, as_json],
                       help="self-check (builders vs backward.yaml, InferMeta coverage, the tables that "
                            "name ops: examples, bench references, Relax rules); with --build, "
                            "build and run every implemented op")
    p.add_argument("--build", action="store_true",
                   help="build every implemented op for each dtype (cached) and run it on its example")
    p.add_argument("--target", default="llvm", help="llvm (this host), llvm:<cpu> or cuda (default llvm)")
    p.add_argument("--dtype", default="float32,float64,float16,bfloat16",
                   help="comma-separated float dtypes (default all four)")
    p.add_argument("--jobs", type=int, default=0, help="build processes (default: all cores)")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("build", parents=[common, as_json],
                       help="an ahead-of-time kernel library (shards of ops per dtype, manifest)")
    p.add_argument("--out", required=True, help="output directory (replaced atomically)")
    p.add_argument("--target", default="llvm", help="llvm, llvm:<cpu> or cuda (default llvm)")
    p.add_argument("--cpu", default=None, metavar="host|NAME",
                   help="CPU of a llvm library: 'host' (this machine) or an LLVM CPU name "
                        "(default: the portable baseline, x86-64-v3 on x86-64)")
    p.add_argument("--arch", default="sm_80,sm_90", help="CUDA arches (default sm_80,sm_90)")
    p.add_argument("--dtype", default="float32", help="comma-separated dtypes (default float32)")
    p.add_argument("--ops", nargs="*", metavar="OP", help="ops to include (default: every implemented op)")
    p.add_argument("--jobs", type=int, default=0, help="build processes (default: all cores)")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("tune", parents=[common], help="meta_schedule tuning into a shippable database")
    p.add_argument("--db", required=True, help="database directory (one JSON per target and dtype)")
    p.add_argument("--ops", nargs="*", metavar="OP", help="ops to tune")
    p.add_argument("--family", help="tune every op of this family")
    p.add_argument("--target", default="llvm", help="llvm (this host), llvm:<cpu> or cuda:<arch>")
    p.add_argument("--dtype", default="float32", help="dtype of the tuned calls (default float32)")
    p.add_argument("--trials", type=int, default=64, help="meta_schedule trials per kernel (default 64)")
    p.add_argument("--size", type=int, default=1 << 18, help="elements per input of the tuned call")
    p.add_argument("--only-below", type=float, default=None, metavar="F",
                   help="tune only kernels whose rule schedule reaches less than F x the memory roofline")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT:KEY",
                   help="measure on a fleet through this TVM RPC tracker")
    p.add_argument("--keep", choices=("faster", "always"), default="faster",
                   help="record a tuned schedule only when it beats the rules (default), or always")
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser("bench", parents=[common, as_json],
                       help="time kernels against Paddle, PyTorch and a memory copy")
    p.add_argument("ops", nargs="*", metavar="OP[:bcast]",
                   help="ops to time (:bcast broadcasts an input); with --relax: models")
    p.add_argument("--suite", action="store_true", help="the fixed list covering every family")
    p.add_argument("--relax", action="store_true",
                   help="time one training step of real models (mlp, transformer, resnet18; default "
                        "all) in the Relax VM on tvmgrad gradients against PyTorch")
    p.add_argument("--batch", type=int, default=None, help="with --relax: the batch (default per model)")
    p.add_argument("--threads", type=int, default=0, help="threads per framework (default: all cores)")
    p.add_argument("--size", type=int, default=1 << 24, help="elements per tensor (default 2**24)")
    p.add_argument("--dtype", default="float32", help="dtype of the inputs (default float32)")
    p.add_argument("--repeat", type=int, default=20, help="timed calls per measurement (best and median)")
    p.add_argument("--rounds", type=int, default=1,
                   help="turns each framework takes at each op, in turn (default 1; more on a "
                        "machine whose bandwidth drifts)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("cache", parents=[common, as_json], help="the kernel cache: info, clear, prune")
    p.add_argument("action", choices=("info", "clear", "prune"),
                   help="info: size per part; clear: remove every entry; prune: remove old entries "
                        "and those of other TVM versions")
    p.add_argument("--older-than", type=_duration, default=_duration("30d"), metavar="AGE",
                   help="prune entries not used for AGE (30d, 12h, 90m; default 30d)")
    p.add_argument("--dry-run", action="store_true", help="prune: only say what would go")
    p.set_defaults(func=_cmd_cache)
    return parser


def main(argv=None) -> int:
    import signal
    if not hasattr(signal, "SIGPIPE"):
        return _main(argv)
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)    # `tvmgrad list | head` ends quietly
    try:
        return _main(argv)
    finally:                                # a caller in-process (tests) keeps its own handler
        signal.signal(signal.SIGPIPE, previous)


def _main(argv) -> int:
    args = _parser().parse_args(argv)
    from .logs import configure
    configure(args.verbose, args.quiet)
    from .workers import WorkerDied            # a build process died (SIGILL, SIGKILL, ...)
    try:
        return args.func(args)
    except (ValueError, TypeError, NotImplementedError, WorkerDied) as exc:
        print(f"tvmgrad: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
