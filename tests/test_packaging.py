"""The wheel holds every package and the spec, checked without building one: setup.py's package
list against the folders in the checkout, and setuptools' own view (the modules and data files
``build_py`` would copy into the wheel, from pyproject.toml and setup.py together).
scripts/check_wheel.sh builds and installs the real wheel."""

import json
import pathlib
import runpy
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="tvmgrad_setup")   # not "__main__": no setup()

# the folders the wheel is made of, and the package each installs as
TREES = {"tvmgrad": "tvmgrad", "te_defs": "tvmgrad.te_defs", "schedules": "tvmgrad.schedules",
         "specs": "tvmgrad.specs"}


def _source_dirs(top: str):
    """Every folder under ``top`` (``top`` included) but caches."""
    root = ROOT / top
    yield root
    for path in sorted(root.rglob("*")):
        if path.is_dir() and "__pycache__" not in path.parts:
            yield path


def _installed_name(path: pathlib.Path) -> str:
    top, *rest = path.relative_to(ROOT).parts
    return ".".join([TREES[top], *rest])


def _in_repo():
    """{installed package: folder} for every folder with an __init__.py under the trees."""
    return {_installed_name(d): d.relative_to(ROOT).as_posix()
            for top in TREES for d in _source_dirs(top) if (d / "__init__.py").is_file()}


def test_every_package_folder_is_in_the_package_list():
    packages, package_dir = SETUP["packages"]()
    want = _in_repo()
    assert {"tvmgrad.relax", "tvmgrad.schedules.cpu", "tvmgrad.schedules.cuda"} <= set(want)
    assert sorted(packages) == sorted(want), "setup.py's packages differ from the folders"
    assert len(packages) == len(set(packages))
    for name, folder in want.items():                # each comes from its own folder
        source = package_dir.get(name, name.replace(".", "/"))
        assert source == folder, (name, source, folder)


def test_no_python_folder_lacks_an_init():
    """A folder of modules without __init__.py would be a namespace package that find_packages
    skips (and the wheel would lack)."""
    bare = [d.relative_to(ROOT).as_posix() for top in TREES for d in _source_dirs(top)
            if any(d.glob("*.py")) and not (d / "__init__.py").is_file()]
    assert not bare, f"folders with modules but no __init__.py: {bare}"


def test_the_spec_and_the_typing_marker_are_package_data():
    assert "backward.yaml" in SETUP["PACKAGE_DATA"]["tvmgrad.specs"]
    assert (ROOT / "specs" / "backward.yaml").is_file()
    assert "py.typed" in SETUP["PACKAGE_DATA"]["tvmgrad"] and (ROOT / "tvmgrad" / "py.typed").is_file()


SETUPTOOLS_VIEW = r"""
import json, os, sys
import setuptools  # noqa: F401 - setuptools' own distutils and Distribution (any version)
from distutils.core import run_setup
os.chdir(sys.argv[1])
dist = run_setup("setup.py", stop_after="config")      # pyproject.toml + setup.py, nothing built
cmd = dist.get_command_obj("build_py")
cmd.ensure_finalized()
print(json.dumps({"name": dist.metadata.name,
                  "modules": sorted(path for _, _, path in cmd.find_all_modules()),
                  "data": sorted(os.path.join(src, f) for _, src, _, files in cmd.data_files for f in files)}))
"""


def test_setuptools_would_copy_every_module_and_the_spec():
    proc = subprocess.run([sys.executable, "-c", SETUPTOOLS_VIEW, str(ROOT)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout.strip().splitlines()[-1])
    assert view["name"] == "tvmgrad"
    modules = {pathlib.PurePosixPath(p).as_posix() for p in view["modules"]}
    want = {p.relative_to(ROOT).as_posix() for top in TREES for d in _source_dirs(top)
            if (d / "__init__.py").is_file() for p in d.glob("*.py")}
    assert not want - modules, f"modules the wheel would lack: {sorted(want - modules)}"
    assert "tvmgrad/relax/__init__.py" in modules
    assert sorted(pathlib.PurePosixPath(p).as_posix() for p in view["data"]) == \
        ["specs/backward.yaml", "tvmgrad/py.typed"]
