"""Names read from a bundle (``dossier/names.py``): a crafted release name or model file name is
refused as malformed by every command that builds a path from it, and every such path is
checked, links followed, to lie inside its folder. The registry's commands (``pull``, ``push``,
``verify REF``) are in test_registry_hostile.py.

Every case here failed before its fix; the docstrings say what happened."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bundles as h
import pytest
from _hostile import ESCAPES, _craft, _everything, _no_controls, _release

from dossier.errors import ExitCode


@pytest.mark.parametrize("release", ESCAPES)
def test_pack_refuses_a_crafted_release_name(bundle: Path, tmp_path: Path, release: str) -> None:
    """Before: pack wrote ``escaped-1.dossier.tar`` outside --out, its members absolute."""
    _craft(bundle, _release(release.format(tmp=tmp_path)))
    before = _everything(tmp_path)
    res = h.cli("pack", bundle, "--out", tmp_path / "out" / "deep")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert "release" in h.said(res) and res.stderr.count("\n") == 1
    assert _everything(tmp_path) - before <= {"out", "out/deep"}


@pytest.mark.parametrize("edit", [
    _release("../../escaped"),
    lambda raw: raw["model"].update(file_name="../../../../model.onnx"),
], ids=["release ../../escaped", "model.file_name ../../../../model.onnx"])
def test_retune_refuses_a_crafted_name(bundle: Path, tmp_path: Path,
                                       edit: Callable[[dict[str, Any]], None]) -> None:
    """Before: retune put its run folder outside --out, or loaded a model from elsewhere on the
    host through ``model.file_name``."""
    _craft(bundle, edit)
    before = _everything(tmp_path)
    res = h.cli("retune", bundle, "--out", tmp_path / "a" / "b" / "out", "--quiet")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert _everything(tmp_path) == before


def test_a_release_name_with_control_characters_is_refused(bundle: Path) -> None:
    """Before: a release name with a newline and ESC became a folder name."""
    _craft(bundle, _release("convnet\n\x1b[2J"))
    res = h.cli("inspect", bundle)
    assert res.exit_code == ExitCode.BUNDLE and "release" in h.said(res)
    assert _no_controls(res.stderr + res.stdout)


def test_inside_follows_links_before_it_judges(tmp_path: Path) -> None:
    from dossier.errors import BundleFormatError
    from dossier.names import inside

    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(tmp_path / "elsewhere")
    assert inside(out, out / "a.dossier", "x") == out / "a.dossier"
    for target in (out / "link" / "a.dossier", out / ".." / "a.dossier", out):
        with pytest.raises(BundleFormatError, match="outside"):
            inside(out, target, "x")
