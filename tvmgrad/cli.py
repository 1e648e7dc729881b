"""The ``tvmgrad`` command line: list, info, check, bench."""

from __future__ import annotations

import argparse
import collections
import sys

__all__ = ["main"]


def _cmd_list(args) -> int:
    from . import registry
    ops = [op for op in registry.ops().values() if not op.is_forward]
    if args.state:
        ops = [op for op in ops if op.state == args.state]
    if args.family:
        ops = [op for op in ops if op.family == args.family]
    if not args.summary:
        width = max(len(op.name) for op in ops) if ops else 10
        for op in ops:
            print(f"{op.name:<{width}}  {op.state:<11}  {op.family}")
    all_ops = [op for op in registry.ops().values() if not op.is_forward]
    states = collections.Counter(op.state for op in all_ops)
    done = states["implemented"] + states["invoke"]
    fams = collections.Counter(op.family for op in all_ops if op.available)
    print(f"{done}/{len(all_ops)} backward ops available "
          f"({states['implemented']} implemented, {states['invoke']} invoke, {states['missing']} missing)")
    if args.summary:
        print("by family: " + ", ".join(f"{f} {n}" for f, n in sorted(fams.items())))
    return 0


def _cmd_info(args) -> int:
    from . import registry
    op = registry.get(args.op)
    spec = op.spec
    sig = ", ".join(f"{p.type} {p.name}" + (f"={p.default!r}" if p.has_default else "") for p in spec.args)
    print(f"{spec.name}({sig})")
    print(f"  outputs     : {', '.join(('Tensor[] ' if o.is_list else 'Tensor ') + o.name for o in spec.outputs)}")
    print(f"  forward     : {spec.forward.name}({', '.join(p.name for p in spec.forward.params)})")
    print(f"  state       : {op.state}   family: {op.family}")
    if spec.attrs:
        defaults = spec.defaults
        print("  attributes  : " + ", ".join(
            f"{p.name}={defaults[p.name]!r}" if p.name in defaults else f"{p.name} (required)"
            for p in spec.attrs))
    im = spec.infer_meta
    if im:
        print(f"  infer_meta  : {im.func}({', '.join(im.param or [p.name for p in spec.args])})")
    for label, value in (("optional", sorted(spec.optional)), ("no_need_buffer", sorted(spec.no_need_buffer)),
                         ("inplace", [f"{a} -> {b}" for a, b in spec.inplace])):
        if value:
            print(f"  {label:<12}: {', '.join(value)}")
    if spec.invoke:
        print(f"  invoke      : {spec.invoke.name}({', '.join(spec.invoke.args)})")
    if spec.composite:
        print(f"  composite   : {spec.composite.name}({', '.join(spec.composite.args)})")
    if spec.backward:
        print(f"  backward    : {spec.backward}")
    from .tune import active_database
    db = active_database()
    if db is not None and op.impl is not None:
        from .targets import resolve
        target = resolve("llvm")
        found = [r for dt in (op.impl.dtypes or ()) for r in _records(db, target.key, dt) if r.op == op.name]
        print(f"  tuned       : {len(found)} record(s) in {db.root} for {target.kind}"
              + "".join(f"\n                {r.shapes}: {r.tuned_us:.1f} us tuned vs {r.rules_us:.1f} us rules"
                        for r in found))
    if op.impl is not None:
        impl = op.implementation
        print(f"  dtypes      : {', '.join(impl.dtypes)}")
        print(f"  te          : {impl.source_file} ({impl.module}.{impl.name}, {type(impl).__name__})")
        from . import schedules
        pattern = getattr(impl, "pattern", "generic")
        where = {kind: schedules.pattern_module(kind, pattern).__file__ for kind in ("llvm", "cuda")}
        print(f"  schedules   : {where['llvm']} (llvm), {where['cuda']} (cuda)"
              + ("" if pattern != "generic" else ": a rule per block by loop-nest shape"))
        if impl.doc:
            print("  formula     : " + impl.doc.replace("\n", "\n                "))
    return 0


def _records(db, target_key, dtype):
    try:
        return db.records(target_key, dtype)
    except ValueError:
        return []


def _cmd_check(args) -> int:
    from . import registry
    problems = registry.check()
    for p in problems:
        print(p)
    print(f"self-check: {len(problems)} problem(s)")
    if args.build:
        from .check import build_and_run_all
        problems += build_and_run_all(args.target, dtypes=args.dtype.split(","), jobs=args.jobs)
    return 1 if problems else 0


def _cmd_build(args) -> int:
    from . import aot
    ops = None
    if args.ops:
        ops = [o for part in args.ops for o in part.split(",") if o]
    manifest = aot.build(args.out, target=args.target, cpu=args.cpu, dtypes=args.dtype.split(","),
                         ops=ops, archs=args.arch.split(","), jobs=args.jobs)
    entries = sum(len(lib["entries"]) for lib in manifest["libraries"])
    skipped = [s for lib in manifest["libraries"] for s in lib["skipped"]]
    for s in skipped:
        print(f"skipped {s['op']} [{s['dtype']}]: {s['reason']}")
    print(f"{args.out}: {len(manifest['libraries'])} libraries, {entries} entry points for "
          f"{len(manifest['ops'])} ops on {manifest['target']}"
          + (f" ({', '.join(manifest['archs'])})" if manifest["archs"] else "")
          + (f" (cpu {aot._describe_cpu(manifest['cpu'])})" if manifest.get("cpu") else "")
          + f", {len(skipped)} skipped")
    return 0


def _cmd_tune(args) -> int:
    from . import registry, tune
    ops = [o for part in (args.ops or []) for o in part.split(",") if o]
    if args.family:
        ops += [op.name for op in registry.ops().values()
                if op.available and not op.is_forward and op.family == args.family]
    if not ops:
        raise ValueError("name ops (--ops) or a family (--family)")
    results = tune.tune(ops, target=args.target, db=args.db, dtype=args.dtype, trials=args.trials,
                        size=args.size, only_below=args.only_below, rpc=args.rpc, keep=args.keep)
    recorded = sum(r.recorded for r in results)
    print(f"{len(results)} kernels: {recorded} tuned schedules recorded in {args.db}")
    return 0


def _cmd_bench(args) -> int:
    from . import bench
    return bench.main(args)


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
    parser = argparse.ArgumentParser(prog="tvmgrad", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="every backward.yaml op with its state and family")
    p.add_argument("--summary", action="store_true", help="only the coverage counts")
    p.add_argument("--state", choices=("implemented", "invoke", "missing"))
    p.add_argument("--family", help="only ops of this family (te_defs module)")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("info", help="signature, defaults, shape inference and sources of one op")
    p.add_argument("op")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("check", help="self-check: builders vs backward.yaml, InferMeta coverage; "
                                     "with --build, build and run every implemented op")
    p.add_argument("--build", action="store_true",
                   help="build every implemented op for each dtype (cached) and run it on sample inputs")
    p.add_argument("--target", default="llvm")
    p.add_argument("--dtype", default="float32,float64,float16,bfloat16")
    p.add_argument("--jobs", type=int, default=0, help="build processes (default: all cores)")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("build", help="ahead-of-time kernel libraries (shards of ops per dtype, manifest)")
    p.add_argument("--target", default="llvm", help="llvm, llvm:<cpu> or cuda (default llvm)")
    p.add_argument("--cpu", default=None, metavar="host|NAME",
                   help="CPU of an llvm library: an LLVM CPU name (x86-64-v4, znver3, neoverse-n1, "
                        "...) or 'host' for this machine as it really is (default: the portable "
                        "baseline, x86-64-v3 on x86-64 (AVX2+FMA), generic on aarch64)")
    p.add_argument("--arch", default="sm_80,sm_90", help="CUDA arches (default sm_80,sm_90)")
    p.add_argument("--dtype", default="float32", help="comma-separated dtypes (default float32)")
    p.add_argument("--ops", nargs="*", help="ops to include (default: every implemented op)")
    p.add_argument("--all", action="store_true", help="every implemented op (the default)")
    p.add_argument("--out", required=True, help="output directory (replaced atomically)")
    p.add_argument("--jobs", type=int, default=0, help="build processes (default: all cores)")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("tune", help="meta_schedule tuning into a shippable database")
    p.add_argument("--ops", nargs="*", help="ops to tune")
    p.add_argument("--family", help="tune every op of this family")
    p.add_argument("--target", default="llvm")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--trials", type=int, default=64, help="meta_schedule trials per kernel")
    p.add_argument("--size", type=int, default=1 << 18, help="elements per input of the tuned call")
    p.add_argument("--db", required=True, help="database directory (one JSON per target and dtype)")
    p.add_argument("--only-below", type=float, default=None, metavar="F",
                   help="tune only kernels whose rule schedule reaches less than F x the memory roofline")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT:KEY",
                   help="measure on a fleet through this TVM RPC tracker")
    p.add_argument("--keep", choices=("faster", "always"), default="faster")
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser("bench", help="time kernels against Paddle, PyTorch and a numpy copy")
    p.add_argument("ops", nargs="+")
    p.add_argument("--size", type=int, default=1 << 24, help="elements per tensor (default 2**24)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeat", type=int, default=20)
    p.set_defaults(func=_cmd_bench)

    args = parser.parse_args(argv)
    from .workers import WorkerDied            # a build process died (SIGILL, SIGKILL, ...)
    try:
        return args.func(args)
    except (ValueError, TypeError, NotImplementedError, WorkerDied) as exc:
        print(f"tvmgrad: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
