"""A bundle as an OCI artifact: push, pull (verified on arrival), and the pull cache of verify.

The artifact is an OCI image manifest (image-spec 1.1) with:

- ``artifactType`` :data:`ARTIFACT_TYPE`;
- ``config``: the bundle's ``manifest.json``, byte for byte (:data:`CONFIG_TYPE`), so the
  dossier id (xxh3-128 over it) survives the trip;
- ``layers``: one per file of the manifest's file table, in its order (sorted by path), each
  :data:`LAYER_TYPE` with its size, its sha256 digest (the distribution spec's; xxh3-128 stays
  in dossier's own manifest) and its bundle path as ``org.opencontainers.image.title``;
- annotations: the bundle name, release version, creation time (from the manifest, so pushing
  the same bundle twice gives the same bytes and the same digest) and dossier id.

One layer per file rather than one tar: files that did not change between releases (the model,
the knob database) are stored once and not uploaded again, and a push cut short resumes with
the blobs already there. The folder and the ``.dossier.tar`` of a bundle push as the same
artifact.

Pull checks, in order: the manifest's digest (the one asked for, or the one the registry
names); that it is a dossier artifact; the config blob's sha256, then its format version; that
the layers are exactly the file table, sizes included; every layer's sha256 and size while it
streams to disk (no byte past its size is written); then the bundle's integrity check
(xxh3-128 of every file, the dossier id). Everything lands in a staging folder beside the
target and is renamed into place only after all of that passed: a pull that fails or is
killed never leaves anything that looks like a bundle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dossier.bundle.integrity import (
    BundleScan,
    Scanned,
    check_integrity,
    require_intact,
    scan_bundle,
)
from dossier.bundle.manifest import (
    BUNDLE_SUFFIX,
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    Manifest,
    parse_manifest,
)
from dossier.bundle.reader import open_bundle, read_bundle
from dossier.diskfull import output_error
from dossier.errors import (
    BundleFormatError,
    DossierError,
    InputError,
    OutputError,
    SignatureError,
)
from dossier.files import (
    begin_staging,
    fsync_path,
    fsync_tree,
    rename_noreplace,
    write_durable,
)
from dossier.hashing import ALGORITHM, BLAKE3, SHA256, canonical_json, digest_bytes
from dossier.names import folder_problem, inside
from dossier.registry.client import (
    OCI_MANIFEST,
    RegistryClient,
    connect,
    sha256_bytes,
)
from dossier.registry.reference import DIGEST, Reference, parse_reference

logger = logging.getLogger(__name__)

ARTIFACT_TYPE = "application/vnd.dossier.bundle.v1"
"""The manifest's ``artifactType``."""
CONFIG_TYPE = "application/vnd.dossier.bundle.manifest.v1+json"
"""Media type of the config blob: the bundle's manifest.json."""
LAYER_TYPE = "application/vnd.dossier.bundle.file.v1"
"""Media type of a layer: one file of the bundle, verbatim."""
TITLE = "org.opencontainers.image.title"
ID_ANNOTATION = "vnd.dossier.id"
CACHE_ENV = "DOSSIER_REGISTRY_CACHE"
"""Where ``verify REF`` keeps pulled bundles (default ``$XDG_CACHE_HOME/dossier/registry``)."""


@dataclass(frozen=True)
class Pushed:
    """What :func:`push_bundle` did."""

    reference: str
    """``REGISTRY/REPO@sha256:...``: the artifact, pinned."""
    tag: str
    """The tag it is under."""
    digest: str
    """The manifest's digest (the same for the same bundle, every time)."""
    dossier_id: str
    """The bundle's id."""
    files: int
    """Layers (files of the bundle)."""
    bytes: int
    """Bytes of all layers and the config."""
    uploaded: int
    """Blobs uploaded by this push (the others were there already)."""
    signature: str | None = None
    """Digest of the signature's referrer manifest, when one was attached."""


@dataclass(frozen=True)
class Pulled:
    """What :func:`pull_bundle` wrote."""

    path: Path
    """``OUT/NAME-VERSION.dossier``."""
    reference: str
    """``REGISTRY/REPO@sha256:...``."""
    digest: str
    """The manifest's digest."""
    dossier_id: str
    """The bundle's id (its integrity check passed)."""
    files: int
    """Files pulled (manifest.json not counted)."""
    cached: bool = False
    """True when an intact copy was in the cache and nothing was downloaded."""
    signatures: list[Path] = field(default_factory=list)
    """Signature envelopes found as referrers (:func:`fetch_bundle`: each one as found;
    :func:`pull_bundle`: the one written beside the bundle, if any)."""
    warnings: list[str] = field(default_factory=list)
    """Malformed signature referrers that were ignored (:func:`fetch_bundle` only)."""


# ------------------------------------------------------------------------------------- push
def artifact_manifest(config: bytes, manifest: Manifest, layers: list[dict[str, Any]]) -> bytes:
    """The OCI image manifest of a bundle, as canonical JSON bytes (deterministic)."""
    body = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256_bytes(config), "size": len(config)},
        "layers": layers,
        "annotations": {
            TITLE: manifest.name + BUNDLE_SUFFIX,
            "org.opencontainers.image.version": str(manifest.release_version),
            "org.opencontainers.image.created": manifest.created_at,
            ID_ANNOTATION: manifest.dossier_id,
        },
    }
    return canonical_json(body)


def push_bundle(path: Path, target: str, *, insecure: bool = False,
                signature: Path | None = None) -> Pushed:
    """Push the bundle folder or ``.dossier.tar`` at ``path`` to ``target``
    (``REGISTRY/REPO:TAG``).

    The bundle must pass its integrity check (IntegrityError otherwise). Blobs the repository
    holds already are not uploaded again; the manifest is stored last, so a push cut short
    leaves no tag pointing at a partial artifact. ``signature`` (a ``dossier sign`` envelope,
    checked against the bundle's files first) is attached as a referrer of the manifest.
    """
    from dossier.registry.referrers import attach_signature
    from dossier.trust.signing import check_signature

    ref = parse_reference(target, need_tag=True)
    if ref.digest:
        raise BundleFormatError(f"{target}: push to a tag, not a digest (the digest is what the "
                                "push computes)")
    client = RegistryClient(ref, insecure=insecure)  # refuses --insecure before any I/O
    # every file read once for all its digests: xxh3-128 (integrity), SHA-256 (the layers),
    # BLAKE3 (the signature's subjects); an archive's as it is extracted
    algorithms = [SHA256, BLAKE3] if signature is not None else [SHA256]
    with open_bundle(Path(path), digests=algorithms) as bundle:
        scan = scan_bundle(bundle, algorithms)
        require_intact(bundle, "not pushed", scan)
        if signature is not None:  # before any upload: never attach a signature of other bytes
            check_signature(bundle, (), signature=signature, scan=scan)
        config = (bundle.path / MANIFEST_NAME).read_bytes()
        blobs: list[tuple[Path | bytes, str, int]] = [(config, sha256_bytes(config), len(config))]
        layers = []
        for entry in bundle.manifest.files:
            scanned = scan.files[entry.path]  # the integrity check passed: it is there
            digest, size = "sha256:" + scanned.digests[SHA256], scanned.size
            layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size,
                           "annotations": {TITLE: entry.path}})
            blobs.append((bundle.path / entry.path, digest, size))
        body = artifact_manifest(config, bundle.manifest, layers)
        client.connect()
        uploaded = 0
        seen: set[str] = set()
        for source, digest, size in blobs:
            if digest in seen or client.has_blob(digest):
                continue
            logger.debug("push %s: uploading %s (%d bytes)", ref, digest, size)
            client.upload_blob(source, digest, size)
            seen.add(digest)
            uploaded += 1
        digest, _ = client.put_manifest(ref.target, body, OCI_MANIFEST)
        logger.info("pushed %s as %s: %d of %d blobs uploaded", bundle.source, digest, uploaded,
                    len(blobs))
        dossier_id = bundle.manifest.dossier_id
    sig_digest = None
    if signature is not None:
        sig_digest = attach_signature(client, digest, len(body), signature)
    return Pushed(str(ref.with_digest(digest)), ref.target, digest, dossier_id, len(layers),
                  sum(b[2] for b in blobs), uploaded, sig_digest)


# ------------------------------------------------------------------------------------- pull
@dataclass(frozen=True)
class _Artifact:
    config: dict[str, Any]
    layers: dict[str, dict[str, Any]]


def parse_artifact(body: bytes, where: str) -> _Artifact:
    """The config descriptor and the layers (by bundle path) of a dossier artifact manifest;
    BundleFormatError for anything else."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BundleFormatError(f"{where}: the manifest is not valid JSON ({exc})") from exc
    if not isinstance(raw, dict) or raw.get("schemaVersion") != 2:
        raise BundleFormatError(f"{where} is not an OCI image manifest")
    config = raw.get("config")
    kind = raw.get("artifactType") or (config.get("mediaType") if isinstance(config, dict)
                                       else None)
    if kind != ARTIFACT_TYPE or not isinstance(config, dict) or config.get(
            "mediaType") != CONFIG_TYPE:
        raise BundleFormatError(f"{where} is not a dossier bundle (artifact type {kind!r}, "
                                f"expected {ARTIFACT_TYPE!r})")
    _descriptor(config, where, "config")
    layers: dict[str, dict[str, Any]] = {}
    found = raw.get("layers")
    if not isinstance(found, list):
        raise BundleFormatError(f"{where}: layers is not a list")
    for i, layer in enumerate(found):
        _descriptor(layer, where, f"layer {i}")
        title = (layer.get("annotations") or {}).get(TITLE)
        if layer.get("mediaType") != LAYER_TYPE or not isinstance(title, str):
            raise BundleFormatError(f"{where}: layer {i} is not a dossier bundle file")
        if title in layers:
            raise BundleFormatError(f"{where}: {title!r} appears twice among the layers")
        layers[title] = layer
    return _Artifact(config, layers)


def _descriptor(d: Any, where: str, what: str) -> None:
    if (not isinstance(d, dict) or not isinstance(d.get("digest"), str)
            or not DIGEST.match(d["digest"]) or type(d.get("size")) is not int or d["size"] < 0):
        raise BundleFormatError(f"{where}: the {what} descriptor is malformed (a sha256 digest "
                                "and a size are required)")


def pull_bundle(source: str, out_dir: Path, *, insecure: bool = False) -> Pulled:
    """Pull ``source`` (``REGISTRY/REPO:TAG`` or ``@sha256:...``) into
    ``out_dir/NAME-VERSION.dossier``, verified on arrival (see the module docstring).

    The signature referrers the registry holds for it are checked against the pulled files
    and written beside the bundle (``OUT/NAME-VERSION.dossier.sig.json``, where ``verify``
    looks; :func:`~dossier.registry.referrers.keep_beside`), so that ``verify`` of the pulled
    copy judges its signature as ``verify REF`` does; ``signatures`` names that file.

    OutputError when the bundle folder or its signature file exists already (never
    overwritten); DigestMismatchError or IntegrityError (exit 6) for content that does not
    match; RegistryError and its kinds for the registry's failures. A signature referrer that
    is malformed or does not pass (another bundle's signature, not an envelope, past its
    size) is named in ``warnings`` and ignored, as ``verify REF`` ignores it. Nothing is left
    at the target on failure.
    """
    from dossier.registry.referrers import keep_beside

    ref = parse_reference(source)
    client = connect(ref, insecure=insecure)
    body, digest, _ = _get_manifest(client, ref)
    pulled = _pull(client, ref, body, digest, Path(out_dir))
    ignored: list[str] = []
    try:
        signature = keep_beside(client, digest, pulled.path, ignored)
    except BaseException:
        shutil.rmtree(pulled.path, ignore_errors=True)  # this pull made it: nothing is left
        raise
    return dataclasses.replace(pulled, signatures=[signature] if signature else [],
                               warnings=[f"{w}; ignored" for w in ignored])


def _get_manifest(client: RegistryClient, ref: Reference) -> tuple[bytes, str, str]:
    got = client.get_manifest(ref.target)
    assert got is not None
    return got


def _pull(client: RegistryClient, ref: Reference, body: bytes, digest: str,
          out_dir: Path) -> Pulled:
    pinned = str(ref.with_digest(digest))
    artifact = parse_artifact(body, pinned)
    if artifact.config["size"] > MANIFEST_MAX_BYTES:
        raise BundleFormatError(f"{pinned}: the config blob is larger than "
                                f"{MANIFEST_MAX_BYTES >> 20} MiB; not a dossier manifest")
    config = client.blob_bytes(artifact.config["digest"], artifact.config["size"],
                               f"the config blob ({MANIFEST_NAME})")
    _, manifest, _ = parse_manifest(config, f"{pinned}: {MANIFEST_NAME}")
    table = manifest.table()
    extra = sorted(set(artifact.layers) - set(table))
    missing = sorted(set(table) - set(artifact.layers))
    if extra or missing:
        raise BundleFormatError(f"{pinned}: the layers are not the bundle's file table ("
                                + (f"{extra[0]!r} is not in it" if extra else
                                   f"{missing[0]!r} has no layer") + ")")
    for path, layer in artifact.layers.items():
        if layer["size"] != table[path].size:
            raise BundleFormatError(f"{pinned}: layer {path!r} is {layer['size']} bytes, the "
                                    f"manifest says {table[path].size}")
    target = inside(out_dir, out_dir / (manifest.name + BUNDLE_SUFFIX), pinned)
    if os.path.lexists(target):
        raise OutputError(f"{target} exists already", hint="bundles are never overwritten; "
                          "pull into another --out")
    staging = begin_staging(out_dir, target.name, directory=True)
    try:
        write_durable(staging / MANIFEST_NAME, config)
        # each layer's xxh3-128 from the bytes as they are written (the staging folder is this
        # process's): the integrity check reads nothing again
        written = {MANIFEST_NAME: Scanned(len(config), {ALGORITHM: digest_bytes(config)})}
        for path in sorted(artifact.layers):
            layer = artifact.layers[path]
            dest = staging.joinpath(*path.split("/"))
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BundleFormatError(f"{pinned}: {path!r} cannot be placed ({exc.strerror})"
                                        ) from exc
            written[path] = Scanned(layer["size"], client.download_blob(
                layer["digest"], layer["size"], dest, f"layer {path!r}", [ALGORITHM]))
        fsync_tree(staging)
        bundle = read_bundle(staging, source=Path(pinned))
        require_intact(bundle, scan=BundleScan((ALGORITHM,), dict(sorted(written.items())), []),
                       source=pinned)
        try:
            rename_noreplace(staging, target)
        except FileExistsError:
            raise OutputError(f"{target} appeared while the bundle was pulled") from None
        fsync_path(out_dir)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise output_error(exc, out_dir, f"pulling {pinned}", f"write {target}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Pulled(target, pinned, digest, manifest.dossier_id, len(table))


# ------------------------------------------------------------------------------------ cache
def cache_dir() -> Path:
    """``$DOSSIER_REGISTRY_CACHE``, else ``$XDG_CACHE_HOME/dossier/registry`` (default
    ``~/.cache/dossier/registry``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dossier" / "registry"


def fetch_bundle(source: str, *, insecure: bool = False, cache: Path | None = None,
                 require_signature: bool = False) -> Pulled:
    """Pull ``source`` into the cache (``CACHE/sha256-HEX/NAME-VERSION.dossier``, by manifest
    digest), or reuse an intact copy there, and fetch its signature referrers.

    A malformed signature referrer (not a dossier signature of this artifact, or one whose
    manifest or envelope does not match its digest) is named in :attr:`Pulled.warnings` and
    ignored: anyone who may push to the repository could otherwise break verification for
    everyone. With ``require_signature`` it is refused (SignatureError, exit 13): a verifier
    that requires signatures accepts nothing odd in them.

    A cached copy is reused only when the sha256 of its ``manifest.json`` is the artifact's
    config digest (the copy is the artifact's bundle, not another intact one) and it passes its
    integrity check; otherwise it is removed and pulled again. The cache folder must be this
    user's and writable by no one else (InputError, exit 3); an entry folder that is not is
    removed and pulled again."""
    from dossier.registry.referrers import fetch_signatures

    ref = parse_reference(source)
    client = connect(ref, insecure=insecure)
    body, digest, _ = _get_manifest(client, ref)
    root = private_cache(cache or cache_dir())
    folder = root / digest.replace(":", "-")  # a digest computed here: one plain name
    config = parse_artifact(body, str(ref.with_digest(digest))).config["digest"]
    pulled = _cached(folder, ref, digest, config)
    logger.info("%s is %s: %s", source, digest, f"intact in the cache at {pulled.path}"
                if pulled is not None else f"not in the cache {root}; pulling it")
    if pulled is None:
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        try:
            pulled = _pull(client, ref, body, digest, folder)
        except OutputError:  # another process pulled the same digest meanwhile
            pulled = _cached(folder, ref, digest, config)
            if pulled is None:
                raise
    malformed: list[str] = []
    sigs = fetch_signatures(client, digest, folder / "signatures", malformed)
    if malformed and require_signature:
        raise SignatureError(f"{malformed[0]}; refused (--require-signature)",
                             hint="remove the malformed referrer from the registry, or verify "
                             "without --require-signature")
    return Pulled(pulled.path, pulled.reference, digest, pulled.dossier_id, pulled.files,
                  pulled.cached, sigs, [f"{w}; ignored" for w in malformed])


def private_cache(root: Path) -> Path:
    """The registry cache folder ``root``, created (mode 0700) if needed; InputError (exit 3)
    when it is not a folder of this user's that no one else may write: a bundle taken from it
    is verified, and its engines are what this host then runs."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise InputError(f"the registry cache {root} cannot be created "
                         f"({exc.strerror or exc})", hint=f"set {CACHE_ENV}") from exc
    problem = folder_problem(root)
    if problem is not None:
        raise InputError(f"the registry cache {root} {problem}: a bundle taken from it is "
                         "what this host verifies and runs",
                         hint=f"use a folder of your own ({CACHE_ENV}), or chmod go-w {root}")
    return root


def _cached(folder: Path, ref: Reference, digest: str, config: str) -> Pulled | None:
    """The intact copy of the artifact in ``folder``, whose manifest.json has the sha256
    ``config``; anything else found there is removed."""
    if not os.path.lexists(folder):
        return None
    if folder_problem(folder) is not None:
        _remove(folder)
        return None
    for path in sorted(folder.glob("*" + BUNDLE_SUFFIX)):
        try:
            data = _read_regular(path / MANIFEST_NAME, MANIFEST_MAX_BYTES)
            if data is not None and sha256_bytes(data) == config:
                bundle = read_bundle(path)
                if (path.name == bundle.manifest.name + BUNDLE_SUFFIX
                        and not path.is_symlink() and check_integrity(bundle)):
                    return Pulled(path, str(ref.with_digest(digest)), digest,
                                  bundle.manifest.dossier_id, len(bundle.manifest.files),
                                  cached=True)
        except DossierError:
            pass
        _remove(path)
    return None


def _read_regular(path: Path, cap: int) -> bytes | None:
    """At most ``cap`` bytes of the regular file ``path`` (never through a link, never blocking
    on a FIFO); None when it is anything else or larger."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(cap + 1)
    return data if len(data) <= cap else None


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


__all__ = ["ARTIFACT_TYPE", "CACHE_ENV", "CONFIG_TYPE", "LAYER_TYPE", "Pulled", "Pushed",
           "artifact_manifest", "cache_dir", "fetch_bundle", "parse_artifact",
           "private_cache", "pull_bundle", "push_bundle"]
