"""Hostile input: a crafted bundle, a hostile registry, a planted build cache, crafted
validation data and spec numbers must never write outside their target, hang, or exhaust
memory.

Pull, push and verify REF run against a real registry (Debian's ``docker-registry`` on
127.0.0.1, as in test_registry.py) where a real registry's behaviour is the point; what a real
registry would never do (trickle bytes, send a gigabyte, redirect elsewhere) comes from a
server of this file's own on 127.0.0.1, with the client's deadline shortened so that each case
takes seconds. Every case here failed before its fix (a traceback, a hang, a file outside its
folder, gigabytes of memory); the docstrings say what happened.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import stat
import threading
import time
import tracemalloc
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_bundle_helpers as h
from conftest import isolate_registry

from dossier.bundle.manifest import body_digest
from dossier.errors import ExitCode, RegistryError, SpecError, ValidationSetError

REGISTRY_BIN = Path("/usr/bin/docker-registry")
needs_registry = pytest.mark.skipif(not os.access(REGISTRY_BIN, os.X_OK),
                                    reason="docker-registry is not installed (Debian package "
                                    "docker-registry)")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
TITLE = "org.opencontainers.image.title"
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"]
HOSTILE_TEXT = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b2J\r"


def _no_controls(text: str) -> bool:
    return not any(c in text for c in CONTROLS)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_registry(monkeypatch, tmp_path)



def _craft(bundle: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Edit ``bundle``'s manifest.json as JSON and seal it again (a new dossier id), the way an
    attacker who knows the format would: the bundle stays intact by its own checks."""
    raw = json.loads((bundle / "manifest.json").read_bytes())
    edit(raw)
    raw["dossier_id"] = body_digest(raw)
    (bundle / "manifest.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return bundle


def _release(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        raw["release"] = name
    return edit


def _everything(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


ESCAPES = ["../../escaped", "{tmp}/abs-escaped", "a/../../escaped", "escaped\n\x1b[2J"]
"""Crafted release names; ``{tmp}`` stands for the test's own temporary folder (absolute)."""


# ------------------------------------------------------------------------ names (1): local
@pytest.mark.parametrize("release", ESCAPES)
def test_pack_refuses_a_crafted_release_name(bundle: Path, tmp_path: Path, release: str) -> None:
    """Before: pack wrote ``escaped-1.dossier.tar`` outside --out, its members absolute."""
    _craft(bundle, _release(release.format(tmp=tmp_path)))
    before = _everything(tmp_path)
    res = h.cli("pack", bundle, "--out", tmp_path / "out" / "deep")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert "release" in h.said(res) and res.stderr.count("\n") == 1
    assert _everything(tmp_path) - before <= {"out", "out/deep"}


@pytest.mark.parametrize("edit", [
    _release("../../escaped"),
    lambda raw: raw["model"].update(file_name="../../../../model.onnx"),
], ids=["release ../../escaped", "model.file_name ../../../../model.onnx"])
def test_retune_refuses_a_crafted_name(bundle: Path, tmp_path: Path,
                                       edit: Callable[[dict[str, Any]], None]) -> None:
    """Before: retune put its run folder outside --out, or loaded a model from elsewhere on the
    host through ``model.file_name``."""
    _craft(bundle, edit)
    before = _everything(tmp_path)
    res = h.cli("retune", bundle, "--out", tmp_path / "a" / "b" / "out", "--quiet")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert _everything(tmp_path) == before


def test_a_release_name_with_control_characters_is_refused(bundle: Path) -> None:
    """Before: a release name with a newline and ESC became a folder name."""
    _craft(bundle, _release("convnet\n\x1b[2J"))
    res = h.cli("inspect", bundle)
    assert res.exit_code == ExitCode.BUNDLE and "release" in h.said(res)
    assert _no_controls(res.stderr + res.stdout)


def test_inside_follows_links_before_it_judges(tmp_path: Path) -> None:
    from dossier.errors import BundleFormatError
    from dossier.names import inside

    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(tmp_path / "elsewhere")
    assert inside(out, out / "a.dossier", "x") == out / "a.dossier"
    for target in (out / "link" / "a.dossier", out / ".." / "a.dossier", out):
        with pytest.raises(BundleFormatError, match="outside"):
            inside(out, target, "x")


# --------------------------------------------------------------------- the real registry
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


# --------------------------------------------------------------------- names (1): registry
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


# ------------------------------------------------------------------- registry cache (2)
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


# ------------------------------------------------------------ referrer policy (10, last)
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


# ------------------------------------------------------------------- a hostile registry
class Hostile:
    """An HTTP server on 127.0.0.1 whose every request is answered by ``behave(handler)``;
    it records the paths asked for."""

    def __init__(self, behave: Callable[[Any], None]) -> None:
        self.paths: list[str] = []
        self.stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.paths.append(self.path)
                try:
                    behave(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_HEAD = do_POST = do_PUT = _any

            def log_message(self, *args: Any) -> None:
                pass

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up on purpose

        self.server = Quiet(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile() -> Iterator[Callable[[Callable[[Any], None]], Hostile]]:
    servers: list[Hostile] = []

    def make(behave: Callable[[Any], None]) -> Hostile:
        servers.append(Hostile(behave))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> float:
    """The registry client's whole-response deadline, 1.5 s."""
    try:
        from dossier.registry import transport
    except ImportError:  # a client without one: the tests' own timeout catches the hang
        return 1.5
    monkeypatch.setattr(transport, "DEADLINE_S", 1.5)
    return 1.5


def _within(seconds: float, fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` in a thread; the exception it raised (None if none). Fails the test when it
    has not returned after ``seconds`` (it hangs)."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"still waiting after {seconds} s: it hangs"
    return box[0]


def _ok_version(handler: Any) -> bool:
    if handler.path == "/v2/":
        handler.send_response(200)
        handler.send_header("Content-Length", "2")
        handler.end_headers()
        handler.wfile.write(b"{}")
        return True
    return False


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


# ---------------------------------------------------------------- terminal sequences (6)
@pytest.fixture
def hostile_text_bundle(bundle: Path) -> Path:
    def edit(raw: dict[str, Any]) -> None:
        raw["description"] = "release notes " + HOSTILE_TEXT
        raw["warnings"] = ["careful " + HOSTILE_TEXT]
        raw["tuning_host"]["hostname"] = "vm" + HOSTILE_TEXT
    return _craft(bundle, edit)


def test_inspect_escapes_terminal_sequences(hostile_text_bundle: Path) -> None:
    """Before: a set-title sequence, clear-screen and colours from the manifest were printed
    raw."""
    res = h.cli("inspect", hostile_text_bundle)
    assert res.exit_code == 0, h.said(res)
    assert "release notes \\x1b]0;pwned\\x07" in res.stdout
    assert _no_controls(res.stdout) and _no_controls(res.stderr)


def test_diff_escapes_terminal_sequences(hostile_text_bundle: Path) -> None:
    res = h.cli("diff", h.GOLDEN, hostile_text_bundle)
    assert res.exit_code == 0, h.said(res)
    assert "\\x1b" in res.stdout
    assert _no_controls(res.stdout) and _no_controls(res.stderr)


@pytest.mark.parametrize("command", ["pull", "verify"])
def test_pull_and_verify_ref_escape_a_registrys_error_message(hostile: Any, tmp_path: Path,
                                                              command: str) -> None:
    """The registry's own words (an OCI error message) reach the terminal escaped, C1 controls
    (a one-character CSI) included."""
    pytest.importorskip("oras")
    body = json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN",
                                   "message": "gone " + HOSTILE_TEXT}]}).encode()

    def behave(handler: Any) -> None:
        if not _ok_version(handler):
            handler.send_response(404)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)

    server = hostile(behave)
    ref = f"127.0.0.1:{server.port}/ml/x:1"
    args = ["pull", ref, "--out", tmp_path / "out"] if command == "pull" else ["verify", ref]
    res = h.cli(*args, "--insecure")
    assert res.exit_code == ExitCode.NOT_FOUND, h.said(res)
    assert "gone" in res.stderr and "\\x9b2J" in res.stderr
    assert _no_controls(res.stdout) and _no_controls(res.stderr)


def test_printable_escapes_every_control_but_tab_and_newline() -> None:
    from dossier_cli.render import printable

    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable(HOSTILE_TEXT) == "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b2J\\x0d"
    assert _no_controls(printable("".join(CONTROLS)))


# ------------------------------------------------------------------------ build cache (7)
def _identity() -> Any:
    from dossier.build_cache import BuildIdentity

    return BuildIdentity(backend="onnxruntime", tuner_version="1", stack={}, host={},
                         model_digest="0" * 32, build_knobs=[], engine_suffix=".ort")


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Any, Any, Path]:
    """A build cache holding one entry: (cache, identity, the entry's folder)."""
    from dossier.build_cache import BuildCache

    cache = BuildCache(tmp_path / "bc")
    engine = tmp_path / "engine.ort"
    engine.write_bytes(b"engine bytes" * 100)
    identity = _identity()
    assert cache.put(identity, engine, 1.0, {})
    assert cache.get(identity, tmp_path / "probe.ort") is not None  # an honest hit
    (tmp_path / "probe.ort").unlink()
    return cache, identity, tmp_path / "bc" / identity.key()


def test_a_world_writable_entry_folder_is_a_miss(stored: tuple[Any, Any, Path],
                                                 tmp_path: Path) -> None:
    """Before: only the top folder was checked; an entry folder anyone may write was a hit."""
    cache, identity, entry = stored
    os.chmod(entry, 0o777)
    assert cache.get(identity, tmp_path / "got.ort") is None
    assert not (tmp_path / "got.ort").exists()


def test_an_entry_folder_linked_outside_is_a_miss(stored: tuple[Any, Any, Path],
                                                  tmp_path: Path) -> None:
    """Before: an entry folder that is a link to a world-writable folder outside was a hit."""
    cache, identity, entry = stored
    outside = tmp_path / "outside"
    shutil.move(entry, outside)
    os.chmod(outside, 0o777)
    entry.symlink_to(outside)
    assert cache.get(identity, tmp_path / "got.ort") is None
    assert not (tmp_path / "got.ort").exists()


@pytest.mark.parametrize("name", ["entry.json", "engine.ort"])
def test_a_fifo_in_the_build_cache_is_a_miss_not_a_hang(stored: tuple[Any, Any, Path],
                                                        tmp_path: Path, name: str) -> None:
    """Before: a FIFO in place of entry.json or the engine hung the search forever: the open
    blocked before the regular-file check."""
    cache, identity, entry = stored
    fifo = entry / name
    fifo.unlink()
    os.mkfifo(fifo)
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(cache.get(identity, tmp_path / "g.ort")),
                         daemon=True)
    t.start()
    t.join(10)
    try:
        assert box == [None], "still blocked on the FIFO after 10 s"
    finally:
        if t.is_alive():  # release the blocked reader
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) or not os.path.lexists(fifo)


# ------------------------------------------------------------------- validation data (8)
PETA_SHAPE = (2**40, 3, 32, 32)


def _npy_header_only(shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _write_npz(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("kind", [".npy", ".npz", "polygraphy"])
def test_a_header_claiming_petabytes_is_refused_before_allocation(tmp_path: Path,
                                                                  kind: str) -> None:
    """Before: a 128-byte file whose header claims (2**40, 3, 32, 32) gave a traceback (exit 70)
    while allocating petabytes."""
    from dossier.references import read_pairs

    data = _npy_header_only(PETA_SHAPE)
    if kind == ".npy":
        path = tmp_path / "a.npy"
        path.write_bytes(data)
    elif kind == ".npz":
        path = _write_npz(tmp_path / "a.npz", {"x.npy": data})
    else:
        path = tmp_path / "inputs.json"
        path.write_text(json.dumps([{"x": {"array": base64.b64encode(data).decode(),
                                           "polygraphy_class": "ndarray"}}]))
    with pytest.raises(ValidationSetError, match=r"1099511627776, 3, 32, 32"):
        read_pairs(path, "x")


def test_a_crafted_npy_gets_one_line_from_the_cli(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_npz(tmp_path / "a.npz", {"x.npy": _npy_header_only(PETA_SHAPE)})
    np.savez(tmp_path / "r.npz", y=np.ones((2, 10), np.float32))
    res = h.cli("validation", "create", "set", "-i", "a.npz", "-r", "r.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert res.stderr.count("\n") == 1 and "needs" in res.stderr
    assert not (tmp_path / "set").exists()


def test_a_zip_bomb_npz_is_refused_before_it_is_unpacked(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a 2.1 MB zip-bomb .npz took 4.2 GB of memory before it was refused. Here a
    64 MiB array of zeros (64 KiB deflated) against a cap lowered to 16 MiB: refused from the
    declared sizes, with almost nothing allocated."""
    from dossier import references

    monkeypatch.setattr(references, "MAX_FILE_BYTES", 16 << 20, raising=False)
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=np.zeros((16, 1024, 1024), np.float32))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ValidationSetError, match="would unpack"):
            references.read_arrays(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_member_smaller_than_its_header_is_refused(tmp_path: Path) -> None:
    from dossier.references import read_arrays

    full = io.BytesIO()
    np.save(full, np.ones((4, 8), np.float32))
    torn = full.getvalue()[:-16]
    path = _write_npz(tmp_path / "a.npz", {"x.npy": torn})
    with pytest.raises(ValidationSetError, match="the data is"):
        read_arrays(path)


def test_an_empty_batch_gets_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a batch of size 0 gave a pyarrow traceback."""
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "a.npz", x=np.ones((0, 3), np.float32))
    np.savez(tmp_path / "r.npz", y=np.ones((0, 10), np.float32))
    res = h.cli("validation", "create", "set", "-i", "a.npz", "-r", "r.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert res.stderr.count("\n") == 1 and "no element" in res.stderr
    assert not (tmp_path / "set").exists()


# ------------------------------------------------------------------------ spec numbers (9)
SPEC = """[release]
name = "x"
[model]
path = "m.onnx"
[validation]
path = "v"
[tune]
selection = "-a=[x|y]"
threshold = 0.1
"""
NUMBERS = {
    "rounds = 2000": ("[timing]\nrounds = 2000", "timing"),
    "rounds = 10**8": ("[timing]\nrounds = 100000000", "timing"),
    "trial_timeout_s = inf": ("[timing]\ntrial_timeout_s = inf", "timing"),
    "warmup_max_s = inf": ("[timing]\nwarmup_max_s = inf", "timing"),
    "min_effect = inf": ("[timing]\nmin_effect = inf", "timing"),
    "confirm_block_s = 1e300": ("[timing]\nconfirm_block_s = 1e300", "timing"),
    "memory limit 2**60 MB": ("[timing]\ntrial_memory_limit_mb = 1152921504606846976", "timing"),
    "samples = 10**12": ("[timing]\nsamples = 1000000000000", "timing"),
    "shape weight inf": ('[[shapes]]\nweight = inf\ninputs = {x = [1, 2]}', "weight"),
    "shape dimension 2**70": ('[[shapes]]\ninputs = {x = [1, 1180591620717411303424]}',
                              "inputs"),
    "shape dimension 0": ('[[shapes]]\ninputs = {x = [0, 2]}', "inputs"),
    "atol = 1e308": ("", "atol"),
    "atol = inf": ("", "atol"),
    "rtol = inf": ("", "rtol"),
    "inferences_per_day = inf": ("[deployment]\ninferences_per_day = inf", "inferences_per_day"),
    "horizon_days = 1e300": ("[deployment]\nhorizon_days = 1e300", "horizon_days"),
    "release version 2**40": ("", "version"),
}


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_spec_numbers_are_bounded(tmp_path: Path, case: str) -> None:
    """Before: rounds = 2000 was an OverflowError traceback, rounds = 1e23 ran for minutes
    computing 2**rounds, inf timeouts, weights and tolerances were accepted (then every trial
    died, or the accuracy check was off), a 2**70 dimension crashed at bundling."""
    from dossier.spec import load_spec

    extra, where = NUMBERS[case]
    text = SPEC
    if case.startswith(("atol", "rtol")):
        text = text.replace("threshold = 0.1", f"threshold = 0.1\n{case}")
    if case.startswith("release version"):
        text = text.replace('name = "x"', 'name = "x"\nversion = 1099511627776')
    (tmp_path / "release.toml").write_text(text + extra + "\n")
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=where):
        load_spec(tmp_path / "release.toml")
    assert time.monotonic() - t0 < 5


def test_a_spec_with_rounds_2000_gets_one_line_even_with_dry_run(samples_dir: Path,
                                                                  tmp_path: Path) -> None:
    spec = h.write_spec(tmp_path / "release.toml", samples_dir / "convnet",
                        timing={**h.SMALL_TIMING, "rounds": 2000})
    res = h.cli("tune", spec, "--out", tmp_path / "run", "--dry-run")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert res.stderr.count("\n") == 1 and "timing.rounds = 2000" in res.stderr


# ------------------------------------------------------------------------------ Ray (10)
@pytest.mark.ray
def test_ray_runs_from_a_folder_holding_a_folder_named_dossier(sample: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Before: --executor ray failed (exit 4) from a folder holding a folder named ``dossier``
    (Ray puts the driver's working directory first on its workers' path), and every Ray search
    left a /tmp/dossier-measure-* folder with the baseline engine in it."""
    ray = pytest.importorskip("ray")
    from dossier.tuner import tune

    if ray.is_initialized():
        pytest.skip("a Ray instance of another test is running in this process")
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    shadow = tmp_path / "here"
    (shadow / "dossier").mkdir(parents=True)
    (shadow / "dossier" / "__init__.py").write_text("raise ImportError('not dossier')\n")
    monkeypatch.chdir(shadow)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    before = set(tmp.glob("dossier-measure-*"))
    result = tune(spec, tmp_path / "run", executor="ray")
    assert all(t.admissible for t in result.cache.trials), [t.reason for t in result.cache.trials]
    assert set(tmp.glob("dossier-measure-*")) <= before
