"""A hostile registry, and crafted artifacts in a real one: pull, push and verify REF never write
outside their target, never reuse a planted cache entry, never hang and never read a body
whole; a foreign or malformed signature referrer (anyone with push access can add one) is a
warning, a refusal only under --require-signature.

Pull, push and verify REF run against a real registry (Debian's ``docker-registry`` on
127.0.0.1, as in test_registry.py) where a real registry's behaviour is the point; what a real
registry would never do (trickle bytes, send a gigabyte, redirect elsewhere) comes from a
server of the tests' own on 127.0.0.1 (conftest's ``hostile``), with the client's deadline
shortened so that each case takes seconds. Every case here failed before its fix (a traceback,
a hang, a file outside its folder, gigabytes of memory); the docstrings say what happened.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bundles as h
import pytest
from _hostile import ESCAPES, Hostile, _craft, _everything, _ok_version, _pair, _release, _within
from conftest import isolate_registry
from test_registry import REGISTRY_BIN

import dossier
from dossier.errors import ExitCode, RegistryError

needs_registry = pytest.mark.skipif(not os.access(REGISTRY_BIN, os.X_OK),
                                    reason="docker-registry is not installed (Debian package "
                                    "docker-registry)")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
TITLE = "org.opencontainers.image.title"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_registry(monkeypatch, tmp_path)


# ----------------------------------------------------------------------- the real registry
_REPOS = iter(range(10_000))


def _ref(registry: Any, tag: str = "1") -> str:
    return f"{registry.addr}/hostile/convnet-{next(_REPOS)}:{tag}"


def _http(registry: Any, method: str, path: str, data: bytes = b"",
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    url = path if path.startswith("http") else f"http://{registry.addr}{path}"
    req = urllib.request.Request(url, data=data if method in ("PUT", "POST") else None,
                                 method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _upload(registry: Any, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    status, headers, _ = _http(registry, "POST", f"/v2/{repo}/blobs/uploads/")
    assert status == 202, status
    location = headers["Location"]
    if not location.startswith("http"):
        location = f"http://{registry.addr}{location}"
    sep = "&" if "?" in location else "?"
    status, _, body = _http(registry, "PUT", f"{location}{sep}digest={digest}", data,
                            {"Content-Type": "application/octet-stream"})
    assert status == 201, (status, body)
    return digest


def _raw_push(registry: Any, ref: str, bundle: Path) -> tuple[str, int]:
    """Push ``bundle`` as a dossier artifact with plain HTTP, no check of dossier's: what an
    attacker with push access can store. The manifest's digest and size."""
    from dossier.registry import ARTIFACT_TYPE, CONFIG_TYPE, LAYER_TYPE

    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    config = (bundle / "manifest.json").read_bytes()
    layers = []
    for f in json.loads(config)["files"]:
        data = (bundle / f["path"]).read_bytes()
        layers.append({"mediaType": LAYER_TYPE, "digest": _upload(registry, repo, data),
                       "size": len(data), "annotations": {TITLE: f["path"]}})
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "artifactType": ARTIFACT_TYPE,
                       "config": {"mediaType": CONFIG_TYPE,
                                  "digest": _upload(registry, repo, config),
                                  "size": len(config)},
                       "layers": layers}).encode()
    status, _, answer = _http(registry, "PUT", f"/v2/{repo}/manifests/{tag}", body,
                              {"Content-Type": OCI_MANIFEST})
    assert status == 201, (status, answer)
    return "sha256:" + hashlib.sha256(body).hexdigest(), len(body)


# ----------------------------------------------------------- names from a crafted artifact
@needs_registry
@pytest.mark.parametrize("release", ESCAPES[:2])
def test_pull_of_a_crafted_artifact_writes_nothing_outside_out(registry: Any, bundle: Path,
                                                               tmp_path: Path,
                                                               release: str) -> None:
    """Before: pull renamed the bundle outside --out, exited 0, and --out stayed empty."""
    _craft(bundle, _release(release.format(tmp=tmp_path / "w")))
    ref = _ref(registry)
    _raw_push(registry, ref, bundle)
    work = tmp_path / "w"
    (work / "a" / "b").mkdir(parents=True)
    res = h.cli("pull", ref, "--out", work / "a" / "b" / "out", "--insecure")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert _everything(work) <= {"a", "a/b", "a/b/out"}


@needs_registry
@pytest.mark.parametrize("require", [False, True], ids=["plain", "--require-signature"])
def test_verify_ref_of_a_crafted_artifact_writes_nothing_outside_the_cache(
        registry: Any, bundle: Path, tmp_path: Path, require: bool) -> None:
    """Before: verify REF wrote the bundle outside its cache; with --require-signature it wrote
    first and refused (exit 13) afterwards."""
    from dossier.trust.signing import generate_key_pair

    _craft(bundle, _release("../../escaped"))
    ref = _ref(registry)
    _raw_push(registry, ref, bundle)
    key = tmp_path / "keys" / "k"
    generate_key_pair(key)
    before = _everything(tmp_path)
    extra = ["--require-signature", "--trusted-key", str(key) + ".pub"] if require else []
    res = h.cli("verify", ref, "--insecure", "--integrity-only", *extra)
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert not [p for p in _everything(tmp_path) - before if "escaped" in p]
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.suffix == ".dossier"]


@needs_registry
def test_push_refuses_a_crafted_bundle(registry: Any, bundle: Path) -> None:
    """Before: push accepted a bundle whose release is ``../../escaped``."""
    _craft(bundle, _release("../../escaped"))
    ref = _ref(registry)
    res = h.cli("push", bundle, ref, "--insecure")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    repo = ref.split("/", 1)[1].rsplit(":", 1)[0]
    assert registry.get(f"{repo}/tags/list")[0] == 404


# ---------------------------------------------------------------------- the registry cache
def _other_bundle(tmp_path: Path) -> Path:
    """Another intact bundle of the same name and version (another description: another id)."""
    other = h.copy_bundle(h.GOLDEN, tmp_path / "other")
    return _craft(other, lambda raw: raw.update(description="not the artifact pushed"))


def _cached_entry(tmp_path: Path) -> Path:
    (entry,) = (tmp_path / "cache").glob("sha256-*")
    return entry


@needs_registry
def test_a_swapped_cached_bundle_is_not_reused(registry: Any, bundle: Path,
                                               tmp_path: Path) -> None:
    """Before: an unsigned artifact's cached copy swapped for another intact bundle verified
    VALID under the other bundle's id."""
    from dossier.bundle import read_bundle
    from dossier.registry import fetch_bundle

    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    first = fetch_bundle(ref, insecure=True)
    other = _other_bundle(tmp_path)
    shutil.rmtree(first.path)
    shutil.copytree(other, first.path)
    assert read_bundle(first.path).manifest.dossier_id != first.dossier_id
    again = fetch_bundle(ref, insecure=True)
    assert not again.cached and again.dossier_id == first.dossier_id
    assert read_bundle(again.path).manifest.dossier_id == first.dossier_id


@needs_registry
def test_a_cache_entry_linked_elsewhere_is_not_used(registry: Any, bundle: Path,
                                                    tmp_path: Path) -> None:
    from dossier.registry import fetch_bundle

    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    first = fetch_bundle(ref, insecure=True)
    entry = _cached_entry(tmp_path)
    planted = tmp_path / "planted"
    shutil.move(entry, planted)
    os.chmod(planted, 0o777)
    entry.symlink_to(planted)
    before = h.snapshot(planted)
    again = fetch_bundle(ref, insecure=True)
    assert not again.cached and again.dossier_id == first.dossier_id
    assert not entry.is_symlink() and h.snapshot(planted) == before


@needs_registry
def test_a_cache_folder_others_may_write_is_refused(registry: Any, bundle: Path,
                                                    tmp_path: Path) -> None:
    """Before: the registry cache had no owner or mode check (the build cache had one)."""
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    (tmp_path / "cache").mkdir()
    os.chmod(tmp_path / "cache", 0o777)
    res = h.cli("verify", ref, "--insecure", "--integrity-only")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "may be written by others" in h.said(res)
    assert not list((tmp_path / "cache").iterdir())


# --------------------------------------------------------------------- signature referrers
def _malformed_referrer(registry: Any, ref: str) -> None:
    """Add a signature referrer that is no signature (the artifact's own manifest) under the
    referrers tag schema's index: what anyone with push access can do."""
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    status, headers, body = _http(registry, "GET", f"/v2/{repo}/manifests/{tag}",
                                  headers={"Accept": OCI_MANIFEST})
    digest = headers["Docker-Content-Digest"]
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(body),
         "artifactType": "application/vnd.dossier.signature.v1+json"}]}).encode()
    status, _, answer = _http(registry, "PUT", f"/v2/{repo}/manifests/{digest.replace(':', '-')}",
                              index, {"Content-Type": OCI_INDEX})
    assert status == 201, (status, answer)


@needs_registry
def test_a_malformed_referrer_is_a_warning_without_require_signature(registry: Any,
                                                                     bundle: Path) -> None:
    """Before: a malformed signature referrer failed verify REF (exit 13) even without
    --require-signature: anyone with push access broke verification for everyone."""
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    _malformed_referrer(registry, ref)
    res = h.cli("verify", ref, "--insecure", "--integrity-only")
    assert res.exit_code == 0, h.said(res)
    assert "warning: " in res.stderr and "is not a dossier signature referrer" in h.said(res)
    assert "0 signature referrer(s)" in res.stderr


@needs_registry
def test_a_malformed_referrer_is_refused_with_require_signature(registry: Any, bundle: Path,
                                                                tmp_path: Path) -> None:
    from dossier.trust.signing import generate_key_pair

    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    _malformed_referrer(registry, ref)
    generate_key_pair(tmp_path / "k")
    res = h.cli("verify", ref, "--insecure", "--integrity-only", "--require-signature",
                "--trusted-key", tmp_path / "k.pub")
    assert res.exit_code == ExitCode.SIGNATURE, h.said(res)
    assert "is not a dossier signature referrer" in h.said(res)


def _client(ref: str) -> Any:
    from dossier.registry.client import connect
    from dossier.registry.reference import parse_reference

    return connect(parse_reference(ref), insecure=True)


def _digest(registry: Any, ref: str) -> tuple[str, int]:
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    _, headers, body = _http(registry, "GET", f"/v2/{repo}/manifests/{tag}",
                             headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    return headers["Docker-Content-Digest"], len(body)


def _foreign_signature(tmp_path: Path, registry: Any, ref: str) -> None:
    """Another bundle's valid signature attached as a referrer of ``ref``."""
    from dossier.registry.referrers import attach_signature
    from dossier.trust.signing import generate_key_pair, sign_bundle

    other = h.copy_bundle(h.GOLDEN, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["release_version"] = manifest.get("release_version", 1)
    (other / "knobs.json").write_text((other / "knobs.json").read_text() + " ")
    h.reseal(other)
    keys = generate_key_pair(tmp_path / "foreign-keys")
    signed = sign_bundle(other, keys.private)
    digest, size = _digest(registry, ref)
    attach_signature(_client(ref), digest, size, Path(signed.signature))


def _not_an_envelope(tmp_path: Path, registry: Any, ref: str) -> None:
    from dossier.registry.referrers import attach_signature

    junk = tmp_path / "junk.sig.json"
    if not junk.exists():
        junk.write_text('{"not": "a DSSE envelope"}')
    digest, size = _digest(registry, ref)
    attach_signature(_client(ref), digest, size, junk)


def _wrong_subject(tmp_path: Path, registry: Any, ref: str) -> None:
    """Listed under ``ref``'s referrers index: a signature referrer whose subject is another
    artifact (pushed to another tag)."""
    from dossier.registry.referrers import attach_signature

    repo = ref.split("/", 1)[1].rsplit(":", 1)[0]
    other_ref = ref.rsplit(":", 1)[0] + ":other"
    other = h.copy_bundle(h.GOLDEN, tmp_path / "other")
    (other / "knobs.json").write_text((other / "knobs.json").read_text() + " ")
    h.reseal(other)
    assert h.cli("push", other, other_ref, "--insecure").exit_code == 0
    junk = tmp_path / "junk.sig.json"
    junk.write_text('{"not": "a DSSE envelope"}')
    other_digest, other_size = _digest(registry, other_ref)
    referrer = attach_signature(_client(other_ref), other_digest, other_size, junk)
    _, headers, body = _http(registry, "GET", f"/v2/{repo}/manifests/{referrer}",
                             headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    digest, _ = _digest(registry, ref)
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                       "digest": referrer, "size": len(body),
                                       "artifactType": "application/vnd.dossier.signature.v1+json"}
                                      ]}).encode()
    status, _, answer = _http(registry, "PUT", f"/v2/{repo}/manifests/{digest.replace(':', '-')}",
                              index, {"Content-Type": "application/vnd.oci.image.index.v1+json"})
    assert status == 201, (status, answer)


def _too_many(tmp_path: Path, registry: Any, ref: str) -> None:
    """More referrers listed than are read (the cap lowered to 1 by the test; two listed)."""
    _not_an_envelope(tmp_path, registry, ref)
    (tmp_path / "junk.sig.json").write_text('{"still": "not an envelope"}')
    _not_an_envelope(tmp_path, registry, ref)


REFERRERS = {"another bundle's signature": _foreign_signature,
             "not a DSSE envelope": _not_an_envelope, "a wrong subject": _wrong_subject,
             "more listed than read": _too_many}


@needs_registry
@pytest.mark.parametrize("plant", list(REFERRERS), ids=list(REFERRERS))
def test_a_foreign_or_malformed_referrer_is_one_warning_everywhere(
        registry: Any, bundle: Path, host: Path, tmp_path: Path, plant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: another bundle's signature, or an envelope blob that is not one, failed verify
    REF, run REF and load(REF) (exit 13) without --require-signature; pull failed (exit 13)
    on what verify REF reported as a warning (a wrong subject)."""
    import dossier.registry.referrers as referrers

    if plant == "more listed than read":
        monkeypatch.setattr(referrers, "MAX_REFERRERS", 1)
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    REFERRERS[plant](tmp_path, registry, ref)
    res = h.cli("verify", ref, "--insecure", "--host-fingerprint", host)
    assert res.exit_code == 0, h.said(res)
    assert "warning: " in res.stderr
    if plant == "more listed than read":
        assert "only the first 1 were read" in res.stderr
    res = h.cli("pull", ref, "--insecure", "--out", tmp_path / "pulled")
    assert res.exit_code == 0, h.said(res)
    assert "warning: " in res.stderr and not list((tmp_path / "pulled").glob("*.sig.json"))
    engine = dossier.load(ref, host=host, insecure=True)
    pair = _pair(bundle)
    assert engine(pair.inputs)["logits"].shape == pair.references["logits"].shape
    res = h.cli("run", ref, "--insecure", "--host-fingerprint", host)
    assert res.exit_code == 0, h.said(res)


# ---------------------------------------------------------------------- a hostile registry
@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> float:
    """The registry client's whole-response deadline, 1.5 s."""
    try:
        from dossier.registry import transport
    except ImportError:  # a client without one: the tests' own timeout catches the hang
        return 1.5
    monkeypatch.setattr(transport, "DEADLINE_S", 1.5)
    return 1.5


def _trickle(handler: Any, stop: threading.Event, headers_too: bool = False) -> None:
    if headers_too:
        for byte in b"HTTP/1.1 200 OK\r\n":
            if stop.wait(0.3):
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
        return
    handler.send_response(200)
    handler.send_header("Content-Type", OCI_MANIFEST)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    while not stop.wait(0.3):
        handler.wfile.write(b" ")
        handler.wfile.flush()


@pytest.mark.parametrize("where", ["GET /v2/", "the manifest", "the status line"])
def test_a_trickling_registry_fails_within_the_deadline(hostile: Any, short_deadline: float,
                                                        tmp_path: Path, where: str) -> None:
    """Before: one byte every few seconds kept pull waiting forever (130 s and counting): the
    timeouts applied per read."""
    pytest.importorskip("oras")
    from dossier.registry import pull_bundle

    holder: dict[str, Hostile] = {}

    def behave(handler: Any) -> None:
        stop = holder["s"].stop
        if where == "the status line":
            _trickle(handler, stop, headers_too=True)
        elif where == "GET /v2/" or not _ok_version(handler):
            _trickle(handler, stop)

    holder["s"] = server = hostile(behave)
    t0 = time.monotonic()
    exc = _within(20, lambda: pull_bundle(f"127.0.0.1:{server.port}/ml/x:1", tmp_path / "out",
                                          insecure=True))
    assert isinstance(exc, RegistryError) and "took longer than" in str(exc), exc
    assert time.monotonic() - t0 < short_deadline + 8
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


GIB = 1 << 30


def _rss() -> int:
    """This process's resident memory now, in bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_growth(fn: Callable[[], Any]) -> tuple[int, Any]:
    """How far this process's resident memory rose above its start while ``fn`` ran (sampled
    every 5 ms), and what ``fn`` returned."""
    done = threading.Event()
    base = _rss()
    peak = [base]

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        got = fn()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], _rss()) - base, got


def _huge(status: int, content_type: str = "application/json") -> Callable[[Any], None]:
    def send(handler: Any) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(GIB))
        handler.end_headers()
        chunk = b"x" * (1 << 20)
        for _ in range(GIB // len(chunk)):
            handler.wfile.write(chunk)
    return send


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("case", ["GET /v2/ body", "error body of the version check",
                                  "error body of the manifest"])
def test_a_huge_body_is_refused_without_reading_it(hostile: Any, tmp_path: Path,
                                                   case: str) -> None:
    """Before: the version check's body and every error body were read whole: a 1 GiB body took
    the process to 2.1 GB of memory."""
    pytest.importorskip("oras")
    from dossier.registry import pull_bundle

    def behave(handler: Any) -> None:
        if case == "GET /v2/ body":
            _huge(200)(handler)
        elif case == "error body of the version check":
            _huge(500)(handler)
        elif not _ok_version(handler):
            _huge(500)(handler)

    server = hostile(behave)
    grown, exc = _peak_growth(lambda: _within(60, lambda: pull_bundle(
        f"127.0.0.1:{server.port}/ml/x:1", tmp_path / "out", insecure=True)))
    assert isinstance(exc, RegistryError), exc
    assert grown < 100 << 20, f"memory grew by {grown >> 20} MiB"


def _bearer_registry(token_body: bytes) -> Callable[[Any], None]:
    """A registry that asks for a bearer token from its own /token, which answers
    ``token_body`` gzip-encoded; with the token, the version check passes and the manifest is
    not there."""
    def behave(handler: Any) -> None:
        port = handler.server.server_address[1]
        if handler.path.startswith("/token"):
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Encoding", "gzip")
            handler.send_header("Content-Length", str(len(token_body)))
            handler.end_headers()
            handler.wfile.write(token_body)
        elif handler.headers.get("Authorization") != "Bearer t0ken":
            handler.send_response(401)
            handler.send_header("Www-Authenticate", f'Bearer realm="http://127.0.0.1:{port}'
                                f'/token",service="hostile",scope="repository:ml/x:pull"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        elif not _ok_version(handler):
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
    return behave


def _gzip_zeros(mib: int) -> bytes:
    import zlib

    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip framing
    zeros = bytes(1 << 20)
    return b"".join([*(z.compress(zeros) for _ in range(mib)), z.flush()])


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_a_gzip_bomb_from_the_token_service_is_refused(hostile: Any, tmp_path: Path) -> None:
    """A token service's answer is read whole: capped after its gzip is undone (before: 256 MiB
    of zeros from 250 KiB of gzip went whole into memory)."""
    pytest.importorskip("oras")
    from dossier.errors import RegistryAuthError
    from dossier.registry import pull_bundle

    server = hostile(_bearer_registry(_gzip_zeros(256)))
    grown, exc = _peak_growth(lambda: _within(60, lambda: pull_bundle(
        f"127.0.0.1:{server.port}/ml/x:1", tmp_path / "out", insecure=True)))
    assert isinstance(exc, RegistryAuthError) and "token service" in str(exc), exc
    assert grown < 100 << 20, f"memory grew by {grown >> 20} MiB"


def test_a_gzipped_token_is_still_read(hostile: Any, tmp_path: Path) -> None:
    """Guard: the cap undoes the Content-Encoding, as requests did (the token is used)."""
    pytest.importorskip("oras")
    from dossier.errors import NotFoundError
    from dossier.registry import pull_bundle

    server = hostile(_bearer_registry(gzip.compress(b'{"token": "t0ken"}')))
    with pytest.raises(NotFoundError):
        pull_bundle(f"127.0.0.1:{server.port}/ml/x:1", tmp_path / "out", insecure=True)
    assert any(p.startswith("/token") for p in server.paths)


def test_a_redirect_to_another_host_is_not_followed(hostile: Any, tmp_path: Path) -> None:
    """Before: redirects were followed to any host over plain HTTP, also with --insecure (meant
    for loopback only)."""
    pytest.importorskip("oras")
    from dossier.registry import pull_bundle

    elsewhere = hostile(lambda handler: _ok_version(handler) or _huge(404)(handler))

    def behave(handler: Any) -> None:
        if not _ok_version(handler):
            handler.send_response(302)
            handler.send_header("Location", f"http://localhost:{elsewhere.port}{handler.path}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()

    server = hostile(behave)
    exc = _within(20, lambda: pull_bundle(f"127.0.0.1:{server.port}/ml/x:1", tmp_path / "out",
                                          insecure=True))
    assert isinstance(exc, RegistryError) and "another host" in str(exc), exc
    assert elsewhere.paths == []


def test_a_redirect_within_the_registry_is_followed(hostile: Any) -> None:
    pytest.importorskip("oras")
    from dossier.registry.client import connect
    from dossier.registry.reference import parse_reference

    def behave(handler: Any) -> None:
        if handler.path == "/v2/":
            handler.send_response(307)
            handler.send_header("Location", "/v2/?here")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        else:
            handler.send_response(200)
            handler.send_header("Content-Length", "2")
            handler.end_headers()
            handler.wfile.write(b"{}")

    server = hostile(behave)
    connect(parse_reference(f"127.0.0.1:{server.port}/ml/x:1"), insecure=True)
    assert server.paths == ["/v2/", "/v2/?here"]


@pytest.mark.parametrize("location", ["http://registry.example.com/v2/ml/x/manifests/1",
                                      "https://elsewhere.example.com/v2/ml/x/manifests/1",
                                      "ftp://registry.example.com/x"])
def test_a_redirect_down_to_http_or_elsewhere_is_refused(location: str) -> None:
    """From an HTTPS registry: never to plain HTTP (a downgrade), never to another host."""
    pytest.importorskip("oras")
    from dossier.registry.client import RegistryClient
    from dossier.registry.reference import parse_reference

    client = RegistryClient(parse_reference("registry.example.com/ml/x:1"))
    with pytest.raises(RegistryError, match="not followed"):
        client._redirect("https://registry.example.com/v2/ml/x/manifests/1", location)

