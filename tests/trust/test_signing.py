"""Signed provenance: ``dossier keygen``, ``dossier sign`` (in-toto Statement v1 + SLSA provenance
v1 in a DSSE envelope, Ed25519, SHA-256 and BLAKE3 subjects) and ``dossier verify --require-signature
--trusted-key``, which refuses unsigned, wrongly signed and altered bundles (exit 13, one line)
before the integrity check, the environment diff and any engine load."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bundles as h
import pytest
from _figures import figures

from dossier.bundle import check_integrity, open_bundle, pack_bundle
from dossier.bundle.manifest import body_digest
from dossier.errors import ExitCode, SignatureError
from dossier.hashing import canonical_json
from dossier.trust.signing import (
    BUILD_TYPE,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_FORMAT,
    STATEMENT_TYPE,
    KeyPair,
    check_signature,
    generate_key_pair,
    key_id,
    load_private_key,
    load_public_key,
    pae,
    sign_bundle,
    signature_path,
)

blake3 = pytest.importorskip("blake3", reason="signing needs the [sign] extra")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization",
                                    reason="signing needs the [sign] extra")
ec = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ec")
ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    """The release key, a second signer's key and a stranger's key."""
    folder = tmp_path_factory.mktemp("keys")
    return {name: generate_key_pair(folder, name) for name in ("release", "second", "stranger")}


@pytest.fixture
def bundle(rel: dict[str, h.Released], tmp_path: Path) -> Path:
    """A private copy of the convnet bundle, unsigned."""
    return h.copy_bundle(rel["convnet"].bundle, tmp_path / "out")


@pytest.fixture
def signed(bundle: Path, keys: dict[str, KeyPair]) -> Path:
    """A private copy of the convnet bundle, signed with the release key."""
    res = h.cli("sign", bundle, "--key", keys["release"].private)
    assert res.exit_code == 0, h.said(res)
    return bundle


def _envelope(bundle: Path) -> dict[str, Any]:
    return json.loads(signature_path(bundle).read_text())


def _statement(envelope: dict[str, Any]) -> dict[str, Any]:
    return json.loads(base64.b64decode(envelope["payload"]))


def _files(bundle: Path) -> dict[str, bytes]:
    found = {p.relative_to(bundle).as_posix(): p for p in bundle.rglob("*") if p.is_file()}
    return {rel_path: found[rel_path].read_bytes() for rel_path in sorted(found)}


def _verify(bundle: Path, *args: object) -> Any:
    return h.cli("verify", bundle, *args)


# ----------------------------------------------------------------------------------------- keys
def test_keygen_writes_an_ed25519_pem_pair_with_a_private_key_only_its_owner_reads(
        tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask the private key is 0600
    try:
        res = h.cli("keygen", "--out", tmp_path / "k", "--name", "ci")
    finally:
        os.umask(old)
    assert res.exit_code == 0, h.said(res)
    private, public = tmp_path / "k" / "ci.key", tmp_path / "k" / "ci.pub"
    assert res.stdout.strip() == str(public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    key = serialization.load_pem_private_key(private.read_bytes(), None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    assert key_id(load_public_key(public)) == key_id(load_private_key(private).public_key())
    assert key_id(load_public_key(public)) in res.stderr
    before = (private.read_bytes(), public.read_bytes())
    again = h.cli("keygen", "--out", tmp_path / "k", "--name", "ci")
    assert again.exit_code == ExitCode.OUTPUT and "exists already" in h.said(again)
    assert (private.read_bytes(), public.read_bytes()) == before


def test_sign_refuses_keys_that_are_not_ed25519_private_keys(bundle: Path, keys: dict[str, KeyPair],
                                                             tmp_path: Path) -> None:
    ec_key = tmp_path / "ec.key"
    ec_key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    locked = tmp_path / "locked.key"
    locked.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    junk = tmp_path / "junk.key"
    junk.write_bytes(b"not a key")
    cases = {ec_key: "not an Ed25519 private key", locked: "encrypted private key",
             junk: "not a PEM private key", keys["release"].public: "not a PEM private key",
             tmp_path / "missing.key": "cannot read private key"}
    for key, message in cases.items():
        res = h.cli("sign", bundle, "--key", key)
        assert res.exit_code == ExitCode.INPUT and message in h.said(res), (key, h.said(res))
        assert res.stderr.count("\n") == 1
    assert not signature_path(bundle).exists()


# ------------------------------------------------------------------------------------- signing
def test_sign_writes_an_in_toto_statement_in_a_dsse_envelope_beside_the_bundle(
        rel: dict[str, h.Released], bundle: Path, keys: dict[str, KeyPair]) -> None:
    before = h.snapshot(bundle)
    res = h.cli("sign", bundle, "--key", keys["release"].private)
    assert res.exit_code == 0, h.said(res)
    sig = bundle.parent / "convnet-1.dossier.sig.json"
    assert res.stdout.strip() == str(sig) and signature_path(bundle) == sig
    assert h.snapshot(bundle) == before  # signing changes no byte of the bundle

    envelope = json.loads(sig.read_text())
    assert sorted(envelope) == ["payload", "payloadType", "signatures"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    [signature] = envelope["signatures"]
    assert signature["keyid"] == keys["release"].keyid
    payload = base64.b64decode(envelope["payload"])
    # DSSE v1 PAE, spelled out here independently of dossier.trust.signing.pae
    type_ = envelope["payloadType"].encode()
    message = b"DSSEv1 " + str(len(type_)).encode() + b" " + type_ + b" " \
        + str(len(payload)).encode() + b" " + payload
    assert pae(envelope["payloadType"], payload) == message
    public = serialization.load_pem_public_key(keys["release"].public.read_bytes())
    public.verify(base64.b64decode(signature["sig"]), message)  # raises if it does not verify

    statement = json.loads(payload)
    assert payload == canonical_json(statement)
    assert statement["_type"] == STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE == "https://slsa.dev/provenance/v1"
    files = _files(bundle)
    assert "manifest.json" in files and len(files) == 18
    assert statement["subject"] == [{"name": rel_path, "digest": {
        "sha256": hashlib.sha256(data).hexdigest(), "blake3": blake3.blake3(data).hexdigest()}}
        for rel_path, data in files.items()]
    digest = {s["name"]: s["digest"] for s in statement["subject"]}

    with open_bundle(bundle) as b:
        m, s = b.manifest, b.manifest.summary
        cache = b.tuning_cache()
    p = statement["predicate"]
    build = p["buildDefinition"]
    assert build["buildType"] == BUILD_TYPE
    assert build["internalParameters"]["statementFormat"] == STATEMENT_FORMAT == 2
    ext = build["externalParameters"]
    assert (ext["selection"], ext["strategy"], ext["metric"], ext["threshold"]) == (
        s.selection, s.strategy, s.metric, s.threshold)
    assert ext["release"] == {"name": "convnet", "version": 1, "description": m.description}
    assert ext["timing"] == cache.header.timing.model_dump(mode="json")
    assert build["internalParameters"]["tuningHost"] == m.tuning_host
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    assert deps["model.onnx"]["digest"] == digest["model/model.onnx"]
    assert deps["model.onnx"]["annotations"]["xxh3-128"] == m.model.digest
    assert deps["knobs.json"]["digest"] == digest["knobs.json"]
    assert all(deps[f]["digest"] == digest[f] for f in digest if f.startswith("validation/"))
    ort = m.tuning_host["onnxruntime"]
    assert deps["onnxruntime"]["uri"] == f"pkg:pypi/onnxruntime@{ort}"
    run = p["runDetails"]
    assert run["builder"]["id"].startswith("urn:dossier:")
    assert run["builder"]["version"]["dossier"] == m.tool_version
    meta = run["metadata"]
    assert meta["invocationId"] == m.dossier_id
    assert meta["startedOn"].endswith("Z") and meta["finishedOn"].endswith("Z")
    assert meta["startedOn"] <= meta["finishedOn"]
    assert meta["startedOn"][:16] == cache.sessions[0].started_at[:16]
    products = {d["name"]: d for d in run["byproducts"]}
    assert products["tuning-cache.jsonl"]["digest"] == digest["tuning-cache.jsonl"]

    # deterministic: the same key signs the same bundle into the same bytes
    first = sig.read_bytes()
    assert h.cli("sign", bundle, "--key", keys["release"].private).exit_code == 0
    assert sig.read_bytes() == first
    # where the signature lives breaks neither integrity nor the deterministic archive
    res = _verify(bundle, "--integrity-only")
    assert res.exit_code == 0, h.said(res)
    packed = pack_bundle(bundle, bundle.parent / "tar")
    assert packed.read_bytes() == pack_bundle(rel["convnet"].bundle,
                                              bundle.parent / "tar-unsigned").read_bytes()


def test_a_good_signature_lets_verify_proceed(signed: Path, keys: dict[str, KeyPair]) -> None:
    res = _verify(signed, "--require-signature", "--trusted-key", keys["release"].public)
    assert res.exit_code == 0, h.said(res)
    lines = res.stderr.splitlines()
    assert lines[0].startswith("OK: signature ") and "signed by trusted key" in lines[0]
    assert lines[1].startswith("OK: convnet-1")
    assert "verdict: VALID" in res.stdout
    report = json.loads(_verify(signed, "--trusted-key", keys["release"].public,
                                "--json").stdout)
    assert report["signature"].startswith("signed by trusted key")


def test_cosigning_and_several_trusted_keys(signed: Path, keys: dict[str, KeyPair]) -> None:
    res = h.cli("sign", signed, "--key", keys["second"].private, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["signatures"] == 2
    assert {s["keyid"] for s in _envelope(signed)["signatures"]} == {
        keys["release"].keyid, keys["second"].keyid}
    for trusted in (["release"], ["second"], ["stranger", "second"], ["stranger", "release"]):
        args = [a for k in trusted for a in ("--trusted-key", keys[k].public)]
        res = _verify(signed, "--require-signature", *args, "--integrity-only")
        assert res.exit_code == 0, (trusted, h.said(res))


def test_the_archive_and_the_folder_carry_the_same_statement(signed: Path,
                                                             keys: dict[str, KeyPair],
                                                             tmp_path: Path) -> None:
    tar = pack_bundle(signed, tmp_path / "ship")
    res = h.cli("sign", tar, "--key", keys["release"].private)
    assert res.exit_code == 0, h.said(res)
    assert res.stdout.strip() == str(tmp_path / "ship" / "convnet-1.dossier.sig.json")
    assert _envelope(tar) == _envelope(signed)
    res = _verify(tar, "--require-signature", "--trusted-key", keys["release"].public)
    assert res.exit_code == 0, h.said(res)
    shutil.copy(signature_path(signed), tmp_path / "elsewhere.json")  # --signature names it
    signature_path(tar).unlink()
    res = _verify(tar, "--require-signature", "--trusted-key", keys["release"].public,
                  "--signature", tmp_path / "elsewhere.json", "--integrity-only")
    assert res.exit_code == 0, h.said(res)


def test_a_corrupt_bundle_is_never_signed(bundle: Path, keys: dict[str, KeyPair]) -> None:
    (bundle / "knobs.json").write_text("{}")
    res = h.cli("sign", bundle, "--key", keys["release"].private)
    assert res.exit_code == ExitCode.BUNDLE and "knobs.json" in h.said(res)
    assert not signature_path(bundle).exists()


def test_a_signature_of_other_content_is_never_replaced(rel: dict[str, h.Released],
                                                        bundle: Path,
                                                        keys: dict[str, KeyPair],
                                                        tmp_path: Path) -> None:
    other = sign_bundle(rel["tblock"].bundle, keys["release"].private,
                        out=tmp_path / "tblock.sig.json")
    shutil.copy(other.signature, signature_path(bundle))
    before = signature_path(bundle).read_bytes()
    res = h.cli("sign", bundle, "--key", keys["release"].private)
    assert res.exit_code == ExitCode.OUTPUT and "signs other content" in h.said(res)
    assert signature_path(bundle).read_bytes() == before


# ------------------------------------------------------------------------ refusals: exit 13
def _rewrite_manifest(bundle: Path, edit: Callable[[dict], None], recompute_id: bool,
                      compact: bool = False) -> None:
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    if recompute_id:  # xxh3 is public: anyone can make the id match again
        data["dossier_id"] = body_digest(data)
    path.write_text(json.dumps(data) if compact else json.dumps(data, indent=2, sort_keys=True)
                    + "\n")


def _forge_file(bundle: Path, rel_path: str, content: bytes) -> None:
    """Replace a file and update its file-table entry and the id: integrity passes."""
    from dossier.hashing import digest_bytes

    (bundle / rel_path).write_bytes(content)

    def edit(data: dict) -> None:
        for entry in data["files"]:
            if entry["path"] == rel_path:
                entry["size"], entry["digest"] = len(content), digest_bytes(content)

    _rewrite_manifest(bundle, edit, recompute_id=True)


def _edit_envelope(bundle: Path, edit: Callable[[dict], None]) -> None:
    path = signature_path(bundle)
    envelope = json.loads(path.read_text())
    edit(envelope)
    path.write_text(json.dumps(envelope))


def _resign(bundle: Path, key: Path, edit: Callable[[dict], None],
            keyid: str | None = None) -> None:
    """A statement edited and signed again with ``key`` (a trusted one, or an attacker's
    whose signature claims ``keyid``)."""
    private = load_private_key(key)

    def rewrite(envelope: dict) -> None:
        statement = _statement(envelope)
        edit(statement)
        payload = canonical_json(statement)
        envelope["payload"] = base64.b64encode(payload).decode()
        envelope["signatures"] = [{
            "keyid": keyid or key_id(private.public_key()),
            "sig": base64.b64encode(private.sign(pae(PAYLOAD_TYPE, payload))).decode()}]

    _edit_envelope(bundle, rewrite)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _set_winner(data: dict) -> None:
    data["summary"]["shipped_route"] = "-graph_optimization_level=disable_all"
    data["summary"]["result"] = "9.999x [9.000, 11.000] (p=0.001)"


def _link_in_place(bundle: Path, tmp: Path) -> None:
    target = bundle / "fingerprint.json"
    outside = tmp / "outside.json"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    os.symlink(outside, target)


def _tblock_statement(rel: dict[str, h.Released], keys: dict[str, KeyPair], bundle: Path,
                      tmp: Path) -> None:
    other = sign_bundle(rel["tblock"].bundle, keys["release"].private, out=tmp / "t.sig.json")
    shutil.copy(other.signature, signature_path(bundle))


def _subject_outside(statement: dict) -> None:
    statement["subject"].append({"name": "../outside.json",
                                 "digest": {"sha256": "0" * 64, "blake3": "0" * 64}})


REFUSALS: dict[str, tuple[Callable[..., Any], str]] = {
    # setup(bundle, keys, released, tmp) -> None, or the key arguments of verify to use
    # the bundle is not signed, or not by a trusted key
    "unsigned": (lambda b, k, r, t: signature_path(b).unlink(), "is not signed"),
    "signed by another key": (lambda b, k, r, t: ["--trusted-key", k["stranger"].public],
                              "not signed by a trusted key"),
    "named signature missing": (lambda b, k, r, t: ["--trusted-key", k["release"].public,
                                                    "--signature", t / "none.json"],
                                "is not signed"),
    # the bundle changed after signing
    "engine byte changed": (lambda b, k, r, t: _flip(b / "engine" / "convnet.ort", 1000),
                            "engine/convnet.ort: BLAKE3 differs"),
    "winner edited, id recomputed": (lambda b, k, r, t: _rewrite_manifest(b, _set_winner, True),
                                     "manifest.json: BLAKE3 differs"),
    "file, table and id forged": (lambda b, k, r, t: _forge_file(b, "knobs.json", b"{}"),
                                  "knobs.json: BLAKE3 differs"),
    "manifest reformatted (same JSON value)": (
        lambda b, k, r, t: _rewrite_manifest(b, lambda d: None, False, compact=True),
        "manifest.json: BLAKE3 differs"),
    "file missing": (lambda b, k, r, t: (b / "routes.parquet").unlink(),
                     "routes.parquet: missing"),
    "extra file": (lambda b, k, r, t: (b / "notes.txt").write_text("hi"),
                   "notes.txt: not in the signed statement"),
    "extra file in a folder": (
        lambda b, k, r, t: (b / "validation" / "pair-000" / "more.arrow").write_bytes(b"x"),
        "validation/pair-000/more.arrow: not in the signed statement"),
    "link in place of a file": (lambda b, k, r, t: _link_in_place(b, t),
                                "fingerprint.json: not a regular file"),
    # the envelope changed
    "payload edited": (lambda b, k, r, t: _edit_envelope(b, lambda e: e.update(
        payload=base64.b64encode(base64.b64decode(e["payload"]) + b" ").decode())),
        "does not verify"),
    "payload re-digested for a forged file": (
        lambda b, k, r, t: (_forge_file(b, "knobs.json", b"{}"), _edit_envelope(
            b, lambda e: e.update(payload=base64.b64encode(canonical_json({
                **_statement(e), "subject": [
                    s if s["name"] != "knobs.json" else {"name": "knobs.json", "digest": {
                        "blake3": blake3.blake3(b"{}").hexdigest()}}
                    for s in _statement(e)["subject"]]})).decode()))),
        "does not verify"),
    "signature bytes flipped": (lambda b, k, r, t: _edit_envelope(b, lambda e: e["signatures"][0]
                                .update(sig=base64.b64encode(bytes(
                                    x ^ 1 for x in base64.b64decode(
                                        e["signatures"][0]["sig"]))).decode())),
                                "does not verify"),
    "signature not base64": (lambda b, k, r, t: _edit_envelope(
        b, lambda e: e["signatures"][0].update(sig="!!not base64!!")), "does not verify"),
    "attacker's signature under the trusted keyid": (
        lambda b, k, r, t: _resign(b, k["stranger"].private, _set_winner_statement,
                                   keyid=k["release"].keyid), "does not verify"),
    "payload type changed": (lambda b, k, r, t: _edit_envelope(
        b, lambda e: e.update(payloadType="application/json")), "payload type"),
    "no signatures": (lambda b, k, r, t: _edit_envelope(b, lambda e: e.update(signatures=[])),
                      "holds no signatures"),
    "envelope not JSON": (lambda b, k, r, t: signature_path(b).write_text("{not json"),
                          "not a DSSE envelope"),
    "envelope a JSON array": (lambda b, k, r, t: signature_path(b).write_text("[]"),
                              "not a DSSE envelope"),
    "envelope empty": (lambda b, k, r, t: signature_path(b).write_bytes(b""),
                       "not a DSSE envelope"),
    "envelope huge": (lambda b, k, r, t: signature_path(b).write_bytes(b" " * (17 << 20)),
                      "larger than 16 MiB"),
    # a trusted key signed something else
    "another bundle's statement": (lambda b, k, r, t: _tblock_statement(r, k, b, t),
                                   "does not match its signed statement"),
    "statement of another predicate type": (
        lambda b, k, r, t: _resign(b, k["release"].private, lambda s: s.update(
            predicateType="https://slsa.dev/provenance/v0.2")), "predicate type"),
    "statement of another type": (
        lambda b, k, r, t: _resign(b, k["release"].private, lambda s: s.update(
            _type="https://in-toto.io/Statement/v0.1")), "not an in-toto Statement v1"),
    "statement without manifest.json": (
        lambda b, k, r, t: _resign(b, k["release"].private, lambda s: s.update(subject=[
            x for x in s["subject"] if x["name"] != "manifest.json"])),
        "does not cover manifest.json"),
    "subject leading outside the bundle": (
        lambda b, k, r, t: _resign(b, k["release"].private, _subject_outside),
        "../outside.json: missing"),
    "subject twice": (lambda b, k, r, t: _resign(b, k["release"].private, lambda s: s.update(
        subject=[*s["subject"], s["subject"][0]])), "appears twice"),
    # a manifest.json that no longer parses: what the signature says comes first
    "manifest.json not JSON": (lambda b, k, r, t: (b / "manifest.json").write_text("{not json"),
                               "manifest.json: BLAKE3 differs"),
    "manifest.json truncated": (lambda b, k, r, t: (b / "manifest.json").write_bytes(
        (b / "manifest.json").read_bytes()[:100]), "manifest.json: BLAKE3 differs"),
}


def _set_winner_statement(statement: dict) -> None:
    statement["predicate"]["buildDefinition"]["externalParameters"]["threshold"] = 1.0


@pytest.fixture
def no_later_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if verify goes past the signature: integrity, the environment diff, or an
    engine loaded (every engine load runs in a child process started by run_child)."""
    import dossier.bundle
    import dossier.executors.local
    import dossier.jobs.child
    import dossier.verify.pipeline

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("verify went on after a bad signature")

    monkeypatch.setattr(dossier.bundle, "check_integrity", boom)
    monkeypatch.setattr(dossier.verify.pipeline, "verify_bundle", boom)
    monkeypatch.setattr(dossier.verify.pipeline, "collect", boom)
    monkeypatch.setattr(dossier.jobs.child, "run_child", boom)  # verify --recheck's, imported late
    monkeypatch.setattr(dossier.executors.local, "run_child", boom)  # a search's trials


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_verify_refuses_before_anything_else(case: str, signed: Path, rel: dict[str, h.Released],
                                             keys: dict[str, KeyPair], tmp_path: Path,
                                             no_later_step: None) -> None:
    setup, message = REFUSALS[case]
    extra = setup(signed, keys, rel, tmp_path)
    args = extra if isinstance(extra, list) else ["--trusted-key", keys["release"].public]
    res = _verify(signed, "--require-signature", *args, "--recheck", "--rebench")
    assert res.exit_code == ExitCode.SIGNATURE, (case, res.stderr)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("FAIL: "), res.stderr
    assert message in res.stderr, (case, res.stderr)
    assert res.stdout == ""


def test_integrity_alone_cannot_see_a_consistent_forgery(signed: Path) -> None:
    """Why the signature exists: edit the winner and recompute the xxh3 id, and the integrity
    check passes. (Only the signature refuses it: see 'winner edited, id recomputed'.)"""
    _rewrite_manifest(signed, _set_winner, recompute_id=True)
    _forge_file(signed, "knobs.json", b"{}")
    with open_bundle(signed) as b:
        assert check_integrity(b)
        assert b.manifest.summary.shipped_route == "-graph_optimization_level=disable_all"
    assert _verify(signed, "--integrity-only").exit_code == ExitCode.SIGNATURE


# ----------------------------------------------------------------- without --require-signature
def test_without_require_signature(bundle: Path, keys: dict[str, KeyPair]) -> None:
    res = _verify(bundle)  # unsigned, nothing asked: as before
    assert res.exit_code == 0 and "OK: signature" not in res.stderr
    assert h.cli("sign", bundle, "--key", keys["release"].private).exit_code == 0
    res = _verify(bundle, "--integrity-only")  # signed, no key: checked and reported
    assert res.exit_code == 0 and "signer NOT checked" in res.stderr.splitlines()[0]
    res = _verify(bundle, "--trusted-key", keys["release"].public, "--integrity-only")
    assert res.exit_code == 0 and "signed by trusted key" in res.stderr
    res = _verify(bundle, "--trusted-key", keys["stranger"].public, "--integrity-only")
    assert res.exit_code == ExitCode.SIGNATURE  # a signature present but not trusted fails
    (bundle / "notes.txt").write_text("x")
    res = _verify(bundle, "--integrity-only")  # a bad one still fails, key or not
    assert res.exit_code == ExitCode.SIGNATURE and "notes.txt" in res.stderr


def test_usage_errors(signed: Path, tmp_path: Path) -> None:
    res = _verify(signed, "--require-signature")
    assert res.exit_code == 2 and "--trusted-key" in res.stderr
    (tmp_path / "junk.pub").write_text("junk")
    res = _verify(signed, "--trusted-key", tmp_path / "junk.pub")
    assert res.exit_code == ExitCode.INPUT and "not a PEM public key" in h.said(res)


def test_library_verify_checks_the_signature_first(signed: Path,
                                                   keys: dict[str, KeyPair]) -> None:
    from dossier.verify import verify_bundle

    with open_bundle(signed) as b:
        report = verify_bundle(b, trusted_keys=[keys["release"].public], require_signature=True)
        assert report.signature and report.signature.startswith("signed by trusted key")
        with pytest.raises(SignatureError, match="not signed by a trusted key"):
            verify_bundle(b, trusted_keys=[keys["stranger"].public], require_signature=True)
        with pytest.raises(SignatureError, match="no trusted key"):
            check_signature(b, [], require=True)


# ------------------------------------------------------------------------------ byte changes
def _signature_catches(bundle: Path, keys: list[Path], rel_path: str, offset: int) -> bool:
    path = bundle / rel_path
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    try:
        from dossier.bundle import read_bundle

        try:
            b = read_bundle(bundle)
        except Exception:  # noqa: BLE001 - a manifest that no longer parses: the reader refuses
            return rel_path == "manifest.json"
        try:
            check_signature(b, keys, require=True)
        except SignatureError as exc:
            return f"{rel_path}: BLAKE3 differs" in str(exc)
        return False
    finally:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(byte)


def _byte_changes(signed: Path, keys: dict[str, KeyPair], plan: list[tuple[str, int]]) -> None:
    trusted = [keys["release"].public]
    missed = [(f, o) for f, o in plan if not _signature_catches(signed, trusted, f, o)]
    assert not missed, missed[:10]
    with open_bundle(signed) as b:
        assert check_signature(b, trusted, require=True)  # all undone: good again
    figures("single-bit changes caught by the signature", changes=len(plan),
            files=len({f for f, _ in plan}))


def test_single_bit_changes_anywhere_are_caught_by_the_signature(
        signed: Path, keys: dict[str, KeyPair]) -> None:
    sizes = {k: len(v) for k, v in _files(signed).items()}
    rng = random.Random(13)
    plan = [(f, rng.randrange(n)) for f, n in sizes.items() for _ in range(8)]
    _byte_changes(signed, keys, plan)


@pytest.mark.slow
def test_every_byte_of_the_manifest_and_many_more_are_caught_by_the_signature(
        signed: Path, keys: dict[str, KeyPair]) -> None:
    """Including the manifest changes the dossier id cannot see (a float's last digit)."""
    sizes = {k: len(v) for k, v in _files(signed).items()}
    plan = [("manifest.json", o) for o in range(sizes["manifest.json"])]
    plan += [(f, o) for f, n in sizes.items() if f != "manifest.json" for o in range(0, n, 97)]
    _byte_changes(signed, keys, plan)


# ------------------------------------------------- a signature that does not verify, no key
def _flip_sig(e: dict) -> None:
    raw = bytearray(base64.b64decode(e["signatures"][0]["sig"]))
    raw[10] ^= 0x01
    e["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()


def _other_public(keys: dict[str, KeyPair], keyid_too: bool) -> Callable[[dict], None]:
    def edit(e: dict) -> None:
        raw = load_public_key(keys["stranger"].public).public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        e["signatures"][0]["publicKey"] = base64.b64encode(raw).decode()
        if keyid_too:
            e["signatures"][0]["keyid"] = keys["stranger"].keyid
    return edit


NO_KEY_REFUSALS: dict[str, tuple[Callable[[dict[str, KeyPair]], Callable[[dict], None]], str]] = {
    "signature bytes flipped": (lambda k: _flip_sig, "does not verify"),
    "payload edited": (lambda k: lambda e: e.update(payload=base64.b64encode(
        base64.b64decode(e["payload"]) + b" ").decode()), "does not verify"),
    "public key swapped (key id kept)": (lambda k: _other_public(k, False),
                                         "its key id is not its public key's"),
    "public key and key id swapped": (lambda k: _other_public(k, True), "does not verify"),
    "public key not 32 bytes": (lambda k: lambda e: e["signatures"][0].update(publicKey="AAAA"),
                                "does not verify"),
    "no public key (nothing can check it)": (
        lambda k: lambda e: e["signatures"][0].pop("publicKey"), "no signature can be checked"),
}


@pytest.mark.parametrize("case", sorted(NO_KEY_REFUSALS))
def test_a_signature_that_does_not_verify_fails_without_a_trusted_key(
        case: str, signed: Path, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    """No --trusted-key, no --require-signature: a signature beside the bundle is still checked
    cryptographically (against the public key it carries), and one that does not verify is
    exit 13, never "OK ... signer NOT checked". The same for the archive."""
    make, message = NO_KEY_REFUSALS[case]
    _edit_envelope(signed, make(keys))
    tar = pack_bundle(signed, tmp_path / "ship")
    shutil.copy(signature_path(signed), signature_path(tar))
    for target in (signed, tar):
        res = _verify(target, "--integrity-only")
        assert res.exit_code == ExitCode.SIGNATURE, (case, res.stderr)
        assert res.stderr.count("\n") == 1 and message in res.stderr, (case, res.stderr)
        assert "OK: signature" not in res.stderr


def test_a_corrupt_manifest_in_a_signed_archive_is_a_signature_failure(
        signed: Path, keys: dict[str, KeyPair], tmp_path: Path) -> None:
    """Under --require-signature, an archive whose manifest.json no longer parses is reported
    by the signature (exit 13), from the archive's members, without extracting it."""
    import tarfile

    tar = pack_bundle(signed, tmp_path / "ship")
    shutil.copy(signature_path(signed), signature_path(tar))
    with tarfile.open(tar) as t:
        offset = t.getmember("convnet-1.dossier/manifest.json").offset_data
    data = bytearray(tar.read_bytes())
    data[offset] = ord("[")  # '{' -> '[': not a manifest any more
    tar.write_bytes(bytes(data))
    res = _verify(tar, "--require-signature", "--trusted-key", keys["release"].public)
    assert res.exit_code == ExitCode.SIGNATURE, res.stderr
    assert "manifest.json: BLAKE3 differs" in res.stderr and res.stderr.count("\n") == 1
    res = _verify(tar, "--integrity-only")  # not required: the format error, as before
    assert res.exit_code == ExitCode.BUNDLE


def test_envelope_model_keeps_what_it_does_not_know() -> None:
    """The DSSE model reads the URL-safe alphabet and fields it does not know and writes them
    back unchanged; a bad field is refused with its one-line reason."""
    from dossier.trust.dsse import EnvelopeProblem, parse_envelope, parse_statement

    sig = base64.urlsafe_b64encode(b"\xfb" * 64).decode()
    raw = {"payloadType": PAYLOAD_TYPE, "payload": base64.urlsafe_b64encode(b"\xff{}").decode(),
           "signatures": [{"keyid": "k", "sig": sig, "comment": "kept"}], "extra": [1, None]}
    env = parse_envelope(json.dumps(raw).encode())
    assert env.body == b"\xff{}" and env.signatures[0].sig_bytes == b"\xfb" * 64
    assert json.loads(env.to_bytes()) == raw
    for edit, said in ((dict(payload="***"), "the payload is not base64"),
                       (dict(signatures=[{"keyid": "k", "sig": "AAAA"}]),
                        "signature 1 (key k) does not verify"),
                       (dict(signatures=["x"]), "signature 1 is not an object"),
                       (dict(signatures=[{"sig": sig, "publicKey": "AAAA"}]),
                        "its public key is not 32 bytes of base64")):
        with pytest.raises(EnvelopeProblem, match=re.escape(said)):
            parse_envelope(json.dumps({**raw, **edit}).encode())
    body = {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE,
            "subject": [{"name": "manifest.json", "digest": {"sha256": "00"}}]}
    with pytest.raises(EnvelopeProblem, match="'manifest.json' has no blake3 digest"):
        parse_statement(json.dumps(body).encode(), must_cover="manifest.json")
