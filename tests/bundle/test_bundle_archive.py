"""The single-file form: deterministic ``dossier pack``, every command accepting the .tar,
and safe extraction that refuses every archive attack before writing a byte."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import _bundles as h
import pytest

from dossier.bundle import check_integrity, extract_archive, open_bundle, pack_bundle, write_bundle
from dossier.errors import ExitCode, UnsafeArchiveError

ROOT = "convnet-1.dossier"


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
        assert b.source == packed
        assert b.routes().num_rows == len(b.tuning_cache().trials)  # one row per trial
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
    if kind == "missing":  # fewer members than the manifest lists
        return [(m, d) for m, d in members if m.name != knobs]
    if kind == "undersize":
        data = next(d for m, d in members if m.name == knobs)[:-10]
        return replace(knobs, (_info(knobs, size=len(data)), data))
    raise AssertionError(kind)


ATTACKS = ["absolute", "dotdot", "dotdot-deep", "symlink", "symlink-folder", "hardlink", "device",
           "block-device", "fifo", "oversize", "not-in-table", "folder-not-in-table", "duplicate",
           "outside-root", "missing", "undersize"]


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


# ------------------------------------------------------ checked before extraction, streamed
def _flip_member(packed: Path, tmp_path: Path, name: str) -> Path:
    """The archive with one byte of member ``name`` changed (same size: headers all agree)."""
    with tarfile.open(packed) as tar:
        offset = tar.getmember(f"{ROOT}/{name}").offset_data
    data = bytearray(packed.read_bytes())
    data[offset + 7] ^= 0xFF
    out = tmp_path / "altered.dossier.tar"
    out.write_bytes(bytes(data))
    return out


def test_a_member_is_verified_as_it_streams(packed: Path, tmp_path: Path) -> None:
    """A changed byte (sizes and headers all agree with the manifest) is caught while the
    member streams: extraction stops naming it and removes what it wrote; verify names it
    without extracting anything."""
    from dossier.errors import IntegrityError

    altered = _flip_member(packed, tmp_path, "knobs.json")
    with pytest.raises(IntegrityError, match="member knobs.json is altered"):
        extract_archive(altered, tmp_path / "target")
    assert not (tmp_path / "target").exists()
    res = h.cli("verify", altered, "--integrity-only")
    assert res.exit_code == ExitCode.BUNDLE and "FAIL: knobs.json: altered" in res.stderr


@pytest.fixture
def extractions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every member extracted from an archive, in order (the real extraction still runs)."""
    import dossier.bundle.archive as archive

    done: list[str] = []
    real = archive.extract_member

    def record(index, rel, dest, *more, **kw):  # type: ignore[no-untyped-def]
        done.append(rel)
        return real(index, rel, dest, *more, **kw)

    monkeypatch.setattr(archive, "extract_member", record)
    return done


def test_commands_that_need_no_files_extract_none(packed: Path, extractions: list[str]) -> None:
    """verify --integrity-only hashes the members in place; inspect and explain extract the
    records they read (the tuning cache: per-output losses, load hints), never an engine, the
    model or the validation set; a full verify extracts what the environment check reads."""
    assert h.cli("verify", packed, "--integrity-only").exit_code == 0
    assert extractions == []
    for command in ("inspect", "explain"):
        assert h.cli(command, packed).exit_code == 0
        assert extractions and not any(r.startswith(("engine/", "model/", "validation/"))
                                       for r in extractions), (command, extractions)
        extractions.clear()
    assert h.cli("verify", packed).exit_code in (0, ExitCode.SUBOPTIMAL)
    assert not any(r.startswith(("engine/", "model/", "validation/")) for r in extractions)


def _sparse_forgery(packed: Path, tmp_path: Path, rel_path: str, size: int) -> Path:
    """The archive whose manifest (id resealed) lists ``rel_path`` at ``size`` bytes, and whose
    member has that size: a hole in a sparse file, so the test writes no such amount."""
    from dossier.bundle.manifest import body_digest

    members = _load(packed)
    manifest = json.loads(next(d for m, d in members if m.name == f"{ROOT}/manifest.json"))
    for entry in manifest["files"]:
        if entry["path"] == rel_path:
            entry["size"] = size
    manifest["dossier_id"] = body_digest(manifest)
    raw = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    out = tmp_path / "forged.dossier.tar"
    with open(out, "wb") as f:
        for m, d in members:
            if m.name == f"{ROOT}/manifest.json":
                d = raw
            info = _info(m.name, m.type, size=len(d) if d is not None else 0)
            if m.name == f"{ROOT}/{rel_path}":
                info.size = size
                f.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
                f.seek(-(-size // 512) * 512, io.SEEK_CUR)  # a hole: nothing written
                continue
            f.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            if d:
                f.write(d + bytes(-len(d) % 512))
        f.write(bytes(1024))
    return out


def test_a_forged_manifest_listing_a_huge_member_extracts_nothing(
        packed: Path, tmp_path: Path, extractions: list[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """The manifest lists routes.parquet at 2 GiB, and the member is that large (the
    headers agree). inspect reads the manifest and exits 0; explain, which reads the routes,
    refuses in one line before extracting it (over its 1 GiB cap); verify --integrity-only
    hashes it in place and names it; nothing is written to TMPDIR by any of them."""
    import tempfile

    forged = _sparse_forgery(packed, tmp_path, "routes.parquet", 2 << 30)
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert h.cli("inspect", forged).exit_code == 0
    res = h.cli("explain", forged)
    assert res.exit_code == ExitCode.BUNDLE and res.stderr.count("error:") == 1
    assert "more than the 1073741824 this command allows" in h.said(res)
    assert "routes.parquet" not in extractions
    res = h.cli("verify", forged, "--integrity-only")
    assert res.exit_code == ExitCode.BUNDLE and "FAIL: routes.parquet: altered" in res.stderr
    assert list(tmp.iterdir()) == []


def test_temporary_folders_go_on_sigterm_and_stale_ones_are_removed(packed: Path,
                                                                    tmp_path: Path) -> None:
    """A process opening an archive and stopped by SIGTERM (the CLI's handler unwinds) removes
    its folder; one killed with SIGKILL leaves it, and the next command removes it once its
    process is gone and it is older than STALE_OPEN_S. A folder whose process lives, or a fresh
    one, is kept."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import subprocess_env as _env

    from dossier.bundle.reader import STALE_OPEN_S

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    script = ("import signal, sys, time\n"
              "from dossier_cli.main import _terminated\n"
              "signal.signal(signal.SIGTERM, _terminated)\n"
              "from dossier.bundle import open_bundle\n"
              "with open_bundle(sys.argv[1]) as b:\n"
              "    print(b.path, flush=True)\n"
              "    time.sleep(120)\n")
    left = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = subprocess.Popen([sys.executable, "-c", script, str(packed)],
                                env=_env(TMPDIR=str(tmp)), stdout=subprocess.PIPE, text=True)
        folder = Path(proc.stdout.readline().strip()).parent  # type: ignore[union-attr]
        assert folder.is_dir() and folder.parent == tmp
        proc.send_signal(sig)
        proc.wait(timeout=60)
        proc.stdout.close()  # type: ignore[union-attr]
        left[sig] = folder.exists()
    assert left == {signal.SIGTERM: False, signal.SIGKILL: True}
    killed = next(tmp.iterdir())
    fresh_dead = tmp / f"dossier-open-{killed.name.split('-')[2]}-0badc0ffee00"
    fresh_dead.mkdir()
    live = tmp / f"dossier-open-{os.getpid()}-0123456789ab"
    live.mkdir()
    old = time.time() - STALE_OPEN_S - 60
    for p in (killed, live):
        os.utime(p, (old, old))
    res = subprocess.run([sys.executable, "-m", "dossier_cli.main", "inspect", str(packed)],
                         env=_env(TMPDIR=str(tmp)), capture_output=True)
    assert res.returncode == 0
    assert sorted(p.name for p in tmp.iterdir()) == sorted([fresh_dead.name, live.name])
