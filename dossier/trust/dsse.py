"""The DSSE envelope and the in-toto statement it carries, as pydantic models (as
sigstore-python models them), with the one-line reason a file is not one.

- envelope (DSSE v1, https://github.com/secure-systems-lab/dsse/blob/master/envelope.md):
  ``{"payloadType", "payload": base64, "signatures": [{"keyid", "sig": base64, "publicKey":
  base64 (ours)}]}``; fields a reader does not know are kept (DSSE readers ignore them), so an
  envelope read and written back keeps them;
- statement (in-toto v1, https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md):
  ``{"_type", "subject": [{"name", "digest": {ALG: HEX}}], "predicateType", "predicate"}``.

The statement's format is versioned by ``predicate.buildDefinition.internalParameters.
statementFormat`` (:data:`STATEMENT_FORMAT`; inside the signed payload, so it cannot be
changed without the key):

- format 1 (no such field; dossier before subjects carried SHA-256): each subject's digest set
  is ``{"blake3": HEX}``;
- format 2: ``{"sha256": HEX, "blake3": HEX}``, both required: ``sha256`` is in-toto's
  predefined name, so verifiers that know only the standard names match a subject to a file
  (securesystemslib with in-toto's attestation model and ``sha256sum`` are tested:
  docs/signing.md); ``blake3`` keeps format-1 readers' digest beside it.

Both are read; a format this module does not know (a newer dossier's) is refused by name.

Base64 fields are kept as the text that was read (standard or URL-safe alphabet, as DSSE
allows), checked when parsed, and decoded on demand, so writing an envelope back changes none of
its bytes. :func:`parse_envelope` and :func:`parse_statement` raise :class:`EnvelopeProblem`
naming the first thing wrong, in the order a reader meets it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PAYLOAD_TYPE: Literal["application/vnd.in-toto+json"] = "application/vnd.in-toto+json"
"""DSSE payload type of an in-toto statement."""
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
"""in-toto Statement v1."""
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
"""SLSA provenance v1."""
DIGEST = "blake3"
"""DigestSet key of the digest every format's subjects carry (lowercase hex, 256-bit BLAKE3)."""
SHA256_DIGEST = "sha256"
"""in-toto's DigestSet key for SHA-256 (lowercase hex): format 2's subjects carry it."""
STATEMENT_FORMAT = 2
"""The statement format written (``internalParameters.statementFormat``)."""
FORMAT_FIELD = "statementFormat"
"""Its field in the predicate's ``buildDefinition.internalParameters``."""
FORMAT_DIGESTS: dict[int, tuple[str, ...]] = {1: (DIGEST,), 2: (SHA256_DIGEST, DIGEST)}
"""The digests every subject of a statement of each format carries."""
MAX_SIGNATURES = 64
"""An envelope with more signatures than this is refused (bounds the work of checking it)."""


class EnvelopeProblem(ValueError):
    """What is wrong with an envelope or a statement, in one line (without the file's name);
    ``altered`` when the file parses but says something it must not (as opposed to not being
    an envelope at all)."""

    def __init__(self, text: str, *, altered: bool = True) -> None:
        super().__init__(text)
        self.altered = altered


def b64decode(text: object) -> bytes | None:
    """Strict base64 (standard or URL-safe alphabet, as DSSE allows); None when it is not."""
    if not isinstance(text, str) or not text.isascii():
        return None
    for altchars in (None, b"-_"):
        with contextlib.suppress(binascii.Error, ValueError):
            return base64.b64decode(text.encode("ascii"), altchars=altchars, validate=True)
    return None


def b64encode(data: bytes) -> str:
    """Standard base64 text."""
    return base64.b64encode(data).decode("ascii")


def _base64(text: str, size: int | None = None) -> str:
    raw = b64decode(text)
    if raw is None or (size is not None and len(raw) != size):
        raise ValueError("not base64" if size is None else f"not {size} bytes of base64")
    return text


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True,
                              strict=True)


class Signature(_Wire):
    """One signature of an envelope."""

    keyid: str = ""
    """Which key signed (a hint: lowercase hex BLAKE3 of the raw public key)."""
    sig: str
    """Ed25519 signature over the PAE of the payload, base64 (64 bytes)."""
    public_key: str | None = Field(None, alias="publicKey")
    """The signer's raw 32-byte Ed25519 public key, base64 (dossier's addition)."""

    @field_validator("sig")
    @classmethod
    def _sig(cls, v: str) -> str:
        return _base64(v, 64)

    @field_validator("public_key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        return None if v is None else _base64(v, 32)

    @property
    def sig_bytes(self) -> bytes:
        """The signature's bytes."""
        return b64decode(self.sig) or b""

    @property
    def public_key_bytes(self) -> bytes | None:
        """The embedded public key's bytes, if any."""
        return None if self.public_key is None else b64decode(self.public_key)


class Envelope(_Wire):
    """A DSSE v1 envelope."""

    payload_type: Literal["application/vnd.in-toto+json"] = Field(alias="payloadType")
    """What the payload is: an in-toto statement."""
    payload: str
    """The statement's canonical JSON, base64."""
    signatures: list[Signature] = Field(min_length=1, max_length=MAX_SIGNATURES)
    """Every signature over it."""

    @field_validator("payload")
    @classmethod
    def _payload(cls, v: str) -> str:
        return _base64(v)

    @property
    def body(self) -> bytes:
        """The payload's bytes."""
        return b64decode(self.payload) or b""

    def to_bytes(self) -> bytes:
        """How an envelope is stored: indented JSON, sorted keys, a trailing newline."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


class Subject(_Wire):
    """One file the statement covers."""

    name: str
    """Its bundle path."""
    digest: dict[str, str]
    """Its digests by algorithm; :data:`DIGEST` is required (and SHA-256 in format 2)."""

    @field_validator("digest")
    @classmethod
    def _blake3(cls, v: dict[str, str]) -> dict[str, str]:
        if DIGEST not in v:
            raise ValueError(f"no {DIGEST} digest")
        return v


class Statement(_Wire):
    """An in-toto Statement v1 with SLSA provenance v1."""

    type: Literal["https://in-toto.io/Statement/v1"] = Field(alias="_type")
    """The statement's type."""
    predicate_type: Literal["https://slsa.dev/provenance/v1"] = Field(alias="predicateType")
    """The predicate's type."""
    subject: list[Subject] = Field(min_length=1)
    """Every file covered."""
    predicate: dict[str, Any] = Field(default_factory=dict)
    """How the bundle was made."""

    @property
    def format(self) -> int | None:
        """The statement's format: 1 when it names none (see the module docstring), None when
        what it names is not a whole number."""
        build = self.predicate.get("buildDefinition")
        params = build.get("internalParameters") if isinstance(build, dict) else None
        found = params.get(FORMAT_FIELD, 1) if isinstance(params, dict) else 1
        return found if type(found) is int else None

    def digests(self) -> dict[str, str]:
        """Subject name -> BLAKE3."""
        return {s.name: s.digest[DIGEST] for s in self.subject}

    def digest_sets(self) -> dict[str, dict[str, str]]:
        """Subject name -> the digests its format requires, by algorithm."""
        wanted = FORMAT_DIGESTS[self.format or 0]
        return {s.name: {a: s.digest[a] for a in wanted} for s in self.subject}


def parse_envelope(data: bytes) -> Envelope:
    """The envelope in ``data``; EnvelopeProblem naming the first thing wrong."""
    raw = _object(data, "is not a DSSE envelope", altered=False)
    try:
        return Envelope.model_validate(raw)
    except ValidationError as exc:
        raise EnvelopeProblem(_envelope_problem(raw, exc)) from None


def parse_statement(payload: bytes, *, must_cover: str) -> Statement:
    """The statement in a verified payload; EnvelopeProblem when it is not one of ours, names a
    subject twice or does not cover ``must_cover``."""
    try:
        raw = json.loads(payload)
    except (ValueError, RecursionError):
        raise EnvelopeProblem("the signed payload is not JSON") from None
    if not isinstance(raw, dict):
        raise EnvelopeProblem("the payload is not an in-toto Statement v1")
    try:
        statement = Statement.model_validate(raw)
    except ValidationError as exc:
        raise EnvelopeProblem(_statement_problem(raw, exc)) from None
    fmt = statement.format
    wanted = FORMAT_DIGESTS.get(fmt or 0)
    if wanted is None:
        if fmt is None or fmt < 1:
            raise EnvelopeProblem(f"the statement's {FORMAT_FIELD} is malformed")
        raise EnvelopeProblem(f"the statement is of format {fmt}; this dossier reads formats "
                              f"{', '.join(map(str, FORMAT_DIGESTS))}", altered=False)
    seen: set[str] = set()
    for s in statement.subject:
        if s.name in seen or any(a not in s.digest for a in wanted):
            raise EnvelopeProblem(_subject_problem(s.name, wanted))
        seen.add(s.name)
    if must_cover not in seen:
        raise EnvelopeProblem(f"the statement does not cover {must_cover}")
    return statement


def _object(data: bytes, what: str, *, altered: bool) -> dict[str, Any]:
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise EnvelopeProblem(f"{what} (not JSON: {detail})", altered=altered) from None
    if not isinstance(raw, dict):
        raise EnvelopeProblem(f"{what} (a JSON {type(raw).__name__})", altered=altered)
    return raw


def _envelope_problem(raw: dict[str, Any], exc: ValidationError) -> str:
    loc = exc.errors()[0]["loc"]
    if loc[0] == "payloadType":
        return f"payload type {raw.get('payloadType')!r} is not {PAYLOAD_TYPE!r}"
    if loc[0] == "payload":
        return "the payload is not base64"
    if len(loc) < 2 or not isinstance(loc[1], int):
        return f"the envelope holds no signatures (or more than {MAX_SIGNATURES})"
    n = loc[1]
    item = raw["signatures"][n]
    if len(loc) < 3:
        return f"signature {n + 1} is not an object"
    keyid = item.get("keyid") if isinstance(item.get("keyid"), str) else ""
    label = f"signature {n + 1} (key {keyid[:16] or 'unnamed'}) does not verify"
    if loc[2] == "publicKey":
        return f"{label}: its public key is not 32 bytes of base64"
    if loc[2] == "keyid":
        return f"{label}: its key id is not text"
    return f"{label}: the statement or the signature was altered"


def _statement_problem(raw: dict[str, Any], exc: ValidationError) -> str:
    loc = exc.errors()[0]["loc"]
    if loc[0] == "_type":
        return "the payload is not an in-toto Statement v1"
    if loc[0] == "predicateType":
        return f"predicate type {raw.get('predicateType')!r} is not {PREDICATE_TYPE!r}"
    if loc[0] == "subject" and len(loc) > 1 and isinstance(loc[1], int):
        item = raw["subject"][loc[1]]
        return _subject_problem(item.get("name") if isinstance(item, dict) else None)
    if loc[0] == "subject":
        return "the statement names no subjects"
    return f"the statement's {loc[0]} is malformed"


def _subject_problem(name: object, wanted: tuple[str, ...] = (DIGEST,)) -> str:
    return (f"subject {str(name)[:80]!r} has no {' or no '.join(wanted)} digest or appears "
            "twice")


__all__ = ["DIGEST", "FORMAT_DIGESTS", "FORMAT_FIELD", "MAX_SIGNATURES", "PAYLOAD_TYPE",
           "PREDICATE_TYPE", "SHA256_DIGEST", "STATEMENT_FORMAT", "STATEMENT_TYPE",
           "Envelope", "EnvelopeProblem", "Signature", "Statement", "Subject", "b64decode",
           "b64encode", "parse_envelope", "parse_statement"]
