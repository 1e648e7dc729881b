#!/usr/bin/env python3
"""Time one training step (forward + backward) of real models: the Relax VM on tvmgrad gradients
against PyTorch, on the same CPU threads, each framework in its own process.

    .venv/bin/python scripts/bench_relax.py                       # mlp, transformer, resnet18
    .venv/bin/python scripts/bench_relax.py resnet18 --batch 2 --repeat 30 --threads 2
    .venv/bin/python scripts/bench_relax.py mlp --variant backward --json out.json

Prints best-of-N and median milliseconds per step and the tvm/torch ratio (below 1: tvmgrad is
faster). The machine should be otherwise idle: on a shared one, compare the best-of-N times.
See ``tvmgrad/relax/bench.py`` for what is timed and the variants.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tvmgrad.relax.bench import VARIANTS, bench_training_step  # noqa: E402
from tvmgrad.relax.models import MODELS  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("models", nargs="*", default=list(MODELS), help=f"any of {', '.join(MODELS)}")
    p.add_argument("--batch", type=int)
    p.add_argument("--size", type=int, help="resnet18's image side / the transformer's sequence length")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--variant", default="tvmgrad", choices=VARIANTS)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    rows = []
    print(f"{'model':12s} {'batch':>5s} {'thr':>3s} {'tvm best':>9s} {'median':>9s} {'torch best':>10s} "
          f"{'median':>9s} {'ratio':>6s} {'(median)':>8s} {'max err':>8s}")
    for model in args.models:
        r = bench_training_step(model, batch=args.batch, repeat=args.repeat, threads=args.threads,
                                size=args.size, warmup=args.warmup, variant=args.variant)
        rows.append(r)
        print(f"{model:12s} {r['batch']:5d} {r['threads']:3d} {r['tvm_ms']:9.2f} {r['tvm_median_ms']:9.2f} "
              f"{r['torch_ms']:10.2f} {r['torch_median_ms']:9.2f} {r['ratio']:6.2f} {r['ratio_median']:8.2f} "
              f"{r['max_rel_err']:8.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
