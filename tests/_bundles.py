"""Shared helpers of the bundle tests: small release specs of the samples, released bundles
(made once per session and shared by every test module that asks), CLI calls, tree snapshots.
No tests here."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import cli

from dossier.hashing import digest_file

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "assets" / "golden" / "convnet-1.dossier"

SMALL_TIMING = {"samples": 12, "rounds": 6, "block_warmup": 1, "warmup_window": 2,
                "warmup_min_runs": 1, "warmup_max_s": 0.2, "confirm_top": 1,
                "confirm_rounds": 3, "confirm_warmup": 2, "confirm_runs": 5,
                "confirm_block_s": 0.05, "confirm_processes": 3, "confirm_max_processes": 3}
"""Timing settings that make a trial take well under a second."""

SELECTIONS = {
    "convnet": "-graph_optimization_level=[all|disable_all]",
    "tblock": "-graph_optimization_level=[all|basic]",
}
"""Two-route selections of the samples (a baseline and one search trial)."""

_STATE: dict[str, Any] = {}


def samples(samples_dir: Path | None = None) -> dict[str, Path]:
    """Name -> sample folder, from conftest's ``samples_dir`` (remembered after the first call)."""
    if "samples" not in _STATE:
        assert samples_dir is not None, "pass conftest's samples_dir first"
        _STATE["samples"] = {n: samples_dir / n for n in ("convnet", "tblock")}
    return _STATE["samples"]  # type: ignore[no-any-return]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def write_spec(path: Path, sample: Path, *, name: str | None = None, version: int = 1,
               selection: str | None = None, shapes: list[dict] | None = None,
               timing: dict | None = None, validation: Path | None = None,
               model: Path | None = None) -> Path:
    """A release.toml for ``sample`` with absolute paths, small timing and a 2-route selection."""
    base = tomllib.loads((sample / "release.toml").read_text())
    tune = {**base["tune"], "selection": selection or SELECTIONS[sample.name]}
    lines = ["[release]", f"name = {_toml_value(name or base['release']['name'])}",
             f"version = {version}", f"description = {_toml_value(base['release']['description'])}",
             "", "[model]", f"path = {_toml_value(str(model or sample / 'model.onnx'))}", "",
             "[validation]", f"path = {_toml_value(str(validation or sample / 'validation'))}",
             "", "[tune]", *(f"{k} = {_toml_value(v)}" for k, v in tune.items()), "",
             "[timing]", *(f"{k} = {_toml_value(v)}" for k, v in (timing or SMALL_TIMING).items())]
    for entry in base.get("shapes", []) if shapes is None else shapes:
        lines += ["", "[[shapes]]", *(f"{k} = {_toml_value(v)}" for k, v in entry.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Released:
    """A sample released with ``dossier release``."""

    name: str
    out: Path
    """The --out folder."""
    bundle: Path
    """OUT/NAME-1.dossier."""
    run: Path
    """The run folder the release tuned into (OUT/.runs/NAME-1)."""
    stdout: str
    stderr: str


EXTRA_SHAPE = {"weight": 0.1, "inputs": {"x": [16, 32, 128]}}
"""A shape entry (batch 16) that no tblock validation pair covers: the writer must warn."""


def released(root: Path, samples_dir: Path) -> dict[str, Released]:
    """Both samples released once per session with small timing into ``root``. The tblock
    spec gets an extra, uncovered shape entry (batch 16)."""
    if "released" not in _STATE:
        found = samples(samples_dir)
        out: dict[str, Released] = {}
        for name, folder in found.items():
            shapes = None
            if name == "tblock":
                shapes = tomllib.loads((folder / "release.toml").read_text())["shapes"] + [
                    EXTRA_SHAPE]
            spec = write_spec(root / "specs" / name / "release.toml", folder, shapes=shapes)
            dest = root / "released" / name
            result = cli("release", spec, "--out", dest, "--quiet")
            assert result.exit_code == 0, result.stderr
            out[name] = Released(name, dest, dest / f"{name}-1.dossier", dest / ".runs" / f"{name}-1",
                                 result.stdout, result.stderr)
        _STATE["released"] = out
    return _STATE["released"]  # type: ignore[no-any-return]


def copy_bundle(src: Path, dest_parent: Path) -> Path:
    """A private copy of a bundle folder (tests that damage bundles damage copies)."""
    dest = dest_parent / src.name
    shutil.copytree(src, dest, symlinks=True)
    return dest


def snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root`` (and ``root`` itself): type, size, content digest."""
    out: dict[str, tuple[str, int, str]] = {}
    if not root.exists():
        return out
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", 0, os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", 0, "")
            else:
                out[rel] = ("file", p.stat().st_size, digest_file(p)[0])
    return out


def rewrite_cache(cache: Path, edit: Any) -> None:
    """Rewrite a tuning cache line by line: ``edit(record_dict) -> record_dict | None``
    (None drops the line)."""
    lines = []
    for line in cache.read_text().splitlines():
        rec = edit(json.loads(line))
        if rec is not None:
            lines.append(json.dumps(rec))
    cache.write_text("\n".join(lines) + "\n")


def reseal(bundle: Path, edit: Any = None) -> None:
    """Rewrite a bundle folder's manifest after its files were edited: ``edit(manifest)`` on
    the parsed JSON first, when given; then every file's digest and size, and the id."""
    from dossier.bundle.manifest import body_digest

    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    if edit is not None:
        edit(manifest)
    for entry in manifest["files"]:
        entry["digest"], entry["size"] = digest_file(bundle / entry["path"])
    manifest["dossier_id"] = body_digest(manifest)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def said(result: Any) -> str:
    """A CLI result's stderr with line wrapping undone (rich wraps long error lines)."""
    return " ".join(result.stderr.split())
