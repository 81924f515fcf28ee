"""Signed provenance: an in-toto Statement v1 over every file of a bundle, with a SLSA
provenance v1 predicate, in a DSSE envelope signed with Ed25519.

xxh3-128 (the manifest's file table, the dossier id) detects corruption, not forgery: anyone can
edit a file, recompute its xxh3 and the id, and the bundle passes its integrity check. A
signature closes that gap. ``dossier sign`` hashes every file of the bundle *and manifest.json*
with SHA-256 and BLAKE3 (cryptographic hashes; one read of each file feeds both), names them as
the statement's subjects, describes how the
bundle was made (selection, strategy, metric, threshold, tuning host, model, validation set,
backend stack, the tuning sessions) as SLSA provenance, and signs the statement::

    from dossier.bundle import open_bundle
    from dossier.trust.signing import check_signature, generate_key_pair, sign_bundle

    keys = generate_key_pair(Path("keys"))                    # keys/dossier.key (0600), .pub
    signed = sign_bundle(Path("out/convnet-1.dossier"), keys.private)
    with open_bundle(Path("out/convnet-1.dossier")) as b:     # on the fleet host
        check = check_signature(b, [keys.public], require=True)   # SignatureError if not good
        print(check)                # "signed by 3f1c... (19 subjects match)"

**Where the signature lives: beside the bundle**, as ``NAME-VERSION.dossier.sig.json`` (the
same name for the folder ``NAME-VERSION.dossier`` and the archive ``NAME-VERSION.dossier.tar``:
the statement names the bundle's files, which are the same in both forms). Not inside, because:

- the bundle stays exactly what was verified and packed: signing changes no byte of it, so its
  dossier id, its integrity check (which refuses any file not in the file table) and its
  deterministic ``.dossier.tar`` are the same signed or not, and the archive extractor keeps
  its strict allow-list (a ``signatures/`` exception would be one more path an attacker can
  write through);
- a signature cannot cover itself; beside the bundle nothing needs excluding from the digests;
- more signers can co-sign later (one envelope, several signatures over the same statement)
  without rewriting the bundle. Signing is deterministic (Ed25519 signatures are, and the
  statement holds no signing time), so signing twice writes the same bytes.

The cost is one more file to ship; ``dossier verify --signature FILE`` names it when it is not
beside the bundle.

Formats (all JSON; the payload is canonical JSON: sorted keys, no whitespace, UTF-8):

- envelope (DSSE v1): ``{"payloadType": "application/vnd.in-toto+json", "payload": base64,
  "signatures": [{"keyid": KEYID, "sig": base64}]}``; the signature is Ed25519 over
  ``PAE(payloadType, payload)`` = ``"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``
  (https://github.com/secure-systems-lab/dsse/blob/master/protocol.md);
- ``publicKey`` (beside ``keyid`` and ``sig``; DSSE readers ignore fields they do not know):
  base64 of the signer's raw 32-byte Ed25519 public key, so every signature is checked
  cryptographically even when no trusted key is given (then *who* signed is not checked);
- ``keyid``: lowercase hex BLAKE3 of the raw 32-byte Ed25519 public key (a hint: every trusted
  key is tried against every signature);
- subjects: ``{"name": "<bundle path>", "digest": {"sha256": "<64 lowercase hex>", "blake3":
  "<64 lowercase hex>"}}`` for every file of the bundle and ``manifest.json``. ``sha256`` is
  in-toto's predefined DigestSet name, so standard verifiers (securesystemslib, in-toto's
  attestation model, ``sha256sum``; docs/signing.md) match subjects to files without dossier;
  ``blake3`` (the default 256-bit output) is what statements of format 1 carried alone;
- the statement's format: ``predicate.buildDefinition.internalParameters.statementFormat``
  (2; absent in format 1, whose subjects carry ``blake3`` only). Both formats are verified
  (see :mod:`dossier.trust.dsse`).

Every signature of the envelope must verify, trusted key or not: one that does not (a flipped
byte, an edited payload, a ``keyid`` that is not its ``publicKey``'s) fails, and so does an
envelope none of whose signatures can be checked at all (no ``publicKey``, no trusted key).

Verification (:func:`check_signature`) runs before the integrity check, before any engine is
loaded and before the environment diff: the envelope's signature is checked against the trusted
keys *before* its payload is parsed (DSSE's rule), then every file actually in the bundle folder
is hashed (nothing named by the statement is ever opened) and the two sets must be equal, digest
for digest: an altered file, a file missing and a file the statement does not name each fail.
Each digest the statement's format requires is compared where the caller's scan computed it
(a scan made with BLAKE3 only compares BLAKE3, which every format carries: both digests are
signed, either binds the file); with no scan, the files are read once for all of them.

Sigstore's keyless signing (an OIDC identity, a Fulcio certificate, a Rekor transparency-log
entry) needs those services on the network; these machines have none, so signing here is with
keys you hold. The envelope is the same DSSE + in-toto format Sigstore bundles carry.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dossier.bundle.archive import scan_members
from dossier.bundle.integrity import (
    BundleScan,
    require_intact,
    scan_bundle,
    scan_folder,
)
from dossier.bundle.manifest import MANIFEST_NAME
from dossier.bundle.reader import Bundle, open_bundle
from dossier.diskfull import output_error
from dossier.errors import (
    BundleFormatError,
    DossierError,
    IntegrityError,
    OutputError,
    SignatureError,
    UnsafeArchiveError,
)
from dossier.files import (
    new_staging,
    remove_stale_staging,
    rename_noreplace,
    write_durable,
)
from dossier.hashing import BLAKE3, SHA256, canonical_json, feed, new_hasher
from dossier.run_folder import CACHE_NAME, FINGERPRINT_NAME, KNOBS_NAME
from dossier.trust.dsse import (
    DIGEST,
    FORMAT_DIGESTS,
    FORMAT_FIELD,
    MAX_SIGNATURES,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_FORMAT,
    STATEMENT_TYPE,
    Envelope,
    EnvelopeProblem,
    Signature,
    b64encode,
    parse_envelope,
    parse_statement,
)
from dossier.trust.keys import (
    KeyPair,
    blake3_bytes,
    crypto,
    generate_key_pair,
    key_id,
    load_private_key,
    load_public_key,
)
from dossier.trust.sigfile import SIGNATURE_SUFFIX, signature_path

BUILD_TYPE = "urn:dossier:build-type:tune-and-bundle:v1"
"""Our SLSA buildType: a search by ``dossier tune`` (externalParameters: release, backend,
selection, strategy, metric, threshold, tolerances, timing, shapes, builder options, parent;
internalParameters: the tuning host summary and tool versions), then ``dossier bundle``."""
BUILDER_ID = "urn:dossier:builder:dossier-cli"
"""SLSA builder.id: the dossier command line run by whoever holds the signing key."""
SUBJECT_DIGESTS: tuple[str, ...] = FORMAT_DIGESTS[STATEMENT_FORMAT]
"""The digests of every subject ``dossier sign`` writes (SHA-256 and BLAKE3): what a scan of
the bundle computes, in its one read, for a signature to be made or checked in full."""
ENVELOPE_MAX_BYTES = 16 << 20
"""A signature file larger than this is refused before it is parsed."""

_HINT_ALTERED = "the bundle or its signature was altered after signing; do not use it"
_HINT_NEWER = "a newer dossier signed it: check it with that version"
_LABELS = {BLAKE3: "BLAKE3", SHA256: "SHA-256"}
"""How a digest is named in a message, in the order they are compared."""


# ------------------------------------------------------------------------------ dependencies
def blake3_file(path: Path) -> str:
    """BLAKE3 (256-bit, lowercase hex) of the file at ``path``, streamed in fixed chunks."""
    h = new_hasher(BLAKE3)
    with open(path, "rb", buffering=0) as f:
        feed(f, [h])
    return h.hexdigest()



# -------------------------------------------------------------------------------------- DSSE
def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload``: what is actually signed."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


# ------------------------------------------------------------------------------- the statement
def bundle_digests(bundle: Bundle, scan: BundleScan | None = None) -> tuple[dict[str, str],
                                                                          list[str]]:
    """BLAKE3 of every regular file actually in the bundle folder (links are never followed),
    and the paths of entries that are not regular files (or cannot be read). An archive opened
    lazily is hashed member by member in place (its members were checked to be regular files
    when opened). ``scan``: a :func:`~dossier.bundle.integrity.scan_bundle` with BLAKE3 made
    already (nothing is read again)."""
    if scan is None or not scan.has(BLAKE3):
        scan = scan_bundle(bundle, [BLAKE3])
    return scan.digests(BLAKE3), _odd(scan)


def _odd(scan: BundleScan) -> list[str]:
    return sorted([*scan.odd, *scan.unreadable])


def _digest_sets(scan: BundleScan, algorithms: Sequence[str]) -> dict[str, dict[str, str]]:
    """Bundle path -> ``algorithms``' digests (each computed by ``scan``), sorted by path."""
    return {rel: {a: f.digests[a] for a in algorithms} for rel, f in sorted(scan.files.items())}


def statement(bundle: Bundle, digests: dict[str, dict[str, str]] | None = None, *,
              scan: BundleScan | None = None) -> dict[str, Any]:
    """The in-toto statement of ``bundle`` (format :data:`~dossier.trust.dsse.STATEMENT_FORMAT`):
    every file (and manifest.json) as a subject with its SHA-256 and BLAKE3, and SLSA
    provenance v1 of how the bundle was made. ``digests``: bundle path -> those digests;
    without it they come from ``scan`` (a scan made with :data:`SUBJECT_DIGESTS`) or from one
    made now."""
    if digests is None:
        if scan is None or not all(scan.has(a) for a in SUBJECT_DIGESTS):
            scan = scan_bundle(bundle, SUBJECT_DIGESTS)
        odd = _odd(scan)
        if odd:
            raise IntegrityError(f"{bundle.source}: {odd[0]} is not a regular file; not signed")
        digests = _digest_sets(scan, SUBJECT_DIGESTS)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": rel, "digest": dict(d)} for rel, d in sorted(digests.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": provenance(bundle, digests),
    }


def provenance(bundle: Bundle, digests: dict[str, dict[str, str]]) -> dict[str, Any]:
    """SLSA provenance v1 predicate of ``bundle`` (``digests``: SHA-256 and BLAKE3 by bundle
    path); ``internalParameters.statementFormat`` names the statement's format."""
    from dossier.bundle.tables import ROUTES, SHAPES, TIMINGS

    m, s = bundle.manifest, bundle.manifest.summary
    cache = bundle.tuning_cache()
    h = cache.header

    def file(rel: str, media: str | None = None, **notes: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"name": rel, "digest": dict(digests[rel])}
        if media:
            out["mediaType"] = media
        if notes:
            out["annotations"] = {k.replace("_", "-"): v for k, v in notes.items()}
        return out

    model_dep: dict[str, Any] = {"name": m.model.file_name,
                                 "annotations": {"xxh3-128": m.model.digest, "size": m.model.size,
                                                 "included": m.model_included}}
    if Path(h.model.path).is_absolute():
        model_dep["uri"] = Path(h.model.path).as_uri()
    main_model = f"model/{m.model.file_name}"
    if main_model in digests:  # a cryptographic digest only where the bundle holds the file
        model_dep["digest"] = dict(digests[main_model])
    deps: list[dict[str, Any]] = [model_dep]
    deps += [file(p, external_data_of=m.model.file_name) for p in sorted(digests)
             if p.startswith("model/") and p != main_model]
    deps += [file(p, role="validation set", set_xxh3_128=h.validation_digest)
             for p in sorted(digests) if p.startswith("validation/") or p == "validation.json"]
    deps.append(file(KNOBS_NAME, "application/json", role="knob database",
                     xxh3_128=m.knob_db_digest))
    stack = {k: v for k, v in m.tuning_host.items() if k not in ("hostname", "machine", "python")}
    deps += [{"name": pkg, "uri": f"pkg:pypi/{pkg}@{version}",
              "annotations": {"role": "backend stack"}} for pkg, version in sorted(stack.items())]
    if "python" in m.tuning_host:
        deps.append({"name": "python", "uri": f"pkg:generic/python@{m.tuning_host['python']}",
                     "annotations": {"role": "backend stack"}})
    started = cache.sessions[0].started_at if cache.sessions else h.created_at
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "release": {"name": m.release, "version": m.release_version,
                            "description": m.description},
                "backend": m.backend,
                "selection": s.selection,
                "strategy": s.strategy,
                "metric": s.metric,
                "threshold": s.threshold,
                "atol": s.atol,
                "rtol": s.rtol,
                "timing": h.timing.model_dump(mode="json"),
                "shapes": [e.model_dump(mode="json") for e in h.shapes],
                "builder": h.builder,
                "parent": m.parent,
            },
            "internalParameters": {
                FORMAT_FIELD: STATEMENT_FORMAT,
                "tuningHost": dict(m.tuning_host),
                "toolVersion": m.tool_version,
                "tunerVersion": m.tuner_version,
                "decisionRule": s.decision_rule,
            },
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID,
                        "version": {"dossier": m.tool_version, m.backend: m.tuner_version}},
            "metadata": {"invocationId": m.dossier_id, "startedOn": _rfc3339(started),
                         "finishedOn": _rfc3339(m.created_at)},
            "byproducts": [
                file(CACHE_NAME, "application/jsonl", sessions=len(cache.sessions),
                     trials=len(cache.trials)),
                file(ROUTES, "application/vnd.apache.parquet"),
                file(TIMINGS, "application/vnd.apache.parquet"),
                file(SHAPES, "application/vnd.apache.parquet"),
                file(FINGERPRINT_NAME, "application/json", role="tuning host"),
            ],
        },
    }


def _rfc3339(text: str) -> str:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return text
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------- sign
@dataclass(frozen=True)
class SignedBundle:
    """What :func:`sign_bundle` wrote."""

    signature: Path
    """The envelope file."""
    keyid: str
    """The signing key's id."""
    subjects: int
    """Files covered (manifest.json included)."""
    dossier_id: str
    """The bundle's id."""
    signatures: int
    """Signatures the envelope now holds (more than one when co-signed)."""


def sign_bundle(path: Path, key: Path, *, out: Path | None = None) -> SignedBundle:
    """Sign the bundle folder or archive at ``path`` with the Ed25519 private key file ``key``.

    The bundle must pass its integrity check first (IntegrityError otherwise: a corrupt bundle
    is never signed). The envelope goes to ``out`` (default :func:`signature_path`). An envelope
    already there over the same statement gets this signature added (co-signing); one over
    another statement is never replaced (OutputError).
    """
    private = load_private_key(key)
    keyid = key_id(private.public_key())
    path = Path(path)
    with open_bundle(path, lazy=True) as bundle:  # an archive: its members read in place
        # one read of every file for all its digests: xxh3-128 (integrity), SHA-256, BLAKE3
        scan = scan_bundle(bundle, SUBJECT_DIGESTS)
        require_intact(bundle, "not signed", scan)
        body = statement(bundle, scan=scan)
        dossier_id = bundle.manifest.dossier_id
    payload = canonical_json(body)
    target = Path(out) if out is not None else signature_path(path)
    signatures = [Signature(keyid=keyid, sig=b64encode(private.sign(pae(PAYLOAD_TYPE, payload))),
                            public_key=_raw_public_b64(private.public_key()))]
    if os.path.lexists(target):
        existing = _read_envelope(target, OutputError)
        if existing.body != payload:
            raise OutputError(f"{target} exists and signs other content",
                              hint="remove it, or write the signature elsewhere with --out")
        kept = [s for s in existing.signatures if s.keyid != keyid]
        signatures = sorted([*kept, *signatures], key=lambda s: s.keyid)
    envelope = Envelope(payload_type=PAYLOAD_TYPE, payload=b64encode(payload),
                        signatures=signatures)
    data = envelope.to_bytes()
    write_envelope(target, data, replace=os.path.lexists(target))
    return SignedBundle(target, keyid, len(body["subject"]), dossier_id, len(signatures))


def cosigned(envelopes: Sequence[Path]) -> bytes:
    """One envelope holding every signature of ``envelopes`` (which must all sign the same
    payload: ValueError otherwise), one per key id, sorted by key id: how co-signatures found
    as separate files (registry referrers) are kept as one file, as ``dossier sign`` keeps
    them. SignatureError for a file that is not an envelope."""
    read = [_read_envelope(Path(e), SignatureError) for e in envelopes]
    if not read or any(e.body != read[0].body for e in read):
        raise ValueError("co-signed envelopes must sign one payload")
    by_key: dict[str, Signature] = {}
    for e in read:
        for sig in e.signatures:
            by_key.setdefault(sig.keyid, sig)
    if len(by_key) > MAX_SIGNATURES:
        raise SignatureError(f"{len(by_key)} signatures over one statement, more than one "
                             f"envelope holds ({MAX_SIGNATURES})")
    return Envelope(payload_type=PAYLOAD_TYPE, payload=read[0].payload,
                    signatures=sorted(by_key.values(), key=lambda s: s.keyid)).to_bytes()


def write_envelope(target: Path, data: bytes, *, replace: bool) -> None:
    """Write a signature envelope durably (staging file, fsync, rename); OutputError."""
    folder = target.parent
    staging: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(folder)
        staging = new_staging(folder, target.name, directory=False)
        write_durable(staging, data)
        if replace:
            os.replace(staging, target)
        else:
            rename_noreplace(staging, target)
    except BaseException as exc:
        if staging is not None:  # nothing half-written is left, not even on a full disk
            staging.unlink(missing_ok=True)
        if isinstance(exc, FileExistsError):
            raise OutputError(f"{target} appeared while the signature was written") from None
        if isinstance(exc, OSError):
            raise output_error(exc, folder, f"writing {target.name}", f"write {target}") from exc
        raise


# -------------------------------------------------------------------------------------- verify
@dataclass(frozen=True)
class SignatureCheck:
    """The result of :func:`check_signature` for a signed bundle whose files all match."""

    path: Path
    """The envelope file."""
    keyids: list[str]
    """Trusted keys whose signature verified (empty when no key was given)."""
    signer_checked: bool
    """False when no trusted key was given: the files match the statement, but who signed it
    was not checked."""
    subjects: int
    """Files covered (manifest.json included), every one matching."""
    envelope_keyids: list[str] = field(default_factory=list)
    """Key ids the envelope's signatures claim."""

    def __str__(self) -> str:
        if self.signer_checked:
            who = ", ".join(k[:16] for k in self.keyids)
            return f"signed by trusted key {who} ({self.subjects} subjects match)"
        claimed = ", ".join(k[:16] for k in self.envelope_keyids) or "an unnamed key"
        return (f"signed by {claimed} (the signature verifies), signer NOT checked (no "
                f"--trusted-key); {self.subjects} subjects match")


def check_signature(bundle: Bundle, trusted_keys: Sequence[Path] = (), *, require: bool = False,
                    signature: Path | None = None,
                    scan: BundleScan | None = None) -> SignatureCheck | None:
    """Check the signature of an opened bundle; None when it has none and none is required.

    Every signature of the envelope must verify (against its embedded public key, or the
    trusted key it names), checked before the payload is parsed; with ``trusted_keys``, one of
    them must have signed. Then every file in the bundle must be a subject of the statement
    with the same BLAKE3, and every subject a file. Raises SignatureError (exit 13) for: no
    signature when ``require``; no trusted key when ``require``; an envelope that cannot be
    read; a signature that does not verify; no signature that can be checked; no signature by a
    trusted key; a statement of another type; any file altered, missing or not named.
    InputError for an unreadable key file.
    """
    path = Path(signature) if signature is not None else signature_path(bundle.source)
    found = _check_envelope(path, bundle.source, trusted_keys, require=require,
                            named=signature is not None)
    if found is None:
        return None
    verified, claimed, subjects = found
    wanted = _wanted(subjects)
    compared = [a for a in wanted if scan is not None and scan.has(a)]
    if scan is None or not compared:
        scan, compared = scan_bundle(bundle, wanted), list(wanted)
    _compare(bundle.source, subjects, _digest_sets(scan, compared), _odd(scan))
    return SignatureCheck(path, verified, bool(trusted_keys), len(subjects), claimed)


def _wanted(subjects: dict[str, dict[str, str]]) -> tuple[str, ...]:
    """The digests a parsed statement's subjects carry (its format's: the same for all)."""
    return tuple(next(iter(subjects.values())))


def check_signature_at(source: Path, trusted_keys: Sequence[Path] = (), *, require: bool = False,
                       signature: Path | None = None) -> SignatureCheck | None:
    """:func:`check_signature` of the bundle folder or archive at ``source`` without reading its
    manifest: for a bundle whose manifest.json does not even parse, the signature still says
    what happened to it (``manifest.json: BLAKE3 differs``). Nothing is written."""
    source = Path(source)
    path = Path(signature) if signature is not None else signature_path(source)
    found = _check_envelope(path, source, trusted_keys, require=require,
                            named=signature is not None)
    if found is None:
        return None
    verified, claimed, subjects = found
    actual, odd = _raw_digests(source, _wanted(subjects))
    _compare(source, subjects, actual, odd)
    return SignatureCheck(path, verified, bool(trusted_keys), len(subjects), claimed)


def _check_envelope(path: Path, source: Path, trusted_keys: Sequence[Path], *, require: bool,
                    named: bool) -> tuple[list[str], list[str], dict[str, dict[str, str]]] | None:
    """(trusted key ids that signed, key ids claimed, subjects), or None when unsigned and not
    required. Every signature is checked before the payload is parsed."""
    if require and not trusted_keys:
        raise SignatureError("a signature is required but no trusted key was given",
                             hint="pass the signer's public key with --trusted-key")
    keys = [(load_public_key(p), p) for p in trusted_keys]
    if not os.path.lexists(path):
        if require or named:
            raise SignatureError(f"{source} is not signed: there is no {path}",
                                 hint="sign it with dossier sign BUNDLE --key KEY, or name its "
                                 "signature with --signature")
        return None
    envelope = _read_envelope(path, SignatureError)
    payload = envelope.body
    claimed = sorted({s.keyid for s in envelope.signatures if s.keyid})
    signers = _verify_all(path, keys, envelope.signatures, payload)
    ours = {key_id(k) for k, _ in keys}
    verified = sorted(ours & signers)
    if keys and not verified:
        raise SignatureError(f"{path}: not signed by a trusted key (signed by "
                             f"{', '.join(k[:16] for k in claimed) or 'unnamed keys'}; trusted: "
                             f"{', '.join(sorted(k[:16] for k in ours))})",
                             hint="pass the signer's public key with --trusted-key, if you "
                             "trust it")
    if not signers:
        raise SignatureError(f"{path}: no signature can be checked (none carries its public key "
                             "and no --trusted-key was given)",
                             hint="pass the signer's public key with --trusted-key")
    try:
        subjects = parse_statement(payload, must_cover=MANIFEST_NAME).digest_sets()
    except EnvelopeProblem as exc:
        raise SignatureError(f"{path}: {exc}",
                             hint=_HINT_ALTERED if exc.altered else _HINT_NEWER) from None
    return verified, claimed, subjects


def _verify_all(path: Path, keys: list[tuple[Any, Path]], sigs: Sequence[Signature],
                payload: bytes) -> set[str]:
    """The key ids whose signature verifies. SignatureError for any signature that can be
    checked (its own public key, or a trusted key of its key id) and does not verify."""
    from cryptography.exceptions import InvalidSignature

    ed25519 = crypto()
    message = pae(PAYLOAD_TYPE, payload)
    trusted = {key_id(k): k for k, _ in keys}
    signers: set[str] = set()
    for n, s in enumerate(sigs, start=1):
        label = f"signature {n} (key {s.keyid[:16] or 'unnamed'})"
        key = trusted.get(s.keyid)
        raw = s.public_key_bytes
        if raw is not None:
            key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
            if key_id(key) != s.keyid:
                raise SignatureError(f"{path}: {label} does not verify: its key id is not its "
                                     "public key's", hint=_HINT_ALTERED)
        if key is None:
            continue  # neither its own key nor a trusted one: it cannot be checked
        try:
            key.verify(s.sig_bytes, message)
        except InvalidSignature:
            raise SignatureError(f"{path}: {label} does not verify: the statement or the "
                                 "signature was altered", hint=_HINT_ALTERED) from None
        signers.add(s.keyid)
    return signers


def _raw_public_b64(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64encode(raw)


def _compare(source: Path, subjects: dict[str, dict[str, str]],
             actual: dict[str, dict[str, str]], odd: list[str]) -> None:
    """Every file a subject and every subject a file, each digest of ``actual`` equal."""
    problems = []
    for rel in sorted(set(actual) | set(subjects) | set(odd)):
        if rel in odd:
            problems.append(f"{rel}: not a regular file")
        elif rel not in subjects:
            problems.append(f"{rel}: not in the signed statement")
        elif rel not in actual:
            problems.append(f"{rel}: missing")
        else:
            differ = [label for a, label in _LABELS.items()
                      if a in actual[rel] and actual[rel][a] != subjects[rel].get(a)]
            if differ:
                problems.append(f"{rel}: {differ[0]} differs from the signed statement")
    if problems:
        raise SignatureError(f"{source} does not match its signed statement "
                             f"({len(problems)} problem(s)): {'; '.join(problems)}",
                             hint=_HINT_ALTERED)


def _raw_digests(source: Path, algorithms: Sequence[str]) -> tuple[dict[str, dict[str, str]],
                                                                    list[str]]:
    """``algorithms``' digests by bundle path of a folder, or of the members of an archive
    (streamed, nothing written), and the entries that are not regular files. The member
    headers of an archive are checked by the archive reader's rules
    (:func:`~dossier.bundle.archive.scan_members`): one it refuses, or an archive it cannot
    read, does not match its statement (SignatureError, naming why)."""
    if source.is_dir():
        scan = scan_folder(source, algorithms)
        return _digest_sets(scan, algorithms), _odd(scan)
    try:
        return scan_members(source, lambda src: _hash(src, algorithms)), []
    except (UnsafeArchiveError, BundleFormatError) as exc:
        raise SignatureError(f"{exc}; it does not match its signed statement",
                             hint=_HINT_ALTERED) from exc
    except OSError as exc:
        raise SignatureError(f"{source} cannot be read to check its signature ({exc})",
                             hint=_HINT_ALTERED) from exc


def _hash(src: Any, algorithms: Sequence[str]) -> dict[str, str]:
    hashers = [new_hasher(a) for a in algorithms]
    feed(src, hashers)
    return {a: h.hexdigest() for a, h in zip(algorithms, hashers, strict=True)}


def read_envelope_bytes(path: Path, error: type[DossierError] = SignatureError) -> bytes:
    """The bytes of a signature envelope file, refused over ``ENVELOPE_MAX_BYTES``."""
    from dossier.files import read_small

    try:
        return read_small(path, ENVELOPE_MAX_BYTES)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise error(f"{path} is larger than {ENVELOPE_MAX_BYTES >> 20} MiB; not a "
                        "signature") from exc
        raise error(f"cannot read signature {path}: {exc.strerror or exc}") from exc


def _read_envelope(path: Path, error: type[DossierError]) -> Envelope:
    data = read_envelope_bytes(path, error)
    try:
        return parse_envelope(data)
    except EnvelopeProblem as exc:
        if not exc.altered:
            raise error(f"{path} {exc}") from None
        raise error(f"{path}: {exc}", hint=_HINT_ALTERED) from None


__all__ = ["BUILD_TYPE", "BUILDER_ID", "DIGEST", "MAX_SIGNATURES", "PAYLOAD_TYPE",
           "PREDICATE_TYPE", "SIGNATURE_SUFFIX", "STATEMENT_FORMAT", "STATEMENT_TYPE",
           "SUBJECT_DIGESTS", "KeyPair", "SignatureCheck", "SignedBundle",
           "blake3_bytes", "blake3_file", "bundle_digests", "check_signature",
           "check_signature_at",
           "cosigned", "generate_key_pair", "key_id", "load_private_key", "load_public_key", "pae",
           "provenance", "sign_bundle", "signature_path", "statement"]
