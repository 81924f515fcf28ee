"""The Makefile and CI's script as the README and the Makefile describe them: what ``make
sample``, ``make setup`` and ``make test`` install and remove, and the steps CI runs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_make_sample_installs_no_torch_and_removes_a_stale_signature() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry(target: str) -> str:
        return subprocess.run(["make", "-n", "-B", target], capture_output=True, text=True,
                              cwd=ROOT, check=True).stdout

    assert "torch" not in dry("sample")
    assert "install -q 'torch==" in dry("setup") and "install -q 'torch==" in dry("test")
    assert "install -q 'torch" not in subprocess.run(["make", "-n", "-B", "setup", "TORCH="],
                                         capture_output=True, text=True, cwd=ROOT,
                                         check=True).stdout
    assert re.search(r"rm -rf .*out/convnet-1\.dossier\.sig\.json", dry("sample"))


def test_make_test_and_ci_are_described_as_they_are() -> None:
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "(what CI runs)" not in makefile and "what CI runs" not in README
    for step in ("make typecheck", "make test", "mkdocs build --strict"):
        assert step in ci and step in README, step
    assert "chromium" in ci and "docker-registry" in ci
