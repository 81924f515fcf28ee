"""The HTTP side of an OCI registry: credentials, manifests and blobs, every byte checked.

Built on oras-py (PyPI ``oras``): its :class:`oras.provider.Registry` holds the HTTP session,
and its auth backends read Docker credentials (``auths``, ``credHelpers``, ``credsStore``) and
answer the registry's challenges (HTTP Basic, or bearer tokens from the registry's token
service). What oras-py 0.2 does not do is done here, with its session and auth backends:

- every request has a timeout and fails at once with one line (oras-py retries any exception
  five times with sleeps of 3 to 83 s, so an unreachable registry would take minutes), and a
  deadline on the whole response, and every body a cap (:mod:`dossier.registry.transport`);
- a redirect is followed only to the registry's own scheme, host and port (never to another
  host, never from HTTPS down to HTTP), at most :data:`MAX_REDIRECTS` times;
- a blob is streamed to disk through sha256 and refused when its digest or size differs
  (oras-py's download writes whatever arrives, unchecked);
- a blob is uploaded streamed from its file (oras-py's monolithic upload reads the whole file
  into memory);
- manifests are sent as the exact bytes whose digest was computed here (oras-py re-serializes
  the JSON and fixes the media type), and read with a size cap, their digest checked;
- the registry's errors are mapped to dossier's errors: unreachable or failing (exit 20),
  credentials missing or refused (21), not found (22), digest mismatch (6).

Credentials: ``DOSSIER_REGISTRY_USERNAME`` and ``DOSSIER_REGISTRY_PASSWORD`` when both are set,
else the Docker config file (``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``).
Plain HTTP (``insecure``) is allowed only for a loopback registry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urljoin, urlsplit

from dossier.diskfull import output_error
from dossier.errors import (
    BackendUnavailableError,
    DigestMismatchError,
    InputError,
    NotFoundError,
    RegistryAuthError,
    RegistryError,
)
from dossier.files import read_small
from dossier.hashing import CHUNK, SHA256, feed, new_hasher
from dossier.registry.reference import Reference, is_loopback
from dossier.registry.transport import TIMEOUT_S, expecting, mount, read_body, stream_body

MANIFEST_MAX_BYTES = 4 << 20
"""A manifest larger than this is refused (the distribution spec's floor for what registries
accept)."""
MAX_REDIRECTS = 5
"""Redirects followed for one request, at most."""
ERROR_BODY_MAX_BYTES = 64 << 10
"""Of an error response's body, at most this much is read (for its OCI error code)."""
_REDIRECTS = (301, 302, 303, 307, 308)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
USERNAME_ENV = "DOSSIER_REGISTRY_USERNAME"
PASSWORD_ENV = "DOSSIER_REGISTRY_PASSWORD"
_HINT_INSTALL = "pip install 'dossier[oci]' (oras)"

logging.getLogger("oras.logger").addHandler(logging.NullHandler())  # the library never prints


def sha256_bytes(data: bytes) -> str:
    """``sha256:HEX`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> tuple[str, int]:
    """``sha256:HEX`` and size of the file at ``path``, streamed in fixed chunks."""
    h = new_hasher(SHA256)
    with open(path, "rb", buffering=0) as f:
        size = feed(f, [h])
    return "sha256:" + h.hexdigest(), size


def _oras() -> Any:
    try:
        import oras.auth
        import oras.provider
    except ImportError:  # pragma: no cover - the [oci] extra is installed in CI
        raise BackendUnavailableError("registries need the oras package",
                                      hint=_HINT_INSTALL) from None
    return oras


def docker_config_path() -> Path:
    """``$DOCKER_CONFIG/config.json`` when DOCKER_CONFIG is set, else ``~/.docker/config.json``."""
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder) / "config.json" if folder else Path.home() / ".docker" / "config.json"


def read_docker_config(path: Path) -> dict[str, Any]:
    """The credential parts of a Docker config file (``auths``, ``credHelpers``,
    ``credsStore``), checked; an absent file gives none. InputError for a malformed one."""
    try:
        data = read_small(path, 1 << 20)
    except FileNotFoundError:
        return {"auths": {}, "credHelpers": {}, "credsStore": None}
    except OSError as exc:
        raise InputError(f"cannot read the Docker config {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(data) if len(data) <= 1 << 20 else None
    except ValueError as exc:
        raise InputError(f"the Docker config {path} is not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise InputError(f"the Docker config {path} is not a JSON object of at most 1 MiB")
    auths, helpers, store = raw.get("auths", {}), raw.get("credHelpers", {}), raw.get("credsStore")
    if (not isinstance(auths, dict) or not all(isinstance(v, dict) for v in auths.values())
            or not isinstance(helpers, dict)
            or not all(isinstance(v, str) for v in helpers.values())
            or not isinstance(store, (str, type(None)))):
        raise InputError(f"the Docker config {path} has malformed auths, credHelpers or "
                         "credsStore")
    return {"auths": auths, "credHelpers": helpers, "credsStore": store}


class RegistryClient:
    """One registry repository, connected: its version check passed and credentials, if it
    asks for them, accepted. Use :func:`connect`."""

    def __init__(self, ref: Reference, *, insecure: bool = False) -> None:
        if insecure and not is_loopback(ref.host):
            raise InputError(f"--insecure (plain HTTP) is allowed only for a loopback registry "
                             f"(localhost, 127.0.0.0/8, ::1), not {ref.registry}",
                             hint="serve the registry over HTTPS")
        oras = _oras()
        self.ref = ref
        self.base = f"{'http' if insecure else 'https'}://{ref.registry}"
        self.repo_url = f"{self.base}/v2/{ref.repository}"
        self._oras = oras.provider.Registry(hostname=ref.registry, insecure=insecure)
        self.session = self._oras.session
        mount(self.session)  # a deadline on every response, a cap on every body
        self._auth: Any = None
        self._auth_header: dict[str, str] = {}
        self._credential_source = "nowhere"

    # ------------------------------------------------------------------------ connection
    def connect(self) -> RegistryClient:
        """The version check (``GET /v2/``), answering a credentials challenge."""
        r = self._send("GET", f"{self.base}/v2/")
        with r:
            if r.status_code == 401:
                self._authenticate(r)
                r2 = self._send("GET", f"{self.base}/v2/", headers=dict(self._auth_header))
                with r2:
                    if r2.status_code in (401, 403):
                        raise RegistryAuthError(f"{self.ref.registry} refused the credentials "
                                                f"of {self._credential_source} "
                                                f"(HTTP {r2.status_code})")
                    self.check(r2, "the version check")
            elif r.status_code == 404:
                raise RegistryError(f"{self.ref.registry} is not an OCI registry "
                                    "(GET /v2/ answered 404)")
            else:
                self.check(r, "the version check")
        return self

    def _credentials(self, auth: Any) -> bool:
        user, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
        if user and password:
            auth.set_basic_auth(user, password)
            self._credential_source = f"{USERNAME_ENV}/{PASSWORD_ENV}"
            return True
        path = docker_config_path()
        auth._auth_config = read_docker_config(path)
        oras = _oras()
        for host in oras.utils.iter_localhosts(self.ref.registry):
            if auth._load_auth(host):  # auths[host].auth, then credHelpers, then credsStore
                self._credential_source = f"the Docker config {path}"
                return True
        return False

    def _authenticate(self, challenge: Any) -> None:
        """Pick the auth backend the challenge asks for and load credentials into it."""
        oras = _oras()
        scheme = challenge.headers.get("Www-Authenticate", "").split(" ", 1)[0].lower()
        if scheme not in ("basic", "bearer"):
            raise RegistryAuthError(f"{self.ref.registry} asks for credentials with an "
                                    f"unsupported scheme {scheme or 'none'!r}")
        auth = oras.auth.get_auth_backend("basic" if scheme == "basic" else "token",
                                          self.session, self.base.startswith("http:"))
        auth._basic_auth = None
        found = self._credentials(auth)
        self._auth = auth
        if scheme == "basic":
            if not found:
                raise RegistryAuthError(f"{self.ref.registry} asks for credentials and none "
                                        "were found")
            self._auth_header = auth.get_auth_header()
        else:
            self._bearer(challenge)

    def _bearer(self, challenge: Any) -> None:
        try:
            headers, ok = self._auth.authenticate_request(challenge, {}, refresh=True)
        except Exception as exc:  # noqa: BLE001 - requests and oras raise many types here
            raise RegistryAuthError(f"{self.ref.registry}: the token service failed "
                                    f"({_reason(exc)})") from None
        if not ok:
            raise RegistryAuthError(f"{self.ref.registry}: the token service gave no token "
                                    f"to {self._credential_source}")
        self._auth_header = {"Authorization": headers["Authorization"]}

    # ----------------------------------------------------------------------------- requests
    def _send(self, method: str, url: str, *, expect: int = 0, **kw: Any) -> Any:
        """One request, its redirects followed only within the registry (see the module
        docstring); ``expect``: bytes it is expected to move (its deadline grows with them)."""
        for _ in range(MAX_REDIRECTS + 1):
            with expecting(expect, f"{self.ref.registry}: {method} {urlsplit(url).path[:120]}"):
                r = self._send_once(method, url, **kw)
            if r.status_code not in _REDIRECTS or method not in ("GET", "HEAD"):
                return r
            location = r.headers.get("Location", "")
            r.close()
            url = self._redirect(url, location)
        raise RegistryError(f"{self.ref.registry} redirected {method} "
                            f"{urlsplit(url).path[:120]} more than {MAX_REDIRECTS} times")

    def _redirect(self, url: str, location: str) -> str:
        """The URL a redirect leads to, when it stays on the registry's scheme, host and port;
        RegistryError otherwise (never followed to another host, never down to plain HTTP)."""
        target = urljoin(url, location)
        to, base = urlsplit(target), urlsplit(self.base)
        if not location:
            raise RegistryError(f"{self.ref.registry} answered a redirect without a Location")
        if base.scheme == "https" and to.scheme != "https":
            raise RegistryError(f"{self.ref.registry} redirected to {target[:120]!r}: from HTTPS "
                                "down to plain HTTP; not followed")
        if (to.scheme, to.netloc.lower()) != (base.scheme, base.netloc.lower()):
            raise RegistryError(f"{self.ref.registry} redirected to another host "
                                f"({target[:120]!r}); not followed",
                                hint="dossier follows redirects only within the registry")
        return target

    def _send_once(self, method: str, url: str, **kw: Any) -> Any:
        import requests

        try:
            return self.session.request(method, url, timeout=TIMEOUT_S, allow_redirects=False,
                                        **kw)
        except RegistryError:
            raise
        except requests.exceptions.SSLError as exc:
            raise RegistryError(f"{self.ref.registry}: TLS failed ({_reason(exc)})",
                                hint="a loopback registry over plain HTTP needs --insecure"
                                ) from None
        except requests.RequestException as exc:
            if "NewConnectionError" in repr(exc) or isinstance(exc, requests.ConnectTimeout):
                raise RegistryError(f"{self.ref.registry} is unreachable ({_reason(exc)})",
                                    hint="check the address and that the registry runs"
                                    ) from None
            raise RegistryError(f"{self.ref.registry} dropped the connection during {method} "
                                f"{urlsplit(url).path[:120]} ({_reason(exc)})",
                                hint="nothing was kept half-done; try again") from None

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                data: Any = None, stream: bool = False, expect: int = 0) -> Any:
        """One request with the credentials in force. A challenge is answered once: the first
        one (a registry whose version check needed no credentials may still ask for them per
        repository), or a bearer challenge for another scope (pull, then push)."""
        headers = {**(headers or {}), **self._auth_header}
        r = self._send(method, url, headers=headers, data=data, stream=stream, expect=expect)
        challenge = r.headers.get("Www-Authenticate", "").lower()
        if r.status_code == 401 and (self._auth is None or challenge.startswith("bearer")):
            r.close()
            if self._auth is None:
                self._authenticate(r)
            else:
                self._bearer(r)
            if hasattr(data, "seek"):
                data.seek(0)
            r = self._send(method, url, headers={**headers, **self._auth_header}, data=data,
                           stream=stream, expect=expect)
        return r

    def check(self, r: Any, what: str, *, missing: str | None = None) -> None:
        """Map an unsuccessful response to dossier's errors."""
        if 200 <= r.status_code < 300:
            return
        detail = _oci_error(r)
        if r.status_code in (401, 403):
            raise RegistryAuthError(f"{self.ref.registry} denied {what} in {self.ref.repository} "
                                    f"(HTTP {r.status_code}{detail}) with the credentials of "
                                    f"{self._credential_source}")
        if r.status_code == 404 and missing is not None:
            raise NotFoundError(missing + (f" ({detail[2:]})" if detail else ""),
                                hint="check the repository and the tag or digest")
        raise RegistryError(f"{self.ref.registry} failed {what} (HTTP {r.status_code}{detail})")

    # ---------------------------------------------------------------------------- manifests
    def get_manifest(self, target: str, accept: tuple[str, ...] = (OCI_MANIFEST,),
                     *, missing_ok: bool = False) -> tuple[bytes, str, str] | None:
        """The manifest ``target`` (tag or digest) names: (bytes, sha256 digest, media type).

        Refused: larger than :data:`MANIFEST_MAX_BYTES`; not the digest asked for; not the
        digest the registry says it is. NotFoundError when absent (None with ``missing_ok``).
        """
        url = f"{self.repo_url}/manifests/{quote(target, safe=':')}"
        with self.request("GET", url, headers={"Accept": ", ".join(accept)}, stream=True) as r:
            if r.status_code == 404 and missing_ok:
                return None
            self.check(r, f"the manifest {target}",
                        missing=f"{self.ref.name}:{target} is not in the registry"
                        if not target.startswith("sha256:")
                        else f"{self.ref.name}@{target} is not in the registry")
            body = self.read_capped(r, MANIFEST_MAX_BYTES, f"the manifest {target}")
            media = r.headers.get("Content-Type", "").split(";")[0].strip()
            said = r.headers.get("Docker-Content-Digest")
        digest = sha256_bytes(body)
        if target.startswith("sha256:") and digest != target:
            raise DigestMismatchError(f"{self.ref.name}@{target}: the registry sent a manifest "
                                      f"whose digest is {digest}")
        if said and said.startswith("sha256:") and said != digest:
            raise DigestMismatchError(f"{self.ref.name}:{target}: the registry says the "
                                      f"manifest is {said}, its bytes are {digest}")
        return body, digest, media

    def put_manifest(self, target: str, body: bytes, media_type: str) -> tuple[str, Any]:
        """Store ``body`` under ``target`` (a tag, or its own digest); its digest, checked
        against the registry's answer, and the response headers."""
        digest = sha256_bytes(body)
        url = f"{self.repo_url}/manifests/{quote(target, safe=':')}"
        with self.request("PUT", url, headers={"Content-Type": media_type}, data=body) as r:
            self.check(r, f"storing the manifest {target}")
            said = r.headers.get("Docker-Content-Digest")
            if said and said != digest:
                raise DigestMismatchError(f"{self.ref.name}: the registry stored the manifest "
                                          f"as {said}, its bytes are {digest}")
            return digest, r.headers

    # -------------------------------------------------------------------------------- blobs
    def has_blob(self, digest: str) -> bool:
        """Whether the repository holds the blob ``digest``."""
        with self.request("HEAD", f"{self.repo_url}/blobs/{digest}") as r:
            if r.status_code == 404:
                return False
            self.check(r, f"looking up the blob {digest}")
            return True

    def upload_blob(self, source: Path | bytes, digest: str, size: int) -> None:
        """Upload a blob (a file, streamed, or bytes) in one PUT of an upload session."""
        with self.request("POST", f"{self.repo_url}/blobs/uploads/",
                          headers={"Content-Length": "0"}) as r:
            self.check(r, "starting an upload")
            location = r.headers.get("Location", "")
        url = urljoin(self.base + "/", location)
        if not location or urlsplit(url)[:2] != urlsplit(self.base)[:2]:
            raise RegistryError(f"{self.ref.registry} gave an upload location on another "
                                f"host ({location[:80]!r}); not followed")
        url += ("&" if "?" in url else "?") + "digest=" + quote(digest, safe="")
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with contextlib.ExitStack() as stack:
            body: BinaryIO | bytes = source if isinstance(source, bytes) else stack.enter_context(
                open(source, "rb"))
            with self.request("PUT", url, headers=headers, data=body, expect=size) as r:
                self.check(r, f"the upload of {digest}")
                said = r.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise DigestMismatchError(f"{self.ref.registry} stored the blob {digest} as {said}")

    @contextlib.contextmanager
    def _blob(self, digest: str, what: str, size: int) -> Iterator[Any]:
        with self.request("GET", f"{self.repo_url}/blobs/{digest}", stream=True,
                          expect=size) as r:
            self.check(r, f"the download of {what}",
                        missing=f"{self.ref.name}: {what} ({digest}) is missing from the registry")
            yield r

    def blob_bytes(self, digest: str, size: int, what: str) -> bytes:
        """A small blob, read whole; its size and sha256 checked."""
        with self._blob(digest, what, size) as r:
            data = self.read_capped(r, size, what)
        _match(self.ref, what, digest, size, sha256_bytes(data), len(data))
        return data

    def download_blob(self, digest: str, size: int, dest: Path, what: str,
                      algorithms: Sequence[str] = ()) -> dict[str, str]:
        """Stream a blob into the new file ``dest`` through sha256 (no byte past ``size`` is
        written; fsynced); DigestMismatchError when its size or digest differ. Returns the
        digest by algorithm (each of ``algorithms``, see :func:`dossier.hashing.new_hasher`) of
        the bytes written, from the same stream: the file is not read again to be checked.
        The caller removes ``dest`` on failure."""
        h = hashlib.sha256()
        more = {a: new_hasher(a) for a in algorithms}
        n = 0
        with self._blob(digest, what, size) as r, open(dest, "xb") as f:
            try:
                for chunk in stream_body(r, f"{self.ref.registry}: {what}", CHUNK):
                    n += len(chunk)
                    if n > size:
                        break
                    h.update(chunk)
                    for m in more.values():
                        m.update(memoryview(chunk))
                    f.write(chunk)
            except OSError as exc:
                raise output_error(exc, dest.parent, f"pulling {what}", f"write {dest}") from exc
            f.flush()
            os.fsync(f.fileno())
        _match(self.ref, what, digest, size, "sha256:" + h.hexdigest(), n)
        return {a: m.hexdigest() for a, m in more.items()}

    def read_capped(self, r: Any, cap: int, what: str) -> bytes:
        """The body of the streamed response ``r``, refused (DigestMismatchError) past
        ``cap`` bytes, within the response's deadline."""
        out = bytearray()
        for chunk in stream_body(r, f"{self.ref.registry}: {what}", CHUNK):
            out += chunk
            if len(out) > cap:
                raise DigestMismatchError(f"{self.ref.name}: {what} is larger than "
                                          f"{cap} bytes; refused")
        return bytes(out)


def connect(ref: Reference, *, insecure: bool = False) -> RegistryClient:
    """A client for ``ref``'s repository, its version check passed and credentials accepted."""
    return RegistryClient(ref, insecure=insecure).connect()


def _match(ref: Reference, what: str, digest: str, size: int, got: str, got_size: int) -> None:
    if got_size != size:
        raise DigestMismatchError(f"{ref.name}: {what} is {'more than ' if got_size > size else ''}"
                                  f"{got_size} bytes, its descriptor says {size}")
    if got != digest:
        raise DigestMismatchError(f"{ref.name}: {what} has digest {got}, its descriptor says "
                                  f"{digest}")


def _oci_error(r: Any) -> str:
    """``: CODE message`` of an OCI error body, if it has one; at most
    :data:`ERROR_BODY_MAX_BYTES` of it are read."""
    try:
        body = (r.content if getattr(r, "_content_consumed", False)
                else read_body(r, ERROR_BODY_MAX_BYTES, "an error body", refuse=False,
                               decode=True))
        if len(body) >= ERROR_BODY_MAX_BYTES:
            return ""
        first = json.loads(body)["errors"][0]
        return f": {first.get('code', '')} {first.get('message', '')}".rstrip()[:200]
    except Exception:  # noqa: BLE001 - any body that is not an OCI error body
        return ""


def _reason(exc: BaseException) -> str:
    """The innermost cause of a requests/urllib3 error, in a few words."""
    text = str(exc)
    m = re.search(r"\[SSL: [A-Z_]+\] ([^(]+)", text) or re.search(r"\[Errno -?\d+\] ([^'\")]+)",
                                                                  text)
    if m:
        return m.group(1).strip()
    for key in ("Connection refused", "Connection reset", "timed out", "Connection aborted",
                "IncompleteRead", "Remote end closed connection"):
        if key.lower() in text.lower():
            return key
    return type(exc).__name__


__all__ = ["MANIFEST_MAX_BYTES", "OCI_INDEX", "OCI_MANIFEST", "PASSWORD_ENV", "USERNAME_ENV",
           "RegistryClient", "connect", "docker_config_path", "read_docker_config",
           "sha256_bytes", "sha256_file"]
