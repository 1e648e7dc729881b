"""Which packages the wheel holds (the metadata is in pyproject.toml).

The repository keeps the math (te_defs/), the schedules (schedules/) and the spec (specs/) at the
top level; they install as sub-packages of tvmgrad (tvmgrad.te_defs, tvmgrad.schedules.cpu, ...)
so that nothing generic lands in site-packages. pyproject.toml's ``packages.find`` cannot rename
what it finds, so the list is computed here: every package under tvmgrad/ plus every package under
each mapped folder, found with ``find_packages`` (a new sub-package is picked up without editing
anything; tests/test_packaging.py checks that every folder with an ``__init__.py`` is listed).
"""

from __future__ import annotations

import pathlib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent

# top-level folder -> the package it installs as
MAPPED = {"te_defs": "tvmgrad.te_defs", "schedules": "tvmgrad.schedules", "specs": "tvmgrad.specs"}

PACKAGE_DATA = {"tvmgrad.specs": ["backward.yaml"], "tvmgrad": ["py.typed"]}


def packages(root: pathlib.Path = ROOT) -> tuple[list[str], dict[str, str]]:
    """(packages, package_dir): tvmgrad and its sub-packages, then each mapped folder and its
    sub-packages under their installed names, with the folder each one comes from."""
    found = find_packages(str(root), include=["tvmgrad", "tvmgrad.*"])
    package_dir = {}
    for folder, name in MAPPED.items():
        subs = [""] + ["." + sub for sub in find_packages(str(root / folder))]
        for sub in subs:
            found.append(name + sub)
            package_dir[name + sub] = folder + sub.replace(".", "/")
    return sorted(found), package_dir


if __name__ == "__main__":
    PACKAGES, PACKAGE_DIR = packages()
    setup(packages=PACKAGES, package_dir=PACKAGE_DIR, package_data=PACKAGE_DATA)
