"""The dtype audit: which dtypes Paddle registers for every backward op's kernel, CPU and GPU.

Writes ``tvmgrad/paddle_dtypes.json``, one entry per backward op of ``specs/backward.yaml``:

    {"kernel": "cumsum_grad",              # the phi kernel (YAML kernel func / invoke target)
     "cpu": ["complex128", ...],           # the installed Paddle's CPU registrations
     "gpu": ["bfloat16", ...] | null,      # PD_REGISTER_KERNEL(<kernel>, GPU|GPUDNN, ...) in Paddle's source
     "gpu_source": "path@commit; ...",     # where the GPU list was read
     ...}

The CPU half regenerates from the installed paddle (``paddle.base.core._get_registered_phi_kernels``:
every layout, dense and STRIDED, of the CPU backend). The GPU half cannot be regenerated offline:
it is kept from the existing JSON unless ``--gpu-from DIR`` names Paddle source to parse, either a
checkout of PaddlePaddle/Paddle (its commit from ``git rev-parse HEAD`` or ``--gpu-commit``) or a
tree of partial files at Paddle's paths whose per-file commits are in ``DIR/.commits.json``.

Usage::

    .venv/bin/python scripts/paddle_dtypes.py                  # refresh the CPU half
    .venv/bin/python scripts/paddle_dtypes.py --gpu-from ~/src/Paddle
    .venv/bin/python scripts/paddle_dtypes.py --check          # exit 1 if the file is stale
    .venv/bin/python scripts/paddle_dtypes.py --gaps           # Paddle dtypes tvmgrad rejects

Dtype names are numpy spellings (float16, bfloat16, float32, float64, complex64, complex128, int8,
uint8, int16, int32, int64, bool; float8_e4m3fn, float8_e5m2 as ml_dtypes spells them).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tvmgrad" / "paddle_dtypes.json"
sys.path.insert(0, str(ROOT))

FLOATS = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
INTS = ("bool", "int8", "uint8", "int16", "int32", "int64")
ORDER = FLOATS + INTS + ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64", "pstring")

# C++ spellings in registrations -> numpy names (namespaces are stripped first).
_CXX = {
    "float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "complex<float>": "complex64", "complex<double>": "complex128", "Complex<float>": "complex64",
    "Complex<double>": "complex128", "complex64": "complex64", "complex128": "complex128",
    "bool": "bool", "int8_t": "int8", "uint8_t": "uint8", "int16_t": "int16", "int": "int32",
    "int32_t": "int32", "int64_t": "int64", "uint16_t": "uint16", "uint32_t": "uint32",
    "uint64_t": "uint64", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "pstring": "pstring",
}
# Paddle's own registry names (its DataType printer) -> numpy names.
_PADDLE = {n: n for n in ORDER} | {"float": "float32", "double": "float64", "int": "int32",
                                   "complex<float>": "complex64", "complex<double>": "complex128"}

# Kernels registered under an older name at the commit read (renamed since; same kernel function).
LEGACY_NAMES = {
    "conv2d_grad_grad": "conv2d_double_grad",
    "conv3d_grad_grad": "conv3d_double_grad",
    "depthwise_conv2d_grad_grad": "depthwise_conv2d_double_grad",
}

# Why an op has no GPU list, where the audit looked and found nothing (kept with the data).
GPU_NOT_FOUND = {
    "fractional_max_pool2d_grad": "no GPU registration in the stored versions of "
                                  "paddle/phi/kernels/gpu/pool_grad_kernel.cu read (0ebccc5f, 6c4f3ace), "
                                  "and none found by string search",
    "fractional_max_pool3d_grad": "no GPU registration in the stored versions of "
                                  "paddle/phi/kernels/gpu/pool_grad_kernel.cu read (0ebccc5f, 6c4f3ace), "
                                  "and none found by string search",
    "identity_loss_grad": "no GPU registration found (string search finds only the CPU one)",
    "partial_sum_grad": "no phi GPU registration found: paddle/phi/kernels/gpu/partial_sum_kernel.cu"
                        "@54702b62 has the kernel code but no registration; only the legacy fluid "
                        "REGISTER_OP_CUDA_KERNEL was found",
    "push_sparse_v2": "CPU-only kernel (PD_REGISTER_KERNEL/PD_REGISTER_STRUCT_KERNEL with CPU only); "
                      "no GPU registration found",
    "reverse": "no GPU registration found (paddle/phi/kernels/reverse_kernel.cc@2c611c7c registers "
               "only reverse_array)",
    "yolo_loss_grad": "no GPU registration found (yolo_loss has CPU kernels only)",
}


def norm_cxx(token: str) -> str:
    t = re.sub(r"\s+", "", token).split("::")[-1]
    if t not in _CXX:
        raise ValueError(f"unknown dtype spelling in a registration: {token!r}")
    return _CXX[t]


def sort_dtypes(names) -> list[str]:
    return sorted(set(names), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


# ------------------------------------------------------------------------------------------
# Which kernel implements each backward op

def backward_ops():
    """(op name, Op) for every backward op of backward.yaml, in file order."""
    from tvmgrad import registry
    return [(name, op) for name, op in registry.ops().items() if not op.is_forward]


def kernel_of(op) -> tuple[str | None, str]:
    """The phi kernel an op runs and how the YAML says so."""
    spec = op.spec
    if spec.kernel:
        return spec.kernel.func[0], "kernel"
    if spec.invoke:
        return spec.invoke.name, "invoke"
    return None, "composite" if spec.composite else "none"


def dtype_map(op) -> dict[str, str] | None:
    """Registered dtype -> the dtype of the op's float inputs, where they differ: a kernel keyed by
    ``data_type: complex(x)`` (real_grad, imag_grad) is registered for complex64 but called with a
    float32 ``x``."""
    spec = op.spec
    if spec.kernel and spec.kernel.data_type and spec.kernel.data_type.startswith("complex("):
        return {"complex64": "float32", "complex128": "float64"}
    return None


# ------------------------------------------------------------------------------------------
# CPU: the installed paddle

def installed_paddle():
    try:
        import paddle  # noqa: F401
        from paddle.base import core
    except ImportError:
        return None
    import paddle.version as v
    return core, v.full_version, v.commit


def cpu_registrations(core) -> dict[str, dict[str, list[str]]]:
    """kernel -> {"all": [...], "strided": [...]} for the CPU backend."""
    table = {}
    for name, entries in core._get_registered_phi_kernels("function").items():
        dense, strided = set(), set()
        for entry in entries:
            backend, layout, dt = [p.strip() for p in entry.strip("()").split(",")]
            if backend != "CPU":
                continue
            if dt not in _PADDLE:
                raise ValueError(f"unknown Paddle dtype {dt!r} ({name})")
            (strided if layout == "STRIDED" else dense).add(_PADDLE[dt])
        if dense or strided:
            table[name] = {"all": sort_dtypes(dense | strided), "strided": sort_dtypes(strided)}
    return table


# ------------------------------------------------------------------------------------------
# GPU: Paddle source

# The CUDA build: these are on, these are off; any other macro a condition tests is assumed on and
# recorded with the registrations under it (eig_grad's PADDLE_WITH_MAGMA).
_ON = {"PADDLE_WITH_CUDA", "__NVCC__"}
_OFF = {"PADDLE_WITH_HIP", "__HIPCC__", "PADDLE_WITH_XPU", "PADDLE_WITH_XPU_KP", "PADDLE_WITH_MUSA",
        "PADDLE_WITH_CUSTOM_DEVICE", "_WIN32", "PADDLE_WITH_ONEDNN"}
_NUMBERS = {"CUDA_VERSION": 12000, "CUDNN_VERSION": 90000}
_REG = re.compile(r"\b(PD_REGISTER_KERNEL|PD_REGISTER_STRUCT_KERNEL|PT_REGISTER_KERNEL|"
                  r"PHI_REGISTER_KERNEL|PD_REGISTER_KERNEL_FOR_ALL_BACKEND_DTYPE(?:_EXCEPT_CUSTOM)?)\s*\(")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text.replace("\\\n", " ")


def _condition(expr: str, assumed: set) -> bool:
    def defined(m):
        name = m.group(1)
        if name in _ON:
            return " 1 "
        if name in _OFF:
            return " 0 "
        assumed.add(name)
        return " 1 "
    e = re.sub(r"\bdefined\s*\(?\s*(\w+)\s*\)?", defined, expr)
    e = re.sub(r"\bCUDNN_VERSION_MIN\s*\([^)]*\)", " 1 ", e)

    def ident(m):
        name = m.group(0)
        if name in ("and", "or", "not"):
            return name
        if name in _NUMBERS:
            return str(_NUMBERS[name])
        if name in _ON:
            return "1"
        if name in _OFF:
            return "0"
        assumed.add(name)
        return "1"
    e = e.replace("&&", " and ").replace("||", " or ")
    e = re.sub(r"!(?!=)", " not ", e)
    e = re.sub(r"\b[A-Za-z_]\w*\b", ident, e)
    return bool(eval(e, {"__builtins__": {}}))  # noqa: S307 - digits and and/or/not only


def _preprocess(text: str):
    """Active text (conditionals resolved for a CUDA build), the function-like macros it defines,
    and the assumptions made: [(line text, frozenset of assumed macros)]."""
    out, macros = [], {}
    stack = []            # (parent_active, branch_taken, active, assumed)
    active, assumed_now = True, frozenset()
    for line in _strip_comments(text).split("\n"):
        s = line.strip()
        m = re.match(r"#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", s)
        if m:
            kind, rest = m.group(1), m.group(2).strip()
            if kind in ("if", "ifdef", "ifndef"):
                seen = set()
                cond = (_condition(f"defined({rest})", seen) if kind == "ifdef" else
                        not _condition(f"defined({rest})", seen) if kind == "ifndef" else
                        _condition(rest, seen))
                stack.append((active, cond, active and cond, assumed_now))
                assumed_now = assumed_now | frozenset(seen) if cond else assumed_now
            elif kind == "elif":
                parent, taken, _, base = stack.pop()
                seen = set()
                cond = not taken and _condition(rest, seen)
                stack.append((parent, taken or cond, parent and cond, base))
                assumed_now = base | frozenset(seen)
            elif kind == "else":
                parent, taken, _, base = stack.pop()
                stack.append((parent, True, parent and not taken, base))
                assumed_now = base
            else:
                parent, _, _, base = stack.pop()
                assumed_now = base
            active = stack[-1][2] if stack else True
            continue
        if not active:
            continue
        d = re.match(r"#\s*define\s+(\w+)\(([^)]*)\)\s*(.*)", s)
        if d:
            macros[d.group(1)] = ([p.strip() for p in d.group(2).split(",") if p.strip()], d.group(3))
            continue
        if s.startswith("#"):
            continue
        out.append((line, assumed_now))
    return out, macros


def _call_args(text: str, start: int) -> tuple[list[str], int]:
    """Top-level comma-separated arguments of the call whose '(' is at ``start``; end index."""
    depth, args, cur = 0, [], []
    for i in range(start, len(text)):
        c = text[i]
        if c in "(<[":
            depth += 1
            if depth == 1 and c == "(":
                continue
        elif c in ")>]":
            depth -= 1
            if depth == 0 and c == ")":
                args.append("".join(cur).strip())
                return [a for a in args if a], i + 1
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
            continue
        cur.append(c)
    raise ValueError("unbalanced parentheses in a registration")


def _expand(text: str, macros: dict) -> str:
    for _ in range(10):
        changed = False
        for name, (params, body) in macros.items():
            pos = 0
            pat = re.compile(rf"\b{re.escape(name)}\s*\(")
            while True:
                m = pat.search(text, pos)
                if not m:
                    break
                args, end = _call_args(text, m.end() - 1)
                sub = body
                for p, a in zip(params, args):
                    sub = re.sub(rf"\b{re.escape(p)}\b", a, sub)
                text = text[:m.start()] + sub + text[end:]
                pos = m.start() + len(sub)
                changed = True
        if not changed:
            return text
    raise ValueError("macro expansion did not settle")


def parse_registrations(path: pathlib.Path, rel: str) -> list[dict]:
    """GPU/GPUDNN registrations in one file: {kernel, backend, dtypes|None (all), assumed, rel}."""
    lines, macros = _preprocess(path.read_text(errors="replace"))
    regs = []
    # Expand per chunk of equal assumptions so each registration keeps its conditions.
    chunks, cur, cur_assumed = [], [], None
    for line, assumed in lines:
        if assumed != cur_assumed and cur:
            chunks.append(("\n".join(cur), cur_assumed))
            cur = []
        cur_assumed = assumed
        cur.append(line)
    if cur:
        chunks.append(("\n".join(cur), cur_assumed))
    for text, assumed in chunks:
        text = _expand(text, macros)
        for m in _REG.finditer(text):
            args, _ = _call_args(text, m.end() - 1)
            macro = m.group(1)
            if macro.startswith("PD_REGISTER_KERNEL_FOR_ALL_BACKEND_DTYPE"):
                regs.append(dict(kernel=args[0], backend="ALL", layout=args[1], dtypes=None,
                                 assumed=sorted(assumed), rel=rel))
                continue
            name, backend, layout = args[0], args[1], args[2]
            if backend not in ("GPU", "GPUDNN"):
                continue
            regs.append(dict(kernel=name, backend=backend, layout=layout,
                             dtypes=sort_dtypes(norm_cxx(t) for t in args[4:]),
                             assumed=sorted(assumed), rel=rel))
    return regs


def gpu_from_dir(root: pathlib.Path, commit: str | None) -> dict[str, list[dict]]:
    commits = {}
    if (root / ".commits.json").exists():
        commits = json.loads((root / ".commits.json").read_text())
    elif commit is None:
        try:
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                    capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    found: dict[str, list[dict]] = {}
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith((".cu", ".cc", ".cpp", ".h")):
                continue
            p = pathlib.Path(dirpath) / f
            rel = p.relative_to(root).as_posix()
            if not rel.startswith(("paddle/phi/kernels/", "paddle/fluid/operators/")):
                continue
            for reg in parse_registrations(p, rel):
                reg["commit"] = commits.get(rel, commit or "unknown")
                kernel = reg["kernel"]
                if kernel in LEGACY_NAMES:
                    reg["legacy_name"] = kernel
                    kernel = LEGACY_NAMES[kernel]
                found.setdefault(kernel, []).append(reg)
    return found


def gpu_entry(kernel: str, regs: list[dict] | None, cpu: dict) -> dict:
    if not regs:
        reason = GPU_NOT_FOUND.get(kernel, f"no PD_REGISTER_KERNEL({kernel}, GPU|GPUDNN, ...) in "
                                           f"the sources read")
        return {"gpu": None, "gpu_source": None, "gpu_reason": reason}
    dtypes, sources, notes = set(), [], []
    for r in regs:
        if r["dtypes"] is None:
            # PD_REGISTER_KERNEL_FOR_ALL_BACKEND_DTYPE: one registrar per backend, each expanding
            # to every dtype the same way: the GPU list is the installed CPU STRIDED one.
            strided = cpu.get(kernel, {}).get("strided", [])
            dtypes |= set(strided)
            notes.append(f"{r['rel']}: PD_REGISTER_KERNEL_FOR_ALL_BACKEND_DTYPE({r['layout']}) registers "
                         f"GPU with the same all-dtype expansion as CPU; dtypes from the installed "
                         f"CPU {r['layout']} registration")
        else:
            dtypes |= set(r["dtypes"])
        src = f"{r['rel']}@{r['commit']}"
        if src not in sources:
            sources.append(src)
        if r.get("legacy_name"):
            notes.append(f"{r['rel']}: registered as {r['legacy_name']} at that commit")
        if r["backend"] == "GPUDNN":
            notes.append(f"{r['rel']}: GPUDNN backend")
        if r["assumed"]:
            notes.append(f"{r['rel']}: under #if {' && '.join(r['assumed'])} (assumed on)")
    entry = {"gpu": sort_dtypes(dtypes), "gpu_source": "; ".join(sources)}
    if notes:
        entry["gpu_note"] = "; ".join(dict.fromkeys(notes))
    return entry


# ------------------------------------------------------------------------------------------
# The table

GPU_KEYS = ("gpu", "gpu_source", "gpu_reason", "gpu_note")


def build(gpu: dict[str, list[dict]] | None, previous: dict | None) -> dict:
    found = installed_paddle()
    if found is None:
        raise SystemExit("paddle is not installed: the CPU half comes from the installed paddle")
    core, version, commit = found
    cpu = cpu_registrations(core)
    ops = {}
    for name, op in backward_ops():
        kernel, how = kernel_of(op)
        entry = {"kernel": kernel, "kernel_from": how}
        if kernel is None:
            entry.update(cpu=[], gpu=None, gpu_source=None,
                         gpu_reason=f"no phi kernel: backward.yaml gives this op only a "
                                    f"{how} rule")
            ops[name] = entry
            continue
        entry["cpu"] = cpu.get(kernel, {}).get("all", [])
        strided = cpu.get(kernel, {}).get("strided", [])
        if strided:
            entry["cpu_strided"] = strided
        if gpu is not None:
            entry.update(gpu_entry(kernel, gpu.get(kernel), cpu))
        else:
            old = (previous or {}).get("ops", {}).get(name)
            if old is not None and old.get("kernel") == kernel:
                entry.update({k: old[k] for k in GPU_KEYS if k in old})
            else:
                entry.update(gpu=None, gpu_source=None,
                             gpu_reason="not audited yet: rerun with --gpu-from DIR")
        m = dtype_map(op)
        if m:
            entry["dtype_map"] = m
        ops[name] = entry
    meta = dict((previous or {}).get("meta", {}))
    meta.update({
        "paddle_version": version,
        "paddle_commit": commit,
        "cpu": "paddle.base.core._get_registered_phi_kernels('function'), CPU backend, every layout "
               "(dense and STRIDED; cpu_strided lists the STRIDED part)",
        "dtype_map": "registered dtype -> dtype of the op's float inputs, where the kernel is keyed by "
                     "complex(x) (YAML kernel data_type)",
        "regenerate": "python scripts/paddle_dtypes.py [--gpu-from DIR]",
    })
    if gpu is not None:
        meta["gpu"] = ("PD_REGISTER_KERNEL(<kernel>, GPU|GPUDNN, ...) parsed from stored versions of "
                       "PaddlePaddle/Paddle files, macros expanded, conditionals resolved for a CUDA "
                       "build; the commit of each file read is in gpu_source. The stored versions are "
                       "not necessarily those of the installed paddle_commit: where two versions of a "
                       "file were read, the newer by evidence (later dtype spellings, a superset of "
                       "dtypes) was kept.")
    return {"meta": meta, "ops": ops}


def dump(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=False) + "\n"


# ------------------------------------------------------------------------------------------
# Gaps

def gaps(table: dict) -> dict[str, dict[str, set]]:
    """op -> {dtype: {"cpu", "gpu"}} for each dtype Paddle registers that tvmgrad rejects (after
    dtype_map), with where Paddle registers it."""
    from tvmgrad import registry
    out = {}
    for name, entry in table["ops"].items():
        impl = registry.get(name).implementation
        accepted = set(impl.dtypes) if impl is not None else set()
        m = entry.get("dtype_map") or {}
        where: dict[str, set] = {}
        for side in ("cpu", "gpu"):
            for d in entry.get(side) or []:
                if m.get(d, d) not in accepted:
                    where.setdefault(d, set()).add(side)
        if where:
            out[name] = where
    return out


def print_gaps(table: dict) -> None:
    from tvmgrad import registry
    by_module: dict[str, list] = {}
    for op, where in gaps(table).items():
        impl = registry.get(op).implementation
        module = impl.module.rsplit(".", 1)[-1] if impl else "-"
        by_module.setdefault(module, []).append((op, where))
    for kind, names in (("float/complex", FLOATS), ("int/bool", INTS), ("other", None)):
        print(f"## {kind}")
        for module in sorted(by_module):
            rows = []
            for op, where in by_module[module]:
                sel = {d: w for d, w in where.items()
                       if (d in names if names else d not in FLOATS + INTS)}
                if sel:
                    names_ = sort_dtypes(sel)
                    where_ = ", ".join(d + ":" + "+".join(sorted(sel[d])) for d in names_)
                    rows.append(f"    {op!r}: {{{', '.join(repr(d) for d in names_)}}},  # {where_}")
            if rows:
                print(f"    # te_defs/{module}.py")
                print("\n".join(rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-from", type=pathlib.Path, help="Paddle source tree to parse the GPU "
                    "registrations from (else they are kept from the existing JSON)")
    ap.add_argument("--gpu-commit", help="commit of --gpu-from when it is no git checkout")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out is not up to date")
    ap.add_argument("--gaps", action="store_true", help="print the dtypes tvmgrad rejects")
    args = ap.parse_args(argv)
    previous = json.loads(args.out.read_text()) if args.out.exists() else None
    if args.gaps:
        print_gaps(previous)
        return 0
    gpu = gpu_from_dir(args.gpu_from, args.gpu_commit) if args.gpu_from else None
    text = dump(build(gpu, previous))
    if args.check:
        if previous is None or args.out.read_text() != text:
            print(f"{args.out} is stale: run python scripts/paddle_dtypes.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
