#!/usr/bin/env python3
"""Build a GPU bundle here (TVM and nvcc, no GPU) for a machine with a GPU and no TVM.

    .venv/bin/python scripts/gpu_bundle.py --out gpu-bundle                       # CUDA sm_90, float32
    .venv/bin/python scripts/gpu_bundle.py --out gpu-bundle --dtypes float32,bfloat16,float16
    .venv/bin/python scripts/gpu_bundle.py --out gpu-bundle --split               # one bundle per dtype
    .venv/bin/python scripts/gpu_bundle.py --out /tmp/cpu-bundle --target llvm --ops relu_grad,gelu_grad

then on the device: ``python3 scripts/gpu_run.py gpu-bundle --out $OUT`` (see scripts/README.md).
The layout and what each part holds: tvmgrad/gpu_bundle.py. The bundle is checked against
``--limit-mib`` (60: what one device call can carry besides the checkout); over it, the build fails.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", default="gpu-bundle", help="the bundle folder (replaced); default gpu-bundle")
    p.add_argument("--target", default="cuda", choices=("cuda", "llvm"),
                   help="cuda (the device check) or llvm (the same bundle with a CPU library: a dry run)")
    p.add_argument("--dtypes", default="float32", help="comma-separated (default float32)")
    p.add_argument("--ops", help="comma-separated (default: every implemented op)")
    p.add_argument("--archs", default="sm_90", help="CUDA arches (default sm_90)")
    p.add_argument("--jobs", type=int, default=0, help="build processes (default: every core)")
    p.add_argument("--python-version", help="the device's Python, for the tvm_ffi wheel "
                   "(default 3.12 for cuda, this Python's for llvm)")
    p.add_argument("--platform", default="manylinux_2_28_x86_64", help="the wheel's platform tag")
    p.add_argument("--ffi-wheel", help="use this apache-tvm-ffi wheel instead of downloading one")
    p.add_argument("--refs", choices=("llvm-lib", "run"),
                   help="references: llvm-lib (an LLVM AOT library of the same ops; default for "
                        "cuda) or run (tvmgrad.run per call; default for llvm)")
    p.add_argument("--limit-mib", type=float, default=60.0)
    p.add_argument("--split", action="store_true",
                   help="one bundle per dtype: OUT-float32, OUT-bfloat16, ... (one device call each)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    from tvmgrad.gpu_bundle import build_bundle, describe
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    groups = [[d] for d in dtypes] if args.split else [dtypes]
    status = 0
    for group in groups:
        out = f"{args.out}-{group[0]}" if args.split else args.out
        try:
            bundle = build_bundle(out, target=args.target, dtypes=group, ops=ops,
                                  archs=[a.strip() for a in args.archs.split(",")], jobs=args.jobs,
                                  python_version=args.python_version, plat=args.platform,
                                  refs=args.refs, ffi_wheel=args.ffi_wheel, limit_mib=args.limit_mib,
                                  progress=not args.no_progress)
        except RuntimeError as exc:
            print(f"gpu_bundle: {exc}", file=sys.stderr)
            status = 1
            continue
        print(describe(bundle))
        rel = os.path.relpath(out)
        print(f"device: run(command=\"python3 {rel}/gpu_run.py {rel} --out $OUT --check-no-tvm "
              f"--deadline 300\", carry=[\"{rel}\"], timeout_s=450)   (scripts/README.md)")
    return status


if __name__ == "__main__":
    sys.exit(main())
