"""Schedule rules are chosen as TVM's dlight chooses them: a family names a pattern, the pattern's
rule says whether it fits the PrimFunc (from its blocks and their annotations), and a pattern
that does not exist or does not fit is an error naming the kernel, the pattern and why; nothing
falls back silently to other rules."""

import ast
import pathlib

import pytest
from tvm import s_tir, te

from tvmgrad import registry, schedules
from tvmgrad.call import bind
from tvmgrad.examples import broadcast_variant, implemented_ops, sample
from tvmgrad.targets import resolve

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = ("llvm", "cuda")
SYMBOL = "demo_grad_0123456789"


def _target(kind):
    spec = {"kind": "llvm"} if kind == "llvm" else {"kind": "cuda", "arch": "sm_80"}
    return resolve(spec).target


def _row_sum(attrs=None):
    """out[i] = Σ_j x[i, j]: a plain row reduction, which no pattern but ``generic`` is for."""
    x = te.placeholder((te.var("n"), te.var("m")), name="x")
    k = te.reduce_axis((0, x.shape[1]), name="k")
    out = te.compute((x.shape[0],), lambda i: te.sum(x[i, k], axis=k), name="out", attrs=attrs)
    return te.create_prim_func([x, out]).with_attr("global_symbol", SYMBOL)


def _scaled(attrs=None):
    """out[i] = 2·x[i]: one elementwise block."""
    x = te.placeholder((te.var("n"),), name="x")
    out = te.compute(x.shape, lambda i: x[i] * 2.0, name="out", attrs=attrs)
    return te.create_prim_func([x, out]).with_attr("global_symbol", SYMBOL)


# -- what the families name ----------------------------------------------------------------------

def _named_in_source():
    """(file, line, pattern) of every pattern string the builders name: ``pattern=`` keywords and
    defaults, ``setdefault("pattern", ...)``, ``PATTERN = ...`` constants, the patterns of the
    Relax kernels' ``_plan(op, key, make, pattern)``."""
    files = sorted((ROOT / "te_defs").glob("*.py")) + sorted((ROOT / "tvmgrad" / "families").glob("*.py"))
    files.append(ROOT / "tvmgrad" / "relax" / "kernels.py")
    found = []

    def strings(node):
        return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]

    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            values = []
            if isinstance(node, ast.keyword) and node.arg == "pattern":
                values = strings(node.value)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                pos = args.posonlyargs + args.args
                pairs = list(zip(pos[len(pos) - len(args.defaults):], args.defaults))
                pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
                values = [s for a, d in pairs if a.arg == "pattern" for s in strings(d)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "setdefault" and node.args \
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "pattern":
                values = strings(node.args[1])
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PATTERN"
                                                      for t in node.targets):
                values = strings(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "_plan" and len(node.args) >= 4:
                values = strings(node.args[3])
            found += [(path.relative_to(ROOT), v.lineno, v.value) for v in values]
    return found


def test_every_named_pattern_exists_for_cpu_and_cuda():
    named = _named_in_source()
    assert len(named) > 40 and {p for _, _, p in named} >= {"generic", "red_rows", "gemm_dense"}
    registered = {getattr(e.implementation, "pattern", schedules.GENERIC)
                  for e in registry.ops().values() if e.implementation is not None}
    for kind in KINDS:
        have = schedules.patterns(kind)
        missing = [f"{f}:{line} {p!r}" for f, line, p in named if p not in have]
        assert missing == [], f"patterns named without a {kind} rule: {missing}"
        assert sorted(registered - set(have)) == []
    # every pattern has a rule for both targets (none is CPU- or CUDA-only)
    assert schedules.patterns("llvm") == schedules.patterns("cuda")


def test_each_rule_is_named_after_its_file_and_its_files_decide_the_schedule():
    for kind in KINDS:
        for pattern in schedules.patterns(kind):
            rule = schedules.rule(kind, pattern)
            assert rule.name == pattern
            files = [pathlib.Path(f) for f in schedules.source_files(kind, pattern)]
            assert files[0] == ROOT / "schedules" / "__init__.py"
            assert files[1] == pathlib.Path(schedules.pattern_module(kind, pattern).__file__)


def test_the_examples_fit_their_patterns():
    """Every implemented op's example calls (and broadcast variants) fit the rule its family
    names, on both targets."""
    misfits = []
    for op in implemented_ops():
        entry = registry.get(op)
        calls = [sample(op)] + ([broadcast_variant(op)] if broadcast_variant(op) else [])
        for inputs, attrs in calls:
            call = bind(entry.spec, inputs, attrs)
            plan = entry.impl.plan(call, registry.infer_outputs(entry, call))
            if plan.make is None:
                continue
            func = plan.make()
            for kind in KINDS:
                why = schedules.rule(kind, plan.pattern).why_not(s_tir.Schedule(func))
                if why is not None:
                    misfits.append(f"{op} ({plan.pattern}, {kind}): {why}")
    assert misfits == []


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_pattern_is_an_error(kind):
    with pytest.raises(schedules.PatternError) as err:
        schedules.apply(_row_sum(), _target(kind), "rnn_plain")
    message = str(err.value)
    assert SYMBOL in message and "'rnn_plain'" in message and "red_rows" in message
    for call in (lambda: schedules.rule(kind, "red_row"), lambda: schedules.source_files(kind, "x"),
                 lambda: schedules.pattern_module(kind, "_threads")):
        with pytest.raises(schedules.PatternError):
            call()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern, needs", [
    ("gemm_dense", "dense.main"), ("attn_flash", "attn.main"), ("fft_stages", "te.extern"),
    ("extern_units", "te.extern"), ("units_and_matmuls", "la.kind")])
def test_a_pattern_that_does_not_fit_is_an_error(kind, pattern, needs):
    """A row sum is no contraction, attention, FFT or sequential-unit kernel: the rule's analysis
    says so and apply raises, naming the kernel, the pattern and what the rule needs."""
    func, target = _row_sum(), _target(kind)
    rule = schedules.rule(kind, pattern)
    assert rule.apply(func, target) is None              # dlight's contract: None, not a schedule
    with pytest.raises(schedules.PatternError) as err:
        schedules.apply(func, target, pattern)
    message = str(err.value)
    assert SYMBOL in message and repr(pattern) in message and needs in message
    # an elementwise variant (nothing to reduce) fits those rules: its block is elementwise
    assert rule.why_not(s_tir.Schedule(_scaled())) is None


@pytest.mark.parametrize("kind", KINDS)
def test_annotations_a_rule_reads_are_checked(kind):
    target = _target(kind)
    cases = [("red_rows", _row_sum({"rows.role": "rows"}), "'rows'"),
             ("attn_flash", _row_sum({"attn.main": "dq"}), "'dq'"),
             ("annotated_loops", _scaled({"tvmgrad.loops": "ps"}), "'ps'"),
             ("gather_owners", _scaled({"tvmgrad.loops": "pp"}), "'pp'"),
             ("plane_scatter", _row_sum(), "reduction")]
    for pattern, func, why in cases:
        with pytest.raises(schedules.PatternError, match=why):
            schedules.apply(func, target, pattern)


@pytest.mark.parametrize("kind", KINDS)
def test_generic_rules_fit_any_function(kind):
    target = _target(kind)
    for func in (_row_sum(), _scaled()):
        assert schedules.rule(kind, "generic").why_not(s_tir.Schedule(func)) is None
        mod = schedules.apply(func, target, "generic")
        assert mod["main"].attrs["global_symbol"] == SYMBOL


def test_no_rule_matches_names():
    """Rules find their blocks by annotations and loop analysis, never by (block or buffer) name
    prefixes: the only prefix tests in schedules/ are on a target triple and on file names."""
    allowed = {("cpu/_isa.py", "triple.startswith(('aarch64', 'arm64'))"),
               ("__init__.py", "p.stem.startswith('_')")}
    found = set()
    for path in sorted((ROOT / "schedules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("startswith", "endswith"):
                found.add((str(path.relative_to(ROOT / "schedules")), ast.unparse(node)))
    assert found == allowed
