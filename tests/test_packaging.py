"""Packaging: the package builds from a clean copy of the repository without a setuptools
warning, and the wheel holds the files the code reads that are not Python (the report's
template)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_make_sample_builds_without_setuptools_warnings(tmp_path: Path) -> None:
    """The install step of `make sample` (an editable install runs the same build backend):
    no deprecation warning, no "package would be ignored"."""
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT,
                           check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    # this environment's setuptools when it meets [build-system] requires (no download), else
    # pip's isolated build environment with what pyproject.toml asks for (a fresh venv's
    # setuptools 65 rejects the license string)
    isolation = ["--no-build-isolation"] if _build_requirements_met() else []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                        "-v", str(src), "-w", str(tmp_path / "wheel")], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stdout + r.stderr
    for warning in ("Warning", "deprecated", "would be ignored"):
        assert warning not in log, log[log.find(warning) - 500:log.find(warning) + 500]
    import zipfile

    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    assert "dossier/formats/templates/report.html.j2" in zipfile.ZipFile(wheel).namelist()


def _build_requirements_met() -> bool:
    """Whether this environment has what pyproject.toml's [build-system] requires."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        req = Requirement(text)
        try:
            if not req.specifier.contains(metadata.version(req.name), prereleases=True):
                return False
        except metadata.PackageNotFoundError:
            return False
    return True

