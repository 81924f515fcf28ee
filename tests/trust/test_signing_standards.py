"""A dossier signature checked by code that is not dossier's: securesystemslib's DSSE Envelope
and its Ed25519 key, the in-toto attestation package's Statement (and SLSA provenance v1)
model, hashlib and ``sha256sum``. These fail when the PAE, the key encoding, the statement's
shape or the subjects' digests drift from the standards. Also: docs/signing.md's script run as
the page prints it, with dossier made unimportable; format-1 envelopes (subjects with BLAKE3
only, as dossier wrote them before SHA-256 subjects) verified from a fixture made by that code;
an unknown format refused by name; the archive walk of the signature check refusing what the
archive reader refuses."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bundles as h
import blake3
import pytest
from cryptography.hazmat.primitives import serialization
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1.provenance_pb2 import Provenance
from in_toto_attestation.v1.statement import Statement
from in_toto_attestation.v1.statement_pb2 import Statement as StatementProto
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from dossier.bundle import open_bundle, pack_bundle
from dossier.bundle.archive import index_archive
from dossier.errors import ExitCode, SignatureError, UnsafeArchiveError
from dossier.hashing import canonical_json
from dossier.trust.signing import (
    PAYLOAD_TYPE,
    KeyPair,
    check_signature,
    check_signature_at,
    generate_key_pair,
    load_private_key,
    pae,
    sign_bundle,
    signature_path,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "signing.md"
FORMAT_1 = ROOT / "tests" / "assets" / "signature-format-1"
"""``convnet-1.dossier.sig.json``: the golden convnet bundle signed by dossier before subjects
carried SHA-256 (``sign_bundle`` of commit 775f37f), and the public key it was signed
with."""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    folder = tmp_path_factory.mktemp("keys")
    return {name: generate_key_pair(folder, name) for name in ("release", "stranger")}


@pytest.fixture
def signed(tmp_path: Path, keys: dict[str, KeyPair]) -> Path:
    """A private copy of the golden convnet bundle, signed with the release key."""
    bundle = h.copy_bundle(h.GOLDEN, tmp_path / "out")
    sign_bundle(bundle, keys["release"].private)
    return bundle


def _files(bundle: Path) -> dict[str, bytes]:
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in sorted(bundle.rglob("*"))
            if p.is_file()}


def _raw(public_pem: Path) -> bytes:
    key = serialization.load_pem_public_key(public_pem.read_bytes())
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# ---------------------------------------------------------------------- independent verifiers
def test_a_dossier_signature_verifies_with_securesystemslib_and_in_totos_model(
        signed: Path, keys: dict[str, KeyPair]) -> None:
    wire = json.loads(signature_path(signed).read_text())
    [sig] = wire["signatures"]
    envelope = Envelope.from_dict(json.loads(json.dumps(wire)))  # from_dict edits its input
    assert envelope.payload_type == PAYLOAD_TYPE == "application/vnd.in-toto+json"

    # the PAE: securesystemslib's, DSSE's spelled out here, and dossier's are the same bytes
    body, kind = envelope.payload, envelope.payload_type.encode()
    spelled = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)
    assert envelope.pae() == spelled == pae(PAYLOAD_TYPE, body)

    # the signer's PEM key, as securesystemslib loads it, verifies the envelope
    pem = serialization.load_pem_public_key(keys["release"].public.read_bytes())
    trusted = SSlibKey.from_crypto(pem, keyid=sig["keyid"])
    assert trusted.keytype == "ed25519" and trusted.scheme == "ed25519"
    assert set(envelope.verify([trusted], threshold=1)) == {sig["keyid"]}
    stranger = SSlibKey.from_crypto(serialization.load_pem_public_key(
        keys["stranger"].public.read_bytes()), keyid=sig["keyid"])
    with pytest.raises(VerificationError):
        envelope.verify([stranger], threshold=1)

    # the key encoding: publicKey is the raw 32-byte key in base64, the key id its BLAKE3;
    # securesystemslib's own ed25519 key form (hex of the raw key) built from it verifies too
    raw = base64.b64decode(sig["publicKey"], validate=True)
    assert raw == _raw(keys["release"].public) and len(raw) == 32
    assert sig["keyid"] == blake3.blake3(raw).hexdigest()
    embedded = SSlibKey.from_dict(sig["keyid"], {"keytype": "ed25519", "scheme": "ed25519",
                                                 "keyval": {"public": raw.hex()}})
    assert set(envelope.verify([embedded], threshold=1)) == {sig["keyid"]}
    assert embedded.keyval == trusted.keyval

    # the statement, parsed strictly (an unknown field fails) by in-toto's model and validated;
    # its predicate by in-toto's SLSA provenance v1 model
    assert body == canonical_json(json.loads(body))  # canonical JSON, as documented
    proto = json_format.Parse(body, StatementProto())
    Statement.copy_from_pb(proto).validate()
    assert proto.type == "https://in-toto.io/Statement/v1"
    assert proto.predicate_type == "https://slsa.dev/provenance/v1"
    provenance = json_format.Parse(json.dumps(json.loads(body)["predicate"]), Provenance())
    assert provenance.build_definition.internal_parameters["statementFormat"] == 2

    # the subjects: every file of the bundle (manifest.json included) with the SHA-256 hashlib
    # computes here, and the BLAKE3 beside it; nothing else
    files = _files(signed)
    assert "manifest.json" in files and len(files) == 17
    subjects = {s.name: dict(s.digest) for s in proto.subject}
    assert subjects == {rel: {"sha256": hashlib.sha256(data).hexdigest(),
                              "blake3": blake3.blake3(data).hexdigest()}
                        for rel, data in files.items()}
    products = {d.name: dict(d.digest) for d in provenance.run_details.byproducts}
    assert products["tuning-cache.jsonl"] == subjects["tuning-cache.jsonl"]


# ------------------------------------------------------------------------- the page's script
def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)


def _page_run(folder: Path) -> subprocess.CompletedProcess[str]:
    """docs/signing.md's commands (less ``pip install``) in ``folder``, which holds the page's
    script as verify_dossier.py; dossier cannot be imported there."""
    [block] = [b for b in _blocks("bash") if "verify_dossier.py" in b]
    commands = [c for c in block.splitlines() if not c.startswith("pip install")]
    assert any("sha256sum --check" in c for c in commands)
    shadow = folder / "shadow" / "dossier"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('the page must not need dossier')\n")
    # `python` on the page is this interpreter (the one with the page's packages installed),
    # whatever the PATH of the run that started the tests
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python"  # a script, not a link: a venv is found by the path run
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(folder / "shadow")}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(commands)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def _lay_out(signed: Path, public: Path, folder: Path) -> Path:
    folder.mkdir()
    shutil.copytree(signed, folder / "convnet-1.dossier")
    shutil.copy(signature_path(signed), folder / "convnet-1.dossier.sig.json")
    shutil.copy(public, folder / "dossier.pub")
    [script] = _blocks("python")
    (folder / "verify_dossier.py").write_text(script)
    return folder


def _restamp(folder: Path, key: Path, keyid: str) -> None:
    """The statement's threshold edited and signed again with ``key`` under ``keyid``."""
    path = folder / "convnet-1.dossier.sig.json"
    wire = json.loads(path.read_text())
    body = json.loads(base64.b64decode(wire["payload"]))
    body["predicate"]["buildDefinition"]["externalParameters"]["threshold"] = 1.0
    payload = canonical_json(body)
    wire["payload"] = base64.b64encode(payload).decode()
    wire["signatures"] = [{"keyid": keyid, "sig": base64.b64encode(
        load_private_key(key).sign(pae(PAYLOAD_TYPE, payload))).decode()}]
    path.write_text(json.dumps(wire))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _link(bundle: Path) -> None:
    target = bundle / "fingerprint.json"
    copy = bundle.parent / "fingerprint-copy.json"
    shutil.copy(target, copy)
    target.unlink()
    target.symlink_to(copy)


TAMPERED: dict[str, Callable[[Path, dict[str, KeyPair]], None]] = {
    "an engine byte": lambda f, k: _flip(f / "convnet-1.dossier" / "engine" / "convnet.ort", 99),
    "manifest.json's last byte": lambda f, k: _flip(f / "convnet-1.dossier" / "manifest.json",
                                                    -1),
    "a file added": lambda f, k: (f / "convnet-1.dossier" / "notes.txt").write_text("hi"),
    "a file removed": lambda f, k: (f / "convnet-1.dossier" / "routes.parquet").unlink(),
    "a link to an identical copy": lambda f, k: _link(f / "convnet-1.dossier"),
    "a stranger's public key": lambda f, k: shutil.copy(k["stranger"].public,
                                                        f / "dossier.pub"),
    "the statement re-signed by a stranger": lambda f, k: _restamp(
        f, k["stranger"].private, k["release"].keyid),
}


def test_the_pages_script_verifies_a_signature_without_dossier(
        signed: Path, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    folder = _lay_out(signed, keys["release"].public, tmp_path / "good")
    res = _page_run(folder)
    assert res.returncode == 0, res.stderr
    sums = (folder / "SHA256SUMS").read_text().splitlines()
    assert sums == [f"{hashlib.sha256(data).hexdigest()}  {rel}"
                    for rel, data in sorted(_files(signed).items())]
    # the shadow package works: a script that imports dossier fails there
    broken = _lay_out(signed, keys["release"].public, tmp_path / "shadowed")
    (broken / "verify_dossier.py").write_text("import dossier\n")
    assert _page_run(broken).returncode != 0


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_the_pages_script_refuses_a_tampered_bundle(case: str, signed: Path,
                                                    keys: dict[str, KeyPair],
                                                    tmp_path: Path) -> None:
    folder = _lay_out(signed, keys["release"].public, tmp_path / "bad")
    TAMPERED[case](folder, keys)
    res = _page_run(folder)
    assert res.returncode != 0, (case, res.stdout, res.stderr)


# ----------------------------------------------------------------------------------- formats
def _format_1(tmp_path: Path) -> Path:
    bundle = h.copy_bundle(h.GOLDEN, tmp_path / "old")
    shutil.copy(FORMAT_1 / "convnet-1.dossier.sig.json", signature_path(bundle))
    return bundle


def test_the_format_1_fixture_is_what_dossier_wrote_before_sha256_subjects() -> None:
    wire = json.loads((FORMAT_1 / "convnet-1.dossier.sig.json").read_text())
    body = json.loads(base64.b64decode(wire["payload"]))
    assert {tuple(s["digest"]) for s in body["subject"]} == {("blake3",)}
    assert "statementFormat" not in body["predicate"]["buildDefinition"]["internalParameters"]
    assert len(body["subject"]) == len(_files(h.GOLDEN))


def test_format_1_signatures_still_verify(tmp_path: Path) -> None:
    bundle = _format_1(tmp_path)
    public = FORMAT_1 / "format-1.pub"
    res = h.cli("verify", bundle, "--require-signature", "--trusted-key", public,
                "--integrity-only")
    assert res.exit_code == 0, h.said(res)
    assert "OK: signature" in res.stderr and "17 subjects match" in res.stderr
    with open_bundle(bundle) as b:  # no scan given: the statement's digests, read once
        assert check_signature(b, [public], require=True)
    tar = pack_bundle(bundle, tmp_path / "ship")
    shutil.copy(signature_path(bundle), signature_path(tar))
    res = h.cli("verify", tar, "--require-signature", "--trusted-key", public,
                "--integrity-only")
    assert res.exit_code == 0, h.said(res)
    assert check_signature_at(tar, [public], require=True)
    # and they still refuse what they refused
    _flip(bundle / "engine" / "convnet.ort", 500)
    res = h.cli("verify", bundle, "--require-signature", "--trusted-key", public,
                "--integrity-only")
    assert res.exit_code == ExitCode.SIGNATURE, h.said(res)
    assert "engine/convnet.ort: BLAKE3 differs" in res.stderr


def _resign(bundle: Path, key: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = signature_path(bundle)
    wire = json.loads(path.read_text())
    body = json.loads(base64.b64decode(wire["payload"]))
    edit(body)
    payload = canonical_json(body)
    private = load_private_key(key)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
    wire["payload"] = base64.b64encode(payload).decode()
    wire["signatures"] = [{"keyid": blake3.blake3(raw).hexdigest(),
                           "publicKey": base64.b64encode(raw).decode(),
                           "sig": base64.b64encode(private.sign(pae(PAYLOAD_TYPE,
                                                                    payload))).decode()}]
    path.write_text(json.dumps(wire))


def _set_format(value: object) -> Callable[[dict[str, Any]], None]:
    def edit(body: dict[str, Any]) -> None:
        body["predicate"]["buildDefinition"]["internalParameters"]["statementFormat"] = value
    return edit


def _drop_sha256(body: dict[str, Any]) -> None:
    body["subject"][0]["digest"].pop("sha256")


def _wrong_sha256(body: dict[str, Any]) -> None:
    for s in body["subject"]:
        if s["name"] == "knobs.json":
            s["digest"]["sha256"] = hashlib.sha256(b"other").hexdigest()


FORMAT_REFUSALS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a newer format": (_set_format(3), "the statement is of format 3; this dossier reads "
                                       "formats 1, 2"),
    "a format as text": (_set_format("2"), "statementFormat is malformed"),
    "format 0": (_set_format(0), "statementFormat is malformed"),
    "format 2 without a sha256": (_drop_sha256, "has no sha256 or no blake3 digest"),
    "format 2 with a wrong sha256 (the right blake3)": (_wrong_sha256,
                                                        "knobs.json: SHA-256 differs"),
}


@pytest.mark.parametrize("case", sorted(FORMAT_REFUSALS))
def test_statement_formats_are_checked(case: str, signed: Path, keys: dict[str, KeyPair]
                                       ) -> None:
    edit, said = FORMAT_REFUSALS[case]
    _resign(signed, keys["release"].private, edit)
    with open_bundle(signed) as b, pytest.raises(SignatureError) as caught:
        check_signature(b, [keys["release"].public], require=True)  # every digest compared
    assert said in str(caught.value), (case, str(caught.value))
    if case == "a newer format":
        assert "newer dossier" in (caught.value.hint or "")


# ------------------------------------------------------------ the archive walk of a signature
def _tar_with(signed: Path, tmp_path: Path, extra: Callable[[tarfile.TarFile], None]) -> Path:
    """The signed bundle as an archive, ``extra`` members added, its signature beside it."""
    tar = pack_bundle(signed, tmp_path / "ship")
    crafted = tmp_path / "crafted" / tar.name
    crafted.parent.mkdir()
    with tarfile.open(tar) as src, tarfile.open(crafted, "w", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
        extra(dst)
    shutil.copy(signature_path(signed), signature_path(crafted))
    return crafted


def _add_link(t: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("convnet-1.dossier/notes.txt")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    t.addfile(info)


def _add_outside(t: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("elsewhere/notes.txt")
    t.addfile(info, io.BytesIO(b""))


def _add_twice(t: tarfile.TarFile) -> None:
    data = b"{}"
    info = tarfile.TarInfo("convnet-1.dossier/knobs.json")
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))


UNSAFE: dict[str, tuple[Callable[[tarfile.TarFile], None], str]] = {
    "a symbolic link": (_add_link, "is a symbolic link"),
    "a member outside the bundle folder": (_add_outside, "lies outside the bundle folder"),
    "a member twice (the later would win)": (_add_twice, "appears twice"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_the_signature_check_walks_an_archive_by_the_archive_readers_rules(
        case: str, signed: Path, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    """A signature check reads an archive whose manifest.json does not parse member by member:
    it refuses what opening the archive refuses, with the same words, as a signature failure
    (exit 13: under --require-signature the signature speaks first)."""
    add, said = UNSAFE[case]
    crafted = _tar_with(signed, tmp_path, add)
    with pytest.raises(UnsafeArchiveError, match=said):
        index_archive(crafted)
    with pytest.raises(SignatureError, match=said):
        check_signature_at(crafted, [keys["release"].public], require=True)
    res = h.cli("verify", crafted, "--require-signature", "--trusted-key",
                keys["release"].public)
    assert res.exit_code == ExitCode.SIGNATURE and said in res.stderr, h.said(res)
    assert res.stderr.count("\n") == 1


def test_the_archive_walk_of_a_signature_check_hashes_every_member(
        signed: Path, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    tar = pack_bundle(signed, tmp_path / "ship")
    shutil.copy(signature_path(signed), signature_path(tar))
    assert check_signature_at(tar, [keys["release"].public], require=True)
    _resign(signed, keys["release"].private, _wrong_sha256)  # SHA-256 is compared there too
    shutil.copy(signature_path(signed), signature_path(tar))
    with pytest.raises(SignatureError, match="knobs.json: SHA-256 differs"):
        check_signature_at(tar, [keys["release"].public], require=True)
