"""Packaging: the package builds from a clean copy of the repository with what pyproject.toml's
[build-system] requires, without a setuptools warning, and the wheel holds the files the code
reads that are not Python (the report's template)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import ROOT
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

OLDER_THAN_LICENSE_STRINGS = ("65.5.0", "76.1.0")
"""setuptools versions before 77, the first to read ``project.license`` as a string (an SPDX
expression, PEP 639): they refuse pyproject.toml ("`project.license` must be valid exactly by
one definition"). 65.5 is what a fresh Python 3.11 venv holds."""


def test_make_sample_builds_without_setuptools_warnings(tmp_path: Path) -> None:
    """The install step of `make sample` (an editable install runs the same build backend):
    no deprecation warning, no "package would be ignored". Built without build isolation by a
    setuptools that meets [build-system] requires, whatever this environment's is: this
    environment's when it meets them, else one pip installs into a folder of the test's;
    skipped, saying why, only when neither can be had (no index reachable)."""
    requires = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    if isinstance(PYPROJECT["project"].get("license"), str):
        (setuptools,) = (r for r in requires if r.name == "setuptools")
        for old in OLDER_THAN_LICENSE_STRINGS:
            assert not setuptools.specifier.contains(old, prereleases=True), (
                f"[build-system] requires {setuptools}, which admits setuptools {old}: it "
                "refuses the license string")
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT,
                           check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    env = dict(os.environ)
    backend = _build_requirements(requires, tmp_path / "build-env")
    if backend is not None:  # ahead of this environment's setuptools
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(backend), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-v", str(src), "-w", str(tmp_path / "wheel")], capture_output=True,
                       text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stdout + r.stderr
    for warning in ("Warning", "deprecated", "would be ignored"):
        assert warning not in log, log[log.find(warning) - 500:log.find(warning) + 500]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    assert "dossier/formats/templates/report.html.j2" in zipfile.ZipFile(wheel).namelist()


def _build_requirements(requires: list[Requirement], folder: Path) -> Path | None:
    """None when this environment has what [build-system] requires; else ``folder``, into which
    pip installed what it lacks (to put first on PYTHONPATH). Skips the test when pip cannot."""
    unmet = []
    for req in requires:
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append((req, have))
    if not unmet:
        return None
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(folder),
                        "--retries", "1", "--timeout", "30", *(str(req) for req, _ in unmet)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        lacks = ", ".join(f"{req} (this environment has {have or 'none'})" for req, have in unmet)
        why = (r.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"the build needs {lacks}, and pip could not install it ({why}); "
                    f"pip install {' '.join(repr(str(req)) for req, _ in unmet)} to run this test")
    return folder
