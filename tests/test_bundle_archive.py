"""The single-file form: deterministic ``dossier pack``, every command accepting the .tar,
and safe extraction that refuses every archive attack before writing a byte."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import test_bundle_helpers as h

from dossier.bundle import check_integrity, extract_archive, open_bundle, pack_bundle, write_bundle
from dossier.errors import ExitCode, UnsafeArchiveError

ROOT = "convnet-1.dossier"


@pytest.fixture(scope="module")
def rel(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> dict[str, h.Released]:
    return h.released(tmp_path_factory.mktemp("bundle-session"), samples_dir)


@pytest.fixture(scope="module")
def packed(rel: dict[str, h.Released], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packed")
    res = h.cli("pack", rel["convnet"].bundle, "--out", out)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == str(out / "convnet-1.dossier.tar")
    return out / "convnet-1.dossier.tar"


# -------------------------------------------------------------------------------- determinism
def test_packing_twice_gives_the_same_bytes(rel: dict[str, h.Released], packed: Path,
                                            tmp_path: Path) -> None:
    again = pack_bundle(rel["convnet"].bundle, tmp_path)
    assert again.read_bytes() == packed.read_bytes()
    repacked = pack_bundle(packed, tmp_path / "from-tar")  # packing the .tar itself
    assert repacked.read_bytes() == packed.read_bytes()


def test_bundling_a_run_twice_packs_to_the_same_bytes(rel: dict[str, h.Released],
                                                      tmp_path: Path) -> None:
    a = write_bundle(rel["convnet"].run, tmp_path / "a")
    b = write_bundle(rel["convnet"].run, tmp_path / "b")
    assert a.manifest.dossier_id == b.manifest.dossier_id
    ta, tb = pack_bundle(a.path, tmp_path / "a"), pack_bundle(b.path, tmp_path / "b")
    assert ta.read_bytes() == tb.read_bytes()


def test_archive_members_are_normalised(packed: Path) -> None:
    with tarfile.open(packed) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[:2] == [ROOT, f"{ROOT}/manifest.json"]
    assert names[2:] == sorted(names[2:])
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        assert m.mode == (0o755 if m.isdir() else 0o644)
        assert m.isdir() or m.isreg()
        assert not m.pax_headers
    assert packed.stat().st_size % tarfile.RECORDSIZE == 0


def test_extraction_round_trips(rel: dict[str, h.Released], packed: Path,
                                tmp_path: Path) -> None:
    folder = extract_archive(packed, tmp_path / "x")
    assert h.snapshot(folder) == h.snapshot(rel["convnet"].bundle)


# ---------------------------------------------------------------------- commands take the .tar
def test_every_bundle_command_accepts_the_tar(rel: dict[str, h.Released], packed: Path) -> None:
    res = h.cli("verify", packed, "--integrity-only")
    assert res.exit_code == 0 and res.stderr.startswith("OK: convnet-1")
    from_tar = json.loads(h.cli("inspect", packed, "--json").stdout)
    from_dir = json.loads(h.cli("inspect", rel["convnet"].bundle, "--json").stdout)
    assert from_tar.pop("bundle") == str(packed)
    from_dir.pop("bundle")
    assert from_tar == from_dir
    with open_bundle(packed) as b:
        extracted = b.path
        assert b.source == packed and b.routes().num_rows == 2
        assert check_integrity(b)
    assert not extracted.exists()  # the temporary extraction is gone


def test_pack_refuses_an_existing_archive_and_a_damaged_bundle(rel: dict[str, h.Released],
                                                               packed: Path,
                                                               tmp_path: Path) -> None:
    before = packed.read_bytes()
    res = h.cli("pack", rel["convnet"].bundle, "--out", packed.parent)
    assert res.exit_code == ExitCode.OUTPUT and "exists already" in h.said(res)
    assert packed.read_bytes() == before
    damaged = h.copy_bundle(rel["convnet"].bundle, tmp_path)
    (damaged / "knobs.json").write_text("{}")
    res = h.cli("pack", damaged, "--out", tmp_path / "out")
    assert res.exit_code == ExitCode.BUNDLE and "knobs.json" in h.said(res)
    assert not (tmp_path / "out" / "convnet-1.dossier.tar").exists()


# ------------------------------------------------------------------------------------ attacks
def _load(tar_path: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f else None))
    return out


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, link, 0o644
    return info


def _attack(kind: str, members: list, outside: Path) -> list:
    knobs = f"{ROOT}/knobs.json"

    def replace(name: str, new: tuple) -> list:
        return [new if m.name == name else (m, d) for m, d in members]

    if kind == "absolute":
        return [*members, (_info(str(outside / "evil"), size=1), b"x")]
    if kind == "dotdot":
        return [*members, (_info(f"{ROOT}/../evil", size=1), b"x")]
    if kind == "dotdot-deep":
        return [*members, (_info(f"{ROOT}/engine/../../../evil", size=1), b"x")]
    if kind == "symlink":
        return replace(knobs, (_info(knobs, tarfile.SYMTYPE, link=str(outside / "evil")), None))
    if kind == "symlink-folder":
        return [*members[:1], (_info(f"{ROOT}/engine", tarfile.SYMTYPE, link=str(outside)), None),
                *members[1:]]
    if kind == "hardlink":
        return replace(knobs, (_info(knobs, tarfile.LNKTYPE, link=f"{ROOT}/fingerprint.json"),
                               None))
    if kind == "device":
        return replace(knobs, (_info(knobs, tarfile.CHRTYPE), None))
    if kind == "block-device":
        return replace(knobs, (_info(knobs, tarfile.BLKTYPE), None))
    if kind == "fifo":
        return replace(knobs, (_info(knobs, tarfile.FIFOTYPE), None))
    if kind == "oversize":
        data = next(d for m, d in members if m.name == knobs) + b" " * 4096
        return replace(knobs, (_info(knobs, size=len(data)), data))
    if kind == "not-in-table":
        return [*members, (_info(f"{ROOT}/extra.txt", size=1), b"x")]
    if kind == "folder-not-in-table":
        return [*members, (_info(f"{ROOT}/stuff", tarfile.DIRTYPE), None)]
    if kind == "duplicate":
        data = next(d for m, d in members if m.name == knobs)
        return [*members, (_info(knobs, size=len(data)), data)]
    if kind == "outside-root":
        return [*members, (_info("other.dossier/knobs.json", size=1), b"x")]
    raise AssertionError(kind)


ATTACKS = ["absolute", "dotdot", "dotdot-deep", "symlink", "symlink-folder", "hardlink", "device",
           "block-device", "fifo", "oversize", "not-in-table", "folder-not-in-table", "duplicate",
           "outside-root"]


@pytest.mark.parametrize("kind", ATTACKS)
def test_archive_attacks_are_refused_before_anything_is_written(packed: Path, tmp_path: Path,
                                                                 kind: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in _attack(kind, _load(packed), outside):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    parent = tmp_path / "parent"
    parent.mkdir()
    before = h.snapshot(tmp_path)
    with pytest.raises(UnsafeArchiveError) as exc:
        extract_archive(evil, parent / "target")
    assert "nothing was extracted" in str(exc.value)
    assert h.snapshot(tmp_path) == before  # target never created; nothing outside either
    assert not (tmp_path / "evil").exists() and not (outside / "evil").exists()

    for args in (("verify", evil, "--integrity-only"), ("inspect", evil)):
        res = h.cli(*args)
        assert res.exit_code == ExitCode.BUNDLE
        assert "nothing was extracted" in h.said(res)
    assert h.snapshot(tmp_path) == before


def test_not_an_archive_is_a_format_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.dossier.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    res = h.cli("verify", junk)
    assert res.exit_code == ExitCode.BUNDLE and "neither a bundle folder nor" in h.said(res)
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    assert h.cli("inspect", empty).exit_code == ExitCode.BUNDLE
