"""Integrity: ``dossier verify --integrity-only`` names every missing, extra or altered file,
and any edit of the manifest breaks its dossier id."""

from __future__ import annotations

import json
import mmap
import os
import random
from pathlib import Path

import _bundles as h
import pytest

from dossier.bundle import ProblemKind, check_integrity, open_bundle, pack_bundle
from dossier.errors import ExitCode
from dossier.hashing import digest_bytes


@pytest.fixture
def bundle(rel: dict[str, h.Released], tmp_path: Path) -> Path:
    """A private copy of the convnet bundle."""
    return h.copy_bundle(rel["convnet"].bundle, tmp_path)


def _verify(path: Path) -> tuple[int, list[str]]:
    res = h.cli("verify", path, "--integrity-only")
    return res.exit_code, res.stderr.splitlines()


def _offsets(size: int, rng: random.Random) -> list[int]:
    if size <= 64:
        return list(range(size))
    return sorted({0, size - 1, size // 2, *(rng.randrange(size) for _ in range(3))})


def test_intact_bundle_verifies(bundle: Path) -> None:
    code, lines = _verify(bundle)
    assert code == 0 and len(lines) == 1
    assert lines[0].startswith("OK: convnet-1 (") and "files intact" in lines[0]
    res = h.cli("verify", bundle)  # without --integrity-only: integrity, then the environment
    assert res.exit_code == 0, h.said(res)
    assert res.stderr.splitlines()[0].startswith("OK: ")
    assert "verdict: VALID" in res.stdout


@pytest.mark.parametrize("name", ["convnet", "tblock"])
def test_every_byte_of_every_file_counts(rel: dict[str, h.Released], tmp_path: Path,
                                         name: str) -> None:
    """Flip bytes of every file (all bytes of tiny ones, sampled offsets of larger ones):
    verify fails and names the file."""
    bundle = h.copy_bundle(rel[name].bundle, tmp_path)
    rng = random.Random(7)
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    assert len(files) >= 17
    flips = 0
    for path in files:
        rel = path.relative_to(bundle).as_posix()
        data = path.read_bytes()
        for offset in _offsets(len(data), rng):
            damaged = bytearray(data)
            damaged[offset] ^= 0xFF
            path.write_bytes(bytes(damaged))
            code, lines = _verify(bundle)
            assert code == ExitCode.BUNDLE, (rel, offset)
            assert any(rel in line for line in lines), (rel, offset, lines)
            if rel != "manifest.json":
                assert any(line.startswith(f"FAIL: {rel}: altered") for line in lines), (
                    rel, offset, lines)
            flips += 1
        path.write_bytes(data)
    assert flips > 80
    assert _verify(bundle)[0] == 0


def test_truncation_is_named(bundle: Path) -> None:
    path = bundle / "engine" / "convnet.ort"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    code, lines = _verify(bundle)
    assert code == ExitCode.BUNDLE
    assert any(line.startswith("FAIL: engine/convnet.ort: altered") for line in lines)


def test_extra_and_missing_files_are_each_named(bundle: Path) -> None:
    (bundle / "notes.txt").write_text("hello")
    (bundle / "validation" / "pair-009").mkdir()
    (bundle / "validation" / "pair-009" / "inputs.arrow").write_bytes(b"x")
    (bundle / "knobs.json").unlink()
    (bundle / "validation" / "pair-001" / "references.arrow").unlink()
    code, lines = _verify(bundle)
    assert code == ExitCode.BUNDLE
    fails = [line for line in lines if line.startswith("FAIL: ")]
    assert fails == [
        "FAIL: knobs.json: missing",
        "FAIL: notes.txt: extra (not in the manifest's file table)",
        "FAIL: validation/pair-001/references.arrow: missing",
        "FAIL: validation/pair-009/inputs.arrow: extra (not in the manifest's file table)",
    ]
    assert lines[-1].endswith("integrity check failed (4 problem(s))")


def test_links_in_place_of_files_are_named(bundle: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    target = bundle / "fingerprint.json"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    os.symlink(outside, target)  # same bytes, but a link
    os.symlink(tmp_path, bundle / "elsewhere")
    with open_bundle(bundle) as b:
        report = check_integrity(b)
    assert not report
    kinds = {(p.path, p.kind) for p in report.problems}
    assert kinds == {("fingerprint.json", ProblemKind.ALTERED), ("elsewhere", ProblemKind.EXTRA)}


def test_editing_the_manifest_breaks_its_id(bundle: Path) -> None:
    manifest = bundle / "manifest.json"
    data = json.loads(manifest.read_text())
    data["summary"]["shipped_route"] = "-graph_optimization_level=disable_all"
    manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    code, lines = _verify(bundle)
    assert code == ExitCode.BUNDLE
    assert any(line.startswith("FAIL: manifest.json: altered (its content no longer matches "
                               "its dossier id") for line in lines)


def test_reformatting_the_manifest_keeps_its_id(bundle: Path) -> None:
    """The id is over canonical JSON: whitespace and key order do not matter."""
    manifest = bundle / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(dict(reversed(list(data.items())))))
    assert _verify(bundle)[0] == 0


def test_a_forged_file_table_still_fails_on_the_id(bundle: Path) -> None:
    """Replacing a file and its table entry without recomputing the id is caught."""
    manifest = bundle / "manifest.json"
    (bundle / "knobs.json").write_text("{}")
    data = json.loads(manifest.read_text())
    for entry in data["files"]:
        if entry["path"] == "knobs.json":
            entry["size"] = 2
            entry["digest"] = digest_bytes(b"{}")
    manifest.write_text(json.dumps(data))
    code, lines = _verify(bundle)
    assert code == ExitCode.BUNDLE
    assert [line for line in lines if line.startswith("FAIL")] == [
        line for line in lines if line.startswith("FAIL: manifest.json")]


def test_report_object(bundle: Path) -> None:
    with open_bundle(bundle) as b:
        ok = check_integrity(b)
        assert ok and ok.ok and ok.checked == len(b.manifest.files)
        assert str(ok).endswith(b.manifest.dossier_id)
    (bundle / "routes.parquet").unlink()
    with open_bundle(bundle) as b:
        bad = check_integrity(b)
    assert not bad and [str(p) for p in bad.problems] == ["routes.parquet: missing"]


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_verify_reads_every_byte_once(tmp_path: Path) -> None:
    """``verify --integrity-only`` of a signed bundle with a 12 MiB engine (xxh3-128 for the
    manifest, BLAKE3 for the signature) and a full ``verify`` read the bundle about once, a
    folder or an archive (which a full verify of a signed bundle extracts whole, its digests
    computed as it is written):
    rchar (bytes read, page cache included) grows by less than 1.5 times its size (reading it
    twice, once per digest, would be over 2)."""
    import importlib.util

    from dossier.trust.signing import generate_key_pair, sign_bundle

    spec = importlib.util.spec_from_file_location(
        "verify_speed", Path(__file__).resolve().parents[2] / "bench" / "verify_speed.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bundle = bench.make_bundle(tmp_path / "convnet-1.dossier", 12 << 20)
    size = bench.bundle_size(bundle)
    keys = generate_key_pair(tmp_path / "keys")
    sign_bundle(bundle, keys.private)
    verdicts = (0, ExitCode.SUBOPTIMAL, ExitCode.INVALID)  # the golden bundle's host is not this
    packed = pack_bundle(bundle, tmp_path / "packed")  # a signed archive: extracted whole by
    sign_bundle(packed, keys.private)                   # a full verify, hashed as it is written
    for path, read_once in ((bundle, size), (packed, packed.stat().st_size)):
        args = [path, "--trusted-key", keys.public]
        for extra in (["--integrity-only"], []):
            assert h.cli("verify", *args, *extra).exit_code in verdicts  # imports done
            before = _rchar()
            res = h.cli("verify", *args, *extra)
            grown = _rchar() - before
            assert res.exit_code in verdicts, h.said(res)
            assert "signature" in res.stderr and "files intact" in res.stderr
            assert read_once < grown < 1.5 * read_once, (path.name, extra, grown, read_once)


def test_hashing_reads_into_a_page_aligned_buffer() -> None:
    """The kernel copies from the page cache into the read buffer; into one 16 bytes past a page
    boundary (a bytearray's) that copy took 4x as long on the 2-core test hosts."""
    import ctypes
    import io

    from dossier.hashing import CHUNK, digest_stream

    seen: list[int] = []

    class Recording(io.BytesIO):
        def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
            seen.append(ctypes.addressof(ctypes.c_char.from_buffer(buf)) % mmap.PAGESIZE)
            return super().readinto(buf)

    data = random.Random(7).randbytes(CHUNK + 5)
    assert digest_stream(Recording(data)) == (digest_bytes(data), len(data))
    assert seen and set(seen) == {0}
