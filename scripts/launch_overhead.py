"""Per-call overhead of a prepared launch and of ``tvmgrad.run`` over the kernel's own time.

For each op, at ``--n`` float32 elements (numpy inputs, the llvm target), the best and median
microseconds per call of:

* ``kernel``: the compiled packed function on TVM tensors made once (no Python of ours);
* ``launch()``: the prepared arrays, outputs allocated;
* ``launch(out=)``: the prepared arrays, preallocated outputs supplied;
* ``launch(new)``: other numpy arrays of the same signature;
* ``run``: ``tvmgrad.run(op, inputs, attrs)`` (its signature cache warm).

Issue 17's targets: ``launch()`` within 5 us of ``kernel``, ``run`` within 25 us.

``--against DIR`` alternates runs of this tvmgrad and the one importable from DIR (e.g. a
``git archive`` of main), ``--rounds`` times, and prints both and the overheads side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

OPS = {
    "relu_grad": {},
    "sigmoid_grad": {},
    "gelu_grad": {"approximate": False},
    "tanh_double_grad": {},
    "rms_norm_grad": None,          # make_inputs' attrs
}
COLUMNS = ("kernel", "launch()", "launch(out=)", "launch(new)", "run")


def _timed(fn, batch: int, repeat: int) -> tuple[float, float]:
    """(best, median) microseconds per call over ``repeat`` batches of ``batch`` calls."""
    for _ in range(3):
        fn()
    per = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        per.append((time.perf_counter() - t0) / batch * 1e6)
    per.sort()
    return per[0], per[len(per) // 2]


def _kernel_call(launch):
    """The packed function and its arguments as TVM tensors, captured from one launch call."""
    import numpy as np
    import tvm_ffi
    bound = launch.bound()
    real, seen = bound.function, []

    def capture(*args):
        seen.append(args)
        return real(*args)

    bound.function = capture
    try:
        launch()
    finally:
        bound.function = real
    args = [tvm_ffi.from_dlpack(a) if isinstance(a, np.ndarray) else a for a in seen[0]]
    return lambda: real(*args)


def measure(ops, n: int, batch: int, repeat: int) -> dict:
    import numpy as np

    import tvmgrad
    from tvmgrad.workloads import make_inputs
    table = {}
    for op, attrs in ops.items():
        inputs, default_attrs = make_inputs(op, n, "float32", False)
        attrs = default_attrs if attrs is None else {**default_attrs, **attrs}
        launch = tvmgrad.prepare(op, inputs, attrs)
        outs = {k: (np.empty_like(v) if isinstance(v, np.ndarray) else v)
                for k, v in launch().items()}
        outs = {k: v for k, v in outs.items() if v is not None}
        other = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
        kernel = _kernel_call(launch)
        calls = {
            "kernel": kernel,
            "launch()": launch,
            "launch(out=)": lambda: launch(out=outs),
            "launch(new)": lambda: launch(other),
            "run": lambda: tvmgrad.run(op, inputs, attrs),
        }
        table[op] = {name: _timed(fn, batch, repeat) for name, fn in calls.items()}
    return table


def _print(table: dict, label: str = "") -> None:
    print(f"{label}us per call: best / median (+best over kernel)")
    print(f"{'op':18}" + "".join(f"{c:>22}" for c in COLUMNS))
    for op, row in table.items():
        k = row["kernel"][0]
        cells = []
        for c in COLUMNS:
            best, med = row[c]
            extra = "" if c == "kernel" else f" (+{best - k:.1f})"
            cells.append(f"{best:.2f}/{med:.2f}{extra}")
        print(f"{op:18}" + "".join(f"{s:>22}" for s in cells))


def _child(path: str | None, args) -> dict:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path
    else:
        env.pop("PYTHONPATH", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--json", "--n", str(args.n),
           "--batch", str(args.batch), "--repeat", str(args.repeat), "--ops", ",".join(args.ops)]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(cmd, env=env, cwd=path or here, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--ops", type=lambda s: s.split(","), default=list(OPS))
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--against", help="a directory holding another tvmgrad to compare with")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.against:
        best: dict = {"this": {}, "other": {}}
        for _ in range(args.rounds):
            for side, path in (("other", args.against), ("this", None)):
                for op, row in _child(path, args).items():
                    keep = best[side].setdefault(op, row)
                    for c in COLUMNS:       # best of the rounds' bests and medians
                        keep[c] = [min(keep[c][0], row[c][0]), min(keep[c][1], row[c][1])]
        _print(best["other"], f"{args.against}: ")
        _print(best["this"], "this tree: ")
        print("overhead over kernel (best), other -> this:")
        for op in best["this"]:
            o, t = best["other"][op], best["this"][op]
            parts = [f"{c} {o[c][0] - o['kernel'][0]:.1f} -> {t[c][0] - t['kernel'][0]:.1f}"
                     for c in COLUMNS[1:]]
            print(f"  {op:18}" + ", ".join(parts))
        return
    ops = {op: OPS.get(op, None) for op in args.ops}
    table = measure(ops, args.n, args.batch, args.repeat)
    if args.json:
        print(json.dumps(table))
    else:
        _print(table)


if __name__ == "__main__":
    main()
