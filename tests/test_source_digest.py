"""The cache key's source digest covers every module that shapes an op's code, and no more.

An edit is simulated by making ``sources.file_digest`` answer differently for one file (as the
AOT test does); files are compared by real path.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import tvmgrad
from tvmgrad import _version, registry, sources
from tvmgrad.families.pointwise import Pointwise
from tvmgrad.families.tensor import TensorOp

PACKAGE = pathlib.Path(tvmgrad.__file__).parent
TE_DEFS = pathlib.Path(importlib.util.find_spec("tvmgrad.te_defs").submodule_search_locations[0])


def _available():
    return [op for op in registry.ops().values() if op.available]


def _pattern(op):
    return getattr(op.implementation, "pattern", "generic")


def _digest(op, kind="llvm"):
    return sources.source_digest(op.impl, kind, _pattern(op))


def _edit(monkeypatch, path):
    """Pretend ``path`` was edited: its digest differs from now on."""
    real = sources.file_digest
    edited = os.path.realpath(path)
    monkeypatch.setattr(sources, "file_digest",
                        lambda p: "edited" if os.path.realpath(p) == edited else real(p))


def _first_op_of_class():
    """One implemented op per implementation class (the families and their te_defs subclasses)."""
    seen = {}
    for op in _available():
        if op.state == "implemented":
            seen.setdefault(type(op.impl), op.name)
    return seen


def _subclass_ops(base):
    return sorted(name for cls, name in _first_op_of_class().items() if base in cls.__mro__ and cls is not base)


@pytest.mark.parametrize("op", _subclass_ops(TensorOp))
def test_editing_the_tensor_family_changes_its_subclass_ops(op, monkeypatch):
    """DenseOp, IndexOp, LinalgOp, ViewOp, AttnOp, ShapeOp, AliasOp: families/tensor.py (a base
    class, not the file of type(impl)) is part of their key."""
    entry = registry.get(op)
    assert pathlib.Path(sources.inspect.getsourcefile(type(entry.impl))) != PACKAGE / "families" / "tensor.py"
    before = _digest(entry)
    _edit(monkeypatch, PACKAGE / "families" / "tensor.py")
    assert _digest(entry) != before


@pytest.mark.parametrize("op", _subclass_ops(Pointwise))
def test_editing_pointwise_changes_mixed_ops(op, monkeypatch):
    entry = registry.get(op)
    before = _digest(entry)
    _edit(monkeypatch, PACKAGE / "families" / "pointwise.py")
    assert _digest(entry) != before


@pytest.mark.parametrize("path", ["dtypes.py", "families/complex.py", "families/base.py"])
def test_editing_a_module_every_op_uses_changes_every_digest(path, monkeypatch):
    ops = _available()
    before = {op.name: _digest(op) for op in ops}
    _edit(monkeypatch, PACKAGE / path)
    unchanged = [op.name for op in ops if _digest(op) == before[op.name]]
    assert unchanged == []


def test_editing_one_te_defs_module_leaves_the_others(monkeypatch):
    ops = _available()
    linalg = [op for op in ops if op.implementation.module == "tvmgrad.te_defs.linalg"]
    activation = [op for op in ops if op.implementation.module == "tvmgrad.te_defs.activation"]
    assert linalg and activation
    before = {op.name: _digest(op) for op in linalg + activation}
    _edit(monkeypatch, TE_DEFS / "activation.py")
    assert all(_digest(op) == before[op.name] for op in linalg)
    assert all(_digest(op) != before[op.name] for op in activation)


def test_an_invoke_op_covers_its_forward_op_and_the_invoke_machinery(monkeypatch):
    entry = next(op for op in _available() if op.state == "invoke")
    files = {os.path.realpath(f) for f in sources.source_files(entry.impl, "llvm", _pattern(entry)).values()}
    assert os.path.realpath(entry.forward_op.impl.source_file) in files
    assert os.path.realpath(PACKAGE / "registry.py") in files          # InvokeImpl maps the args
    before = _digest(entry)
    _edit(monkeypatch, entry.forward_op.impl.source_file)
    assert _digest(entry) != before


def test_the_version_is_covered(monkeypatch):
    entry = registry.get("relu_grad")
    before = _digest(entry)
    monkeypatch.setattr(_version, "__version__", _version.__version__ + ".post1")
    assert _digest(entry) != before


def test_closure_follows_nested_and_relative_imports_and_skips_front_ends(tmp_path):
    """A te_defs module's function-local and relative imports are followed; the runtime, the CLI
    and the package facade are not (they cannot shape TIR and would pull in everything)."""
    module = tmp_path / "fake_family.py"
    module.write_text(
        "import tvmgrad.runtime\n"
        "from tvmgrad import infer_meta, cli\n"
        "def relu_grad(out, out_grad):\n"
        "    from ._special import digamma\n"
        "    if out:\n"
        "        from tvmgrad.families import shape\n"
        "    return out_grad\n")
    spec = importlib.util.spec_from_file_location("tvmgrad.te_defs._fake_family", module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = set(sources.source_files(Pointwise(mod.relu_grad), "llvm"))
    assert {"tvmgrad.te_defs._fake_family", "tvmgrad.te_defs._special", "tvmgrad.te_defs._math",
            "tvmgrad.families.shape", "tvmgrad.infer_meta", "tvmgrad.dtypes"} <= names
    assert not names & {"tvmgrad", "tvmgrad.runtime", "tvmgrad.cli", "tvmgrad.cache", "tvmgrad.aot"}


def test_schedule_files_are_covered(monkeypatch):
    entry = registry.get("bmm_grad")
    files = sources.source_files(entry.impl, "llvm", _pattern(entry))
    assert "tvmgrad.schedules.cpu.gemm_dense" in files and "tvmgrad.schedules.cpu" in files
    before = _digest(entry)
    _edit(monkeypatch, files["tvmgrad.schedules.cpu.gemm_dense"])
    assert _digest(entry) != before


def test_digest_does_not_depend_on_what_this_process_imported():
    """The same op has the same key in a fresh process (schedules.source_files(kind, pattern)
    alone would also count every schedules module some earlier call happened to import)."""
    import pkgutil
    for sub in ("cpu", "cuda"):
        package = importlib.import_module(f"tvmgrad.schedules.{sub}")
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
    ops = ["bmm_grad", "relu_grad", "concat_grad"]
    here = [_digest(registry.get(op), kind) for op in ops for kind in ("llvm", "cuda")]
    code = ("from tvmgrad import registry, sources\n"
            "for op in %r:\n"
            "    e = registry.get(op)\n"
            "    for kind in ('llvm', 'cuda'):\n"
            "        print(sources.source_digest(e.impl, kind, getattr(e.implementation, 'pattern', 'generic')))\n"
            % (ops,))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.split() == here


def test_digest_is_memoised_per_file(monkeypatch):
    """Computing a digest again reads and parses nothing."""
    entry = registry.get("relu_grad")
    _digest(entry)
    calls = []
    real_parse = sources._parse
    monkeypatch.setattr(sources, "_parse", lambda *a: calls.append(a) or real_parse(*a))
    _digest(entry)
    assert calls == []
