"""The format version gate, manifest validation, and the golden 1.0 bundle."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import _bundles as h
import pytest

import dossier.bundle
from dossier.bundle import (
    FORMAT_VERSION,
    check_integrity,
    extract_archive,
    open_bundle,
    pack_bundle,
    parse_manifest,
)
from dossier.bundle.manifest import body_digest
from dossier.bundle.overview import overview_of
from dossier.bundle.tables import ROUTES_HEAD, ROUTES_TAIL, SHAPES_SCHEMA, TIMINGS_SCHEMA
from dossier.errors import BundleFormatError, ExitCode


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    """A private copy of the golden bundle."""
    return h.copy_bundle(h.GOLDEN, tmp_path)


def _edit(bundle: Path, change, *, reseal: bool = True) -> None:  # type: ignore[no-untyped-def]
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    if reseal:
        data["dossier_id"] = body_digest(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------- golden
def test_golden_bundle_still_opens_passes_integrity_and_reads_its_tables() -> None:
    res = h.cli("verify", h.GOLDEN, "--integrity-only")
    assert res.exit_code == 0, res.stderr
    with open_bundle(h.GOLDEN) as b:
        m = b.manifest
        assert (m.format, m.format_version, m.release, m.release_version) == (
            "dossier-bundle", "1.0", "convnet", 1)
        assert b.notes == [] and b.format_warning is None
        assert check_integrity(b)
        assert not m.model_included and m.model.file_name == "model.onnx"
        routes, timings, shapes = b.routes(), b.timings(), b.shapes()
        assert routes.column_names == ([n for n, _ in ROUTES_HEAD]
                                       + ["knob:graph_optimization_level"]
                                       + [n for n, _ in ROUTES_TAIL])
        assert routes.num_rows == len(b.tuning_cache().trials) >= 2
        assert timings.schema.equals(TIMINGS_SCHEMA) and timings.num_rows > 0
        assert shapes.schema.equals(SHAPES_SCHEMA) and shapes.num_rows == 3
        assert b.model_identity() == m.model
        info = b.validation_info()
        assert (info.metric, info.threshold, len(info.pairs)) == ("linf", 1e-4, 3)
        assert b.fingerprint().python.version
        assert b.engine_path().is_file() and b.engine_path("baseline").is_file()
        o = overview_of(b)
    assert o.winner.route and o.baseline.route == "-graph_optimization_level=all"
    assert (o.gain and o.speedup) or (not o.gain and "no significant gain" in o.reason)


def test_golden_bundle_packs_and_reopens(tmp_path: Path) -> None:
    tar = pack_bundle(h.GOLDEN, tmp_path)
    res = h.cli("inspect", tar, "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["dossier_id"] == json.loads(
        (h.GOLDEN / "manifest.json").read_text())["dossier_id"]


# --------------------------------------------------------------------------------- the gate
@pytest.mark.parametrize("version", ["2.0", "3.1", "0.9"])
def test_unknown_major_is_refused_first(golden: Path, version: str) -> None:
    _edit(golden, lambda d: d.update(format_version=version, summary="garbage"))
    with pytest.raises(BundleFormatError) as exc:
        with open_bundle(golden):
            pass
    text = str(exc.value)
    assert f"format version {version} cannot be read" in text and "1.x (up to 1.1)" in text
    for command in (("verify", golden, "--integrity-only"), ("inspect", golden)):
        res = h.cli(*command)
        assert res.exit_code == ExitCode.BUNDLE and version in h.said(res)


def test_unknown_major_in_an_archive_is_refused_before_the_members_are_checked(
        golden: Path, tmp_path: Path) -> None:
    tar = pack_bundle(golden, tmp_path / "ok")
    manifest = json.loads((golden / "manifest.json").read_text())
    manifest["format_version"] = "2.0"
    manifest["files"] = []  # every member is now "not in the file table"
    data = json.dumps(manifest).encode()
    evil = tmp_path / "v2.tar"
    with tarfile.open(tar) as src, tarfile.open(evil, "w", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            f = src.extractfile(m) if m.isreg() else None
            if m.name.endswith("/manifest.json"):
                m.size, f = len(data), io.BytesIO(data)
            dst.addfile(m, f)
    with pytest.raises(BundleFormatError, match=r"format version 2\.0 cannot be read"):
        extract_archive(evil, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_malformed_versions_and_formats_are_refused() -> None:
    for bad in ("1", "v1.0", "1.0.0", 1.0, None):
        with pytest.raises(BundleFormatError, match="is not MAJOR.MINOR"):
            parse_manifest(json.dumps({"format": "dossier-bundle", "format_version": bad}).encode())
    with pytest.raises(BundleFormatError, match="not a dossier bundle manifest"):
        parse_manifest(b'{"format": "something-else", "format_version": "1.0"}')
    with pytest.raises(BundleFormatError, match="not a dossier bundle manifest"):
        parse_manifest(b"[1, 2]")
    with pytest.raises(BundleFormatError, match="not valid JSON"):
        parse_manifest(b"\xff{")
    with pytest.raises(BundleFormatError, match="larger than"):
        parse_manifest(b" " * ((16 << 20) + 1))


def test_newer_minor_is_read_with_a_note(golden: Path) -> None:
    def newer(d: dict) -> None:
        d["format_version"] = "1.7"
        d["signed_by"] = "someone"  # fields a 1.7 writer may add, at any depth
        d["summary"]["energy_j"] = 1.5
        d["files"][0]["mode"] = "0644"

    _edit(golden, newer)
    with open_bundle(golden) as b:
        assert b.format_warning and "1.7 is newer than this reader's 1.1" in b.format_warning
        assert check_integrity(b)  # the id covers the unknown fields too
    res = h.cli("inspect", golden, "--json")
    assert res.exit_code == 0 and "newer than this reader" in h.said(res)
    assert json.loads(res.stdout)["notes"]
    _edit(golden, lambda d: d.update(signed_by="someone else"), reseal=False)
    assert h.cli("verify", golden, "--integrity-only").exit_code == ExitCode.BUNDLE


def test_manifest_of_the_known_version_must_match_the_model(golden: Path) -> None:
    _edit(golden, lambda d: d.update(surprise=True))
    res = h.cli("inspect", golden)
    assert res.exit_code == ExitCode.BUNDLE and "does not match bundle format 1.0" in h.said(res)


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "a//b", "./x", "a\\b"])
def test_unsafe_file_table_paths_are_refused(golden: Path, path: str) -> None:
    _edit(golden, lambda d: d["files"].append({"path": path, "size": 1, "digest": "0" * 32}))
    res = h.cli("verify", golden)
    assert res.exit_code == ExitCode.BUNDLE and "does not match bundle format" in h.said(res)


def test_unsorted_file_table_is_refused(golden: Path) -> None:
    _edit(golden, lambda d: d["files"].reverse())
    assert h.cli("verify", golden).exit_code == ExitCode.BUNDLE


def test_not_a_bundle(tmp_path: Path) -> None:
    res = h.cli("inspect", tmp_path)
    assert res.exit_code == ExitCode.BUNDLE and "has no manifest.json" in h.said(res)
    res = h.cli("verify", tmp_path / "nowhere")
    assert res.exit_code == ExitCode.BUNDLE and "not a bundle" in h.said(res)


def test_writer_writes_the_current_version(tmp_path: Path) -> None:
    assert FORMAT_VERSION == "1.1"  # 1.1 adds engines.*.load and summary.aa, confirm_aa
    shutil.copytree(h.GOLDEN, tmp_path / "g")
    data = (tmp_path / "g" / "manifest.json").read_bytes()
    raw, manifest, notes = parse_manifest(data)
    assert body_digest(raw) == manifest.dossier_id and notes == []


def test_public_names_are_exported_in_order() -> None:
    names = dossier.bundle.__all__
    assert names == sorted(names, key=str.casefold)
    for name in names:
        assert getattr(dossier.bundle, name) is not None
    public = {n for n in vars(dossier.bundle) if not n.startswith("_")}
    modules = {"archive", "builder", "integrity", "manifest", "model", "overview", "pack",
               "reader", "tables", "writer", "annotations"}
    assert public - modules == set(names)
