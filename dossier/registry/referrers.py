"""Signatures as OCI 1.1 referrers of a bundle's manifest.

A ``dossier sign`` envelope is pushed as its own small artifact: an image manifest with
``artifactType`` :data:`SIGNATURE_TYPE`, the empty config, one layer (the DSSE envelope,
:data:`ENVELOPE_TYPE`) and ``subject`` = the bundle's manifest. The signature does not change the
bundle's artifact or its digest, and more signatures can be added later (co-signing writes a new
envelope, a new referrer).

A registry with the referrers API (distribution spec 1.1) answers the manifest PUT with an
``OCI-Subject`` header and lists referrers at ``/v2/REPO/referrers/DIGEST``. For a registry
without it (the CNCF distribution registry 2.x, among others) the spec's tag schema fallback is
used: an image index under the tag ``sha256-HEX`` (the subject's digest) lists the referrers;
pushing reads it, adds the new descriptor if it is not there yet, and writes it back (a registry
without conditional writes makes two concurrent pushers race; the later index wins).

Finding them again: the referrers API when the registry answers it, the tag otherwise; each
referrer's manifest and envelope are fetched by digest and checked (sha256, size cap, subject,
types) before the envelope is handed to :func:`dossier.trust.signing.check_signature`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dossier.bundle.integrity import BundleScan
from dossier.bundle.reader import Bundle
from dossier.errors import (
    BundleError,
    BundleFormatError,
    DossierError,
    OutputError,
    RegistryError,
    SignatureError,
)
from dossier.hashing import canonical_json
from dossier.registry.client import (
    MANIFEST_MAX_BYTES,
    OCI_INDEX,
    OCI_MANIFEST,
    RegistryClient,
    sha256_bytes,
)
from dossier.registry.reference import DIGEST
from dossier.trust.signing import (
    ENVELOPE_MAX_BYTES,
    SignatureCheck,
    check_signature,
    read_envelope_bytes,
    write_envelope,
)

SIGNATURE_TYPE = "application/vnd.dossier.signature.v1+json"
"""``artifactType`` of a signature referrer."""
ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"
"""Media type of its one layer: the DSSE envelope ``dossier sign`` wrote."""
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
"""The OCI empty config (image-spec 1.1)."""
MAX_REFERRERS = 256
"""At most this many signature referrers are fetched."""


def signature_manifest(envelope: bytes, subject: str, subject_size: int, name: str) -> bytes:
    """The referrer manifest of an envelope, canonical JSON (the same envelope always gives the
    same digest)."""
    return canonical_json({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": SIGNATURE_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": sha256_bytes(EMPTY), "size": len(EMPTY)},
        "layers": [{"mediaType": ENVELOPE_TYPE, "digest": sha256_bytes(envelope),
                    "size": len(envelope), "annotations": {"org.opencontainers.image.title": name}}],
        "subject": {"mediaType": OCI_MANIFEST, "digest": subject, "size": subject_size},
    })


def attach_signature(client: RegistryClient, subject: str, subject_size: int,
                     envelope_path: Path) -> str:
    """Push the envelope at ``envelope_path`` as a referrer of the manifest ``subject``; the
    referrer manifest's digest. Pushing the same envelope again changes nothing."""
    envelope = read_envelope_bytes(Path(envelope_path))
    for data in (EMPTY, envelope):
        digest = sha256_bytes(data)
        if not client.has_blob(digest):
            client.upload_blob(data, digest, len(data))
    body = signature_manifest(envelope, subject, subject_size, Path(envelope_path).name)
    digest, headers = client.put_manifest(sha256_bytes(body), body, OCI_MANIFEST)
    if headers.get("OCI-Subject") != subject:  # no referrers API: the tag schema fallback
        tag = _fallback_tag(subject)
        got = client.get_manifest(tag, (OCI_INDEX,), missing_ok=True)
        index: dict[str, Any] = (_index(got[0], tag) if got else
                                 {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
        if not any(isinstance(d, dict) and d.get("digest") == digest for d in index["manifests"]):
            index["manifests"].append({"mediaType": OCI_MANIFEST, "digest": digest,
                                       "size": len(body), "artifactType": SIGNATURE_TYPE})
            client.put_manifest(tag, canonical_json(index), OCI_INDEX)
    return digest


def _fallback_tag(digest: str) -> str:
    return digest.replace(":", "-")


def _index(body: bytes, where: str) -> dict[str, Any]:
    try:
        index = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BundleFormatError(f"the referrers index {where} is not JSON ({exc})") from exc
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise BundleFormatError(f"the referrers index {where} is not an OCI image index")
    return index


def list_signatures(client: RegistryClient, subject: str,
                    problems: list[str] | None = None) -> list[dict[str, Any]]:
    """Descriptors of the signature referrers of ``subject``: from the referrers API, or from
    the tag schema fallback where the registry has no such API; the first
    :data:`MAX_REFERRERS` of them (``problems`` says when more were listed)."""
    url = f"{client.repo_url}/referrers/{subject}?artifactType={SIGNATURE_TYPE}"
    with client.request("GET", url, headers={"Accept": OCI_INDEX}, stream=True) as r:
        api = r.status_code == 200 and r.headers.get("Content-Type", "").startswith(OCI_INDEX)
        if not api and r.status_code not in (400, 404, 405):
            client.check(r, "the referrers list")
        body = client.read_capped(r, MANIFEST_MAX_BYTES, "the referrers list") if api else None
    if body is None:
        got = client.get_manifest(_fallback_tag(subject), (OCI_INDEX,), missing_ok=True)
        if got is None:
            return []
        body = got[0]
    found = _index(body, f"of {subject}")["manifests"]
    listed = [d for d in found if isinstance(d, dict) and d.get("artifactType") == SIGNATURE_TYPE
              and isinstance(d.get("digest"), str) and DIGEST.match(d["digest"])
              and type(d.get("size")) is int]
    if len(listed) > MAX_REFERRERS and problems is not None:
        problems.append(f"the registry lists {len(listed)} signature referrers of {subject}; "
                        f"only the first {MAX_REFERRERS} were read")
    return listed[:MAX_REFERRERS]


def fetch_signatures(client: RegistryClient, subject: str, folder: Path,
                     malformed: list[str] | None = None) -> list[Path]:
    """Download every signature envelope referring to ``subject`` into ``folder`` (named by
    their sha256); their paths. Each referrer is checked: its manifest's digest, its subject,
    its types, its envelope's digest and size; at most :data:`MAX_REFERRERS` are read. One
    that fails (or a referrers list that cannot be read, or one that lists more) is
    SignatureError, or, with a ``malformed`` list, named there and skipped (see
    :func:`dossier.registry.fetch_bundle` for the policy)."""
    problems: list[str] = [] if malformed is None else malformed
    out: list[Path] = []
    try:
        found = list_signatures(client, subject, problems)
    except _REFERRER_ERRORS as exc:  # a malformed, oversized or unreadable referrers list
        problems.append(f"the referrers of {subject}: {exc.diagnostics()}")
        found = []
    for desc in found:
        try:
            data = _envelope(client, subject, desc)
        except _REFERRER_ERRORS as exc:  # noqa: PERF203 - at most MAX_REFERRERS
            problems.append(exc.diagnostics())
            continue
        out.append(_keep(folder, sha256_bytes(data).split(":")[1] + ".sig.json", data))
    if problems and malformed is None:
        raise SignatureError(problems[0])
    return sorted(out)


def _envelope(client: RegistryClient, subject: str, desc: dict[str, Any]) -> bytes:
    """The envelope of one listed referrer, checked (its manifest and envelope by digest and
    size, its subject and types); SignatureError or a registry or bundle error otherwise."""
    got = client.get_manifest(desc["digest"])
    assert got is not None
    try:
        m = json.loads(got[0])
        layer = m["layers"][0]
        ok = (m.get("artifactType") == SIGNATURE_TYPE and m["subject"]["digest"] == subject
              and layer["mediaType"] == ENVELOPE_TYPE and isinstance(layer["digest"], str)
              and DIGEST.match(layer["digest"])
              and type(layer["size"]) is int and 0 < layer["size"] <= ENVELOPE_MAX_BYTES)
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        ok = False
    if not ok:
        raise SignatureError(f"signature referrer {client.ref.name}@{desc['digest']} is not a "
                             f"dossier signature referrer of {subject}")
    return client.blob_bytes(layer["digest"], layer["size"], "a signature envelope")


_REFERRER_ERRORS = (BundleError, RegistryError, SignatureError)
"""What one referrer (or the list of them) may fail with: named, and skipped unless a
signature is required (a registry that refuses credentials is RegistryAuthError, a
RegistryError too: the artifact itself was read, so this concerns its referrers alone)."""


def _keep(folder: Path, name: str, data: bytes) -> Path:
    write_envelope(folder / name, data, replace=True)
    return folder / name


def keep_beside(client: RegistryClient, subject: str, bundle_path: Path,
                ignored: list[str] | None = None) -> Path | None:
    """Write the signature referrers of ``subject`` that pass against the bundle folder just
    pulled to ``bundle_path`` beside it, where ``verify`` looks for its signature
    (:func:`~dossier.trust.sigfile.signature_path`); that file, or None when the registry holds no
    signature referrer. Each envelope is checked as ``verify REF`` checks one (every signature
    against the public key it carries, the subjects' BLAKE3, which every statement format
    carries, against the files, read once for all);
    those over one statement are kept as one co-signed envelope (the statement most signed,
    when they sign several). A referrer that is malformed, or whose envelope does not pass
    (another bundle's signature, not a DSSE envelope), is named in ``ignored`` and skipped,
    as ``verify REF`` skips it; without an ``ignored`` list, SignatureError (the first
    problem) when none passes. OutputError when another file is in the way."""
    import tempfile

    from dossier.bundle.integrity import scan_bundle
    from dossier.bundle.reader import open_bundle
    from dossier.hashing import BLAKE3
    from dossier.trust.dsse import parse_envelope
    from dossier.trust.sigfile import signature_path
    from dossier.trust.signing import cosigned, read_envelope_bytes

    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dossier-referrers-") as tmp:
        found = fetch_signatures(client, subject, Path(tmp), problems)
        passed: dict[bytes, list[Path]] = {}
        with open_bundle(bundle_path) as bundle:
            scan = scan_bundle(bundle, [BLAKE3]) if found else None
            for envelope in found:
                try:
                    check_signature(bundle, (), signature=envelope, scan=scan)
                    body = parse_envelope(read_envelope_bytes(envelope)).body
                except _REFERRER_ERRORS as exc:  # noqa: PERF203 - a few envelopes at most
                    problems.append(f"signature referrer {envelope.name}: {exc.diagnostics()}")
                    continue
                passed.setdefault(body, []).append(envelope)
        if ignored is not None:
            ignored.extend(problems)
        elif problems and not passed:
            raise SignatureError(problems[0])
        if not passed:
            return None
        data = cosigned(max(passed.values(), key=len))  # the first of the most signed
    target = signature_path(bundle_path)
    if os.path.lexists(target):
        if target.is_file() and not target.is_symlink() and target.read_bytes() == data:
            return target
        raise OutputError(f"{target} exists already", hint="signatures are never overwritten; "
                          "pull into another --out")
    write_envelope(target, data, replace=False)
    return target


def check_referrer_signatures(bundle: Bundle, envelopes: Sequence[Path],
                              trusted_keys: Sequence[Path] = (), *, require: bool = False,
                              source: str = "", scan: BundleScan | None = None,
                              ignored: list[str] | None = None) -> SignatureCheck | None:
    """:func:`~dossier.trust.signing.check_signature` against the envelopes found as referrers: the
    first that passes; None when there are none and none is required. When none passes:
    SignatureError (the first envelope's) when a signature is required (or no ``ignored``
    list is given); otherwise each failure is named in ``ignored`` and None is returned
    (anyone who may push to the repository can add a referrer: one that is not this bundle's
    signature must not stop its verification). ``scan``: the bundle's files read once
    already (:func:`~dossier.bundle.integrity.scan_bundle` with BLAKE3), shared by every
    envelope."""
    if not envelopes:
        if require:
            raise SignatureError(f"{source or bundle.source} is not signed: the registry holds "
                                 "no signature referrer for it",
                                 hint="sign the bundle (dossier sign) and push it again")
        return None
    errors: list[DossierError] = []
    for envelope in envelopes:
        try:
            return check_signature(bundle, trusted_keys, require=require, signature=envelope,
                                   scan=scan)
        except _REFERRER_ERRORS as exc:  # noqa: PERF203 - a few envelopes at most
            errors.append(exc)
    if require or ignored is None:
        raise errors[0]
    ignored.extend(f"signature referrer {e.name}: {x.diagnostics()}"
                   for e, x in zip(envelopes, errors, strict=True))
    return None


__all__ = ["EMPTY_TYPE", "ENVELOPE_TYPE", "SIGNATURE_TYPE", "attach_signature",
           "check_referrer_signatures", "fetch_signatures", "keep_beside", "list_signatures",
           "signature_manifest"]
