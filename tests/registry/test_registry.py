"""Bundles in a real OCI registry: ``dossier push``, ``dossier pull``, ``dossier verify REF``,
signatures as referrers. The registry is the CNCF distribution registry (Debian's
``docker-registry``), started here on 127.0.0.1 with its storage in a temporary folder; the
tests look at that storage and at the registry's HTTP answers directly (urllib, not dossier's
client) to check what dossier claims, and damage blobs on disk to see pulls refuse them."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import _bundles as h
import pytest
from conftest import dossier_process, isolate_registry

from dossier.bundle import check_integrity, pack_bundle, read_bundle
from dossier.bundle.manifest import Manifest, manifest_bytes, seal
from dossier.errors import ExitCode
from dossier.hashing import digest_file
from dossier.registry import ARTIFACT_TYPE, CONFIG_TYPE, LAYER_TYPE, SIGNATURE_TYPE
from dossier.trust.signing import generate_key_pair

REGISTRY_BIN = Path("/usr/bin/docker-registry")
pytestmark = pytest.mark.skipif(not os.access(REGISTRY_BIN, os.X_OK),
                                reason="docker-registry is not installed (Debian package "
                                "docker-registry; .ci/run installs it)")
pytest.importorskip("oras", reason="registries need the [oci] extra (oras)")


# ------------------------------------------------------------------------------ the registry
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Registry:
    """A distribution registry on 127.0.0.1, storage and config in ``root``."""

    def __init__(self, root: Path, htpasswd: Path | None = None) -> None:
        self.root, self.port, self.proc = root, _free_port(), None
        self.data = root / "data"
        auth = (f"auth:\n  htpasswd:\n    realm: dossier-test\n    path: {htpasswd}\n"
                if htpasswd else "")
        self.config = root / "config.yml"
        root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.data}\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + auth)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        log = open(self.root / "registry.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([str(REGISTRY_BIN), "serve", str(self.config)],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                        timeout=0.2):
                return self
            assert self.proc.poll() is None, (self.root / "registry.log").read_text()
            time.sleep(0.05)
        raise AssertionError("the registry did not start in 20 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def get(self, path: str, accept: str = "application/vnd.oci.image.manifest.v1+json"
            ) -> tuple[int, bytes]:
        """An HTTP GET of the registry API, independent of dossier's client."""
        req = urllib.request.Request(f"http://{self.addr}/v2/{path}", headers={"Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def blob_file(self, digest: str) -> Path:
        hexdigest = digest.split(":")[1]
        return self.data / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def upload_sizes(self) -> list[int]:
        """Sizes of the uploads in progress (one that completes meanwhile is gone: skipped)."""
        found = self.data.glob("docker/registry/v2/repositories/**/_uploads/*/data")
        return [s for s in map(_size, found) if s is not None]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_registry(monkeypatch, tmp_path)



_REPOS = iter(range(10_000))


def _ref(registry: Registry, tag: str = "1") -> str:
    """A fresh repository of the module's registry, with ``tag``."""
    return f"{registry.addr}/ml/convnet-{next(_REPOS)}:{tag}"


def _one_error_line(res: Any) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _repo_tag(ref: str) -> tuple[str, str]:
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    return repo, tag


# ---------------------------------------------------------------------------- push and pull
def test_push_stores_an_oci_artifact_of_the_bundle(registry: Registry, bundle: Path) -> None:
    ref = _ref(registry)
    res = h.cli("push", bundle, ref, "--insecure", "--json")
    assert res.exit_code == 0, h.said(res)
    done = json.loads(res.stdout)
    repo, tag = _repo_tag(ref)
    status, body = registry.get(f"{repo}/manifests/{tag}")
    assert status == 200
    assert done["digest"] == "sha256:" + hashlib.sha256(body).hexdigest()
    assert done["reference"] == f"{registry.addr}/{repo}@{done['digest']}"
    manifest = json.loads(body)
    assert manifest["artifactType"] == ARTIFACT_TYPE
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config = manifest["config"]
    assert config["mediaType"] == CONFIG_TYPE
    status, config_bytes = registry.get(f"{repo}/blobs/{config['digest']}")
    assert config_bytes == (bundle / "manifest.json").read_bytes()  # byte for byte: same id
    files = {k: v for k, v in _files(bundle).items() if k != "manifest.json"}
    layers = {layer["annotations"]["org.opencontainers.image.title"]: layer
              for layer in manifest["layers"]}
    assert sorted(layers) == sorted(files) == [layer["annotations"][
        "org.opencontainers.image.title"] for layer in manifest["layers"]]
    for path, data in files.items():
        assert layers[path]["mediaType"] == LAYER_TYPE
        assert layers[path]["size"] == len(data)
        assert layers[path]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert registry.blob_file(layers[path]["digest"]).read_bytes() == data
    assert manifest["annotations"]["vnd.dossier.id"] == json.loads(config_bytes)["dossier_id"]
    assert done["uploaded"] == len(files) + 1 and done["files"] == len(files)


def test_pushing_twice_is_idempotent_and_folder_and_archive_are_one_artifact(
        registry: Registry, bundle: Path, tmp_path: Path) -> None:
    ref = _ref(registry)
    first = h.cli("push", bundle, ref, "--insecure", "--json")
    again = h.cli("push", bundle, ref, "--insecure", "--json")
    archive = pack_bundle(bundle, tmp_path / "packed")
    from_tar = h.cli("push", archive, ref.rsplit(":", 1)[0] + ":tar", "--insecure", "--json")
    assert first.exit_code == again.exit_code == from_tar.exit_code == 0, h.said(from_tar)
    a, b, c = (json.loads(r.stdout) for r in (first, again, from_tar))
    assert a["digest"] == b["digest"] == c["digest"]
    assert b["uploaded"] == 0 and c["uploaded"] == 0  # every blob was there already
    repo, _ = _repo_tag(ref)
    assert sorted(json.loads(registry.get(f"{repo}/tags/list")[1])["tags"]) == ["1", "tar"]


def test_pull_by_tag_and_by_digest_gives_the_same_bundle(registry: Registry, bundle: Path,
                                                         tmp_path: Path) -> None:
    ref = _ref(registry)
    pushed = h.cli("push", bundle, ref, "--insecure")
    assert pushed.exit_code == 0, h.said(pushed)
    pinned = pushed.stdout.strip()
    for source, out in ((ref, tmp_path / "by-tag"), (pinned, tmp_path / "by-digest")):
        res = h.cli("pull", source, "--out", out, "--insecure")
        assert res.exit_code == 0, h.said(res)
        got = Path(res.stdout.strip())
        assert got == out / bundle.name
        assert _files(got) == _files(bundle)
        assert check_integrity(read_bundle(got))
        assert _leftovers(out) == [bundle.name]  # no staging left behind
    again = h.cli("pull", pinned, "--out", tmp_path / "by-digest", "--insecure")
    assert again.exit_code == ExitCode.OUTPUT and "exists already" in _one_error_line(again)


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_a_pull_reads_back_nothing_it_downloaded(registry: Registry, bundle: Path,
                                                 tmp_path: Path) -> None:
    """Each layer's xxh3-128 is computed from the bytes as they are written: the integrity check
    of a pull reads none of them back (rchar, bytes read from files, grows by far less than the
    8 MiB engine; the download itself arrives through a socket, not counted)."""
    _rewrite_engine(bundle, mib=8)
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    assert h.cli("pull", ref, "--out", tmp_path / "warm", "--insecure").exit_code == 0
    before = _rchar()
    res = h.cli("pull", ref, "--out", tmp_path / "out", "--insecure")
    grown = _rchar() - before
    assert res.exit_code == 0, h.said(res)
    assert check_integrity(read_bundle(tmp_path / "out" / bundle.name))
    assert grown < (2 << 20), grown


def _rchar() -> int:
    text = Path("/proc/self/io").read_text()
    return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("rchar:")))


def test_a_corrupt_bundle_is_never_pushed(registry: Registry, bundle: Path) -> None:
    with open(bundle / "engine" / "convnet.ort", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    ref = _ref(registry)
    res = h.cli("push", bundle, ref, "--insecure")
    assert res.exit_code == ExitCode.BUNDLE and "integrity" in _one_error_line(res)
    repo, _ = _repo_tag(ref)
    assert registry.get(f"{repo}/tags/list")[0] == 404


# ------------------------------------------------------------------------------- tampering
@pytest.mark.parametrize("blob", ["engine/convnet.ort", "manifest.json"])
def test_a_tampered_blob_in_the_registry_is_refused(registry: Registry, bundle: Path,
                                                    tmp_path: Path, blob: str) -> None:
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    repo, tag = _repo_tag(ref)
    manifest = json.loads(registry.get(f"{repo}/manifests/{tag}")[1])
    desc = manifest["config"] if blob == "manifest.json" else next(
        layer for layer in manifest["layers"]
        if layer["annotations"]["org.opencontainers.image.title"] == blob)
    stored = registry.blob_file(desc["digest"])
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, one bit changed, on the registry's disk
    stored.write_bytes(bytes(data))
    try:
        out = tmp_path / "out"
        res = h.cli("pull", ref, "--out", out, "--insecure")
        assert res.exit_code == ExitCode.BUNDLE, h.said(res)
        line = _one_error_line(res)
        assert "digest" in line and desc["digest"] in line
        assert _leftovers(out) == []  # nothing that looks like a bundle, no staging
        res = h.cli("verify", ref, "--integrity-only", "--insecure")
        assert res.exit_code == ExitCode.BUNDLE and desc["digest"] in _one_error_line(res)
        assert not list((tmp_path / "cache").rglob("manifest.json"))
    finally:
        data[len(data) // 2] ^= 0x01
        stored.write_bytes(bytes(data))


def _put_manifest(registry: Registry, repo: str, tag: str, manifest: dict[str, Any]) -> None:
    req = urllib.request.Request(f"http://{registry.addr}/v2/{repo}/manifests/{tag}",
                                 data=json.dumps(manifest).encode(), method="PUT", headers={
                                     "Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    urllib.request.urlopen(req, timeout=10).close()


def _crafted(manifest: dict[str, Any], case: str) -> dict[str, Any]:
    crafted = json.loads(json.dumps(manifest))
    layers = crafted["layers"]
    if case == "a layer leading out":
        layers.append({**layers[0], "annotations": {
            "org.opencontainers.image.title": "../../outside"}})
    elif case == "a layer missing":
        del layers[-1]
    elif case == "a layer twice":
        layers.append(layers[0])
    elif case == "a size lie":
        layers[0]["size"] += 1
    elif case == "another artifact type":
        crafted["artifactType"] = "application/vnd.example.other"
    return crafted


@pytest.mark.parametrize("case", ["a layer leading out", "a layer missing", "a layer twice",
                                  "a size lie", "another artifact type"])
def test_a_crafted_manifest_is_refused_before_a_byte_is_written(
        registry: Registry, bundle: Path, tmp_path: Path, case: str) -> None:
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    repo, tag = _repo_tag(ref)
    manifest = json.loads(registry.get(f"{repo}/manifests/{tag}")[1])
    _put_manifest(registry, repo, "crafted", _crafted(manifest, case))
    out = tmp_path / "deep" / "out"
    out.parent.mkdir()
    res = h.cli("pull", ref.rsplit(":", 1)[0] + ":crafted", "--out", out, "--insecure")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    _one_error_line(res)
    assert _leftovers(out) == [] and _leftovers(tmp_path / "deep") in (["out"], [])
    assert not (tmp_path / "outside").exists()


def test_verify_ref_pulls_into_the_cache_and_verifies(registry: Registry, bundle: Path,
                                                      tmp_path: Path) -> None:
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    res = h.cli("verify", ref, "--integrity-only", "--insecure")
    assert res.exit_code == 0, h.said(res)
    assert "pulled into" in res.stderr and "16 files intact" in res.stderr
    cached = list((tmp_path / "cache").glob("sha256-*/" + bundle.name))
    assert len(cached) == 1 and _files(cached[0]) == _files(bundle)
    res = h.cli("verify", ref, "--integrity-only", "--insecure")
    assert res.exit_code == 0 and "in the cache at" in res.stderr
    (cached[0] / "knobs.json").write_bytes(b"{}")  # a damaged cached copy is pulled again
    res = h.cli("verify", ref, "--integrity-only", "--insecure")
    assert res.exit_code == 0 and "pulled into" in res.stderr, h.said(res)


# ------------------------------------------------------------------------------- signatures
def test_a_signature_travels_as_a_referrer(registry: Registry, bundle: Path,
                                           tmp_path: Path) -> None:
    keys = {n: generate_key_pair(tmp_path / "keys", n) for n in ("release", "second", "stranger")}
    assert h.cli("sign", bundle, "--key", keys["release"].private).exit_code == 0
    ref = _ref(registry)
    res = h.cli("push", bundle, ref, "--insecure", "--json")
    assert res.exit_code == 0, h.said(res)
    done = json.loads(res.stdout)
    assert done["signature"]
    # no referrers API in distribution 2.x: the tag schema fallback, checked over plain HTTP
    repo, _ = _repo_tag(ref)
    fallback = done["digest"].replace(":", "-")
    assert fallback in json.loads(registry.get(f"{repo}/tags/list")[1])["tags"]
    index = json.loads(registry.get(f"{repo}/manifests/{fallback}",
                                    "application/vnd.oci.image.index.v1+json")[1])
    assert [d["digest"] for d in index["manifests"]] == [done["signature"]]
    referrer = json.loads(registry.get(f"{repo}/manifests/{done['signature']}")[1])
    assert referrer["artifactType"] == SIGNATURE_TYPE
    assert referrer["subject"]["digest"] == done["digest"]
    envelope = registry.get(f"{repo}/blobs/{referrer['layers'][0]['digest']}")[1]
    assert envelope == (bundle.parent / "convnet-1.dossier.sig.json").read_bytes()

    def verify(*keys_: Path) -> Any:
        args = [a for k in keys_ for a in ("--trusted-key", k)]
        return h.cli("verify", ref, "--integrity-only", "--insecure", "--require-signature",
                     *args)

    res = verify(keys["release"].public)
    assert res.exit_code == 0 and "OK: signature" in res.stderr, h.said(res)
    res = verify(keys["stranger"].public)
    assert res.exit_code == ExitCode.SIGNATURE, h.said(res)
    # co-signed later: the new envelope is a second referrer; pushing again changes no digest
    assert h.cli("sign", bundle, "--key", keys["second"].private).exit_code == 0
    again = json.loads(h.cli("push", bundle, ref, "--insecure", "--json").stdout)
    assert again["digest"] == done["digest"] and again["signature"] != done["signature"]
    index = json.loads(registry.get(f"{repo}/manifests/{fallback}",
                                    "application/vnd.oci.image.index.v1+json")[1])
    assert len(index["manifests"]) == 2
    assert json.loads(h.cli("push", bundle, ref, "--insecure", "--json").stdout) == again
    assert len(json.loads(registry.get(f"{repo}/manifests/{fallback}",
                                       "application/vnd.oci.image.index.v1+json")[1])[
        "manifests"]) == 2
    res = verify(keys["second"].public)
    assert res.exit_code == 0 and "2 signature referrer(s)" in res.stderr, h.said(res)


def test_a_pulled_copy_keeps_its_signature_and_verifies_as_the_reference_does(
        registry: Registry, bundle: Path, tmp_path: Path) -> None:
    """pull writes the signature referrers beside the bundle, where verify looks: verify of the
    pulled copy passes and refuses exactly as verify REF does."""
    keys = {n: generate_key_pair(tmp_path / "keys", n) for n in ("release", "second", "stranger")}
    unsigned = h.copy_bundle(bundle, tmp_path / "unsigned")
    assert h.cli("sign", bundle, "--key", keys["release"].private).exit_code == 0
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    # co-signed later: a second referrer, over the same statement
    assert h.cli("sign", bundle, "--key", keys["second"].private).exit_code == 0
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    plain = _ref(registry)
    assert h.cli("push", unsigned, plain, "--insecure").exit_code == 0

    out = tmp_path / "pulled"
    res = h.cli("pull", ref, "--out", out, "--insecure", "--json")
    assert res.exit_code == 0, h.said(res)
    done = json.loads(res.stdout)
    sig = out / "convnet-1.dossier.sig.json"
    assert done["bundle"] == str(out / bundle.name) and done["signature"] == str(sig)
    assert _leftovers(out) == [bundle.name, sig.name]
    # the two referrers as one co-signed envelope: the bytes dossier sign wrote beside the bundle
    assert sig.read_bytes() == (bundle.parent / "convnet-1.dossier.sig.json").read_bytes()
    res = h.cli("pull", plain, "--out", tmp_path / "plain", "--insecure", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["signature"] is None, h.said(res)
    assert _leftovers(tmp_path / "plain") == [bundle.name]

    def verify(target: str | Path, *trusted: Path) -> int:
        args = [a for k in trusted for a in ("--require-signature", "--trusted-key", k)]
        return int(h.cli("verify", target, "--integrity-only", "--insecure", *args).exit_code)

    cases = {"release": ([keys["release"].public], 0), "second": ([keys["second"].public], 0),
             "stranger": ([keys["stranger"].public], ExitCode.SIGNATURE),
             "no key": ([], 0)}
    for name, (trusted, code) in cases.items():
        assert verify(out / bundle.name, *trusted) == verify(ref, *trusted) == code, name
        unsigned_code = ExitCode.SIGNATURE if trusted else 0  # --require-signature: unsigned
        assert verify(tmp_path / "plain" / bundle.name, *trusted) == verify(
            plain, *trusted) == unsigned_code, name


def test_a_pull_whose_signature_referrers_all_fail_keeps_no_signature(
        registry: Registry, bundle: Path, tmp_path: Path) -> None:
    """A signature referrer that does not verify is a warning and is ignored by pull, as by
    verify REF (anyone who may push could add one): the bundle is pulled, no signature is
    written beside it, and verify REF fails only with --require-signature; with a good one
    beside it, the good one is kept. A file in the way of the signature is never
    overwritten."""
    from dossier.registry.client import connect
    from dossier.registry.reference import parse_reference
    from dossier.registry.referrers import attach_signature

    key = generate_key_pair(tmp_path / "keys", "release")
    unsigned = h.copy_bundle(bundle, tmp_path / "unsigned")
    assert h.cli("sign", bundle, "--key", key.private).exit_code == 0
    good = bundle.parent / "convnet-1.dossier.sig.json"
    envelope = json.loads(good.read_text())
    raw = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    raw[7] ^= 0x01
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    bad = tmp_path / "bad.sig.json"
    bad.write_text(json.dumps(envelope))
    ref = _ref(registry)
    pushed = json.loads(h.cli("push", unsigned, ref, "--insecure", "--json").stdout)
    repo, _ = _repo_tag(ref)
    size = len(registry.get(f"{repo}/manifests/{pushed['digest']}")[1])
    client = connect(parse_reference(ref), insecure=True)
    attach_signature(client, pushed["digest"], size, bad)

    out = tmp_path / "out"
    res = h.cli("pull", ref, "--out", out, "--insecure")
    assert res.exit_code == 0, h.said(res)
    assert "warning: " in res.stderr and "does not verify" in res.stderr
    assert not (out / "convnet-1.dossier.sig.json").exists()
    res = h.cli("verify", ref, "--integrity-only", "--insecure")
    assert res.exit_code == 0 and "does not verify" in res.stderr, h.said(res)
    assert h.cli("verify", ref, "--integrity-only", "--insecure", "--require-signature",
                 "--trusted-key", key.public).exit_code == ExitCode.SIGNATURE

    shutil.rmtree(out / "convnet-1.dossier")
    attach_signature(client, pushed["digest"], size, good)
    res = h.cli("pull", ref, "--out", out, "--insecure")
    assert res.exit_code == 0, h.said(res)
    assert (out / "convnet-1.dossier.sig.json").read_bytes() == good.read_bytes()

    other = tmp_path / "other"
    other.mkdir()
    (other / "convnet-1.dossier.sig.json").write_text("mine")
    res = h.cli("pull", ref, "--out", other, "--insecure")
    assert res.exit_code == ExitCode.OUTPUT and "exists already" in _one_error_line(res)
    assert _leftovers(other) == ["convnet-1.dossier.sig.json"]
    assert (other / "convnet-1.dossier.sig.json").read_text() == "mine"


def test_an_unsigned_artifact_fails_require_signature(registry: Registry, bundle: Path,
                                                      tmp_path: Path) -> None:
    key = generate_key_pair(tmp_path / "keys", "release")
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    res = h.cli("verify", ref, "--integrity-only", "--insecure", "--require-signature",
                "--trusted-key", key.public)
    assert res.exit_code == ExitCode.SIGNATURE
    assert "no signature referrer" in res.stderr


def test_a_signature_of_other_bytes_is_never_attached(registry: Registry, bundle: Path,
                                                      tmp_path: Path) -> None:
    key = generate_key_pair(tmp_path / "keys", "release")
    assert h.cli("sign", bundle, "--key", key.private).exit_code == 0
    other = h.copy_bundle(bundle, tmp_path / "other")
    _rewrite_engine(other, b"x" * 1000)
    ref = _ref(registry)
    res = h.cli("push", other, ref, "--insecure",
                "--signature", bundle.parent / "convnet-1.dossier.sig.json")
    assert res.exit_code == ExitCode.SIGNATURE, h.said(res)
    repo, _ = _repo_tag(ref)
    assert registry.get(f"{repo}/tags/list")[0] == 404  # refused before any upload


# ----------------------------------------------------------------------------------- errors
def test_registry_errors_are_one_line_with_their_exit_code(registry: Registry, bundle: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "out"
    ref = _ref(registry)
    assert h.cli("push", bundle, ref, "--insecure").exit_code == 0
    missing_tag = ref.rsplit(":", 1)[0] + ":2"
    cases = {
        "missing tag": (("pull", missing_tag, "--out", out, "--insecure"), ExitCode.NOT_FOUND,
                        "is not in the registry"),
        "missing digest": (("pull", ref.rsplit(":", 1)[0] + "@sha256:" + "0" * 64, "--out", out,
                            "--insecure"), ExitCode.NOT_FOUND, "is not in the registry"),
        "unreachable": (("pull", f"127.0.0.1:{_free_port()}/ml/x:1", "--out", out,
                         "--insecure"), ExitCode.REGISTRY, "is unreachable"),
        "https to a plain registry": (("pull", ref, "--out", out), ExitCode.REGISTRY,
                                      "TLS failed"),
        "insecure beyond loopback": (("push", bundle, "registry.example.com/ml/x:1",
                                      "--insecure"), ExitCode.INPUT, "only for a loopback"),
        "no registry": (("pull", "ml/convnet:1", "--out", out), ExitCode.INPUT,
                        "not a registry reference"),
        "push to no tag": (("push", bundle, ref.rsplit(":", 1)[0]), ExitCode.INPUT,
                           "names no tag"),
        "not a bundle": (("pull", ref.rsplit(":", 1)[0] + ":sig", "--out", out, "--insecure"),
                         ExitCode.BUNDLE, "not a dossier bundle"),
    }
    key = generate_key_pair(tmp_path / "keys", "k")  # a referrer manifest tagged :sig
    assert h.cli("sign", bundle, "--key", key.private).exit_code == 0
    signed = json.loads(h.cli("push", bundle, ref, "--insecure", "--json").stdout)
    repo, _ = _repo_tag(ref)
    sig_manifest = registry.get(f"{repo}/manifests/{signed['signature']}")[1]
    _put_manifest(registry, repo, "sig", json.loads(sig_manifest))
    for name, (args, code, words) in cases.items():
        started = time.monotonic()
        res = h.cli(*args)
        assert res.exit_code == code, (name, h.said(res))
        assert words in _one_error_line(res), name
        assert time.monotonic() - started < 10, name
        assert _leftovers(out) == [], name


def test_credentials_from_the_docker_config_and_the_environment(
        tmp_path: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        crypt = pytest.importorskip("crypt", reason="bcrypt hashing for htpasswd needs crypt")
    if crypt.METHOD_BLOWFISH not in crypt.methods:
        pytest.skip("this C library's crypt() has no bcrypt")
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text("alice:" + crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH,
                                                                      rounds=16)) + "\n")
    server = Registry(tmp_path / "auth-registry", htpasswd).start()
    try:
        ref = f"{server.addr}/ml/convnet:1"
        config = tmp_path / "docker" / "config.json"
        config.parent.mkdir()

        def login(password: str) -> None:
            token = base64.b64encode(f"alice:{password}".encode()).decode()
            config.write_text(json.dumps({"auths": {server.addr: {"auth": token}}}))

        res = h.cli("push", bundle, ref, "--insecure")
        assert res.exit_code == ExitCode.REGISTRY_AUTH and "none were found" in _one_error_line(res)
        login("wrong")
        res = h.cli("push", bundle, ref, "--insecure")
        assert res.exit_code == ExitCode.REGISTRY_AUTH
        assert f"refused the credentials of the Docker config {config}" in _one_error_line(res)
        login("s3cret")
        res = h.cli("push", bundle, ref, "--insecure")
        assert res.exit_code == 0, h.said(res)
        config.unlink()
        monkeypatch.setenv("DOSSIER_REGISTRY_USERNAME", "alice")
        monkeypatch.setenv("DOSSIER_REGISTRY_PASSWORD", "s3cret")
        res = h.cli("pull", ref, "--out", tmp_path / "out", "--insecure")
        assert res.exit_code == 0, h.said(res)
        assert _files(tmp_path / "out" / bundle.name) == _files(bundle)
        config.write_text("{not json")
        monkeypatch.delenv("DOSSIER_REGISTRY_PASSWORD")
        res = h.cli("pull", ref, "--out", tmp_path / "out2", "--insecure")
        assert res.exit_code == ExitCode.INPUT and "not valid JSON" in _one_error_line(res)
    finally:
        server.kill()


# ------------------------------------------------------------------ a registry that dies
def _rewrite_engine(bundle: Path, data: bytes | None = None, mib: int = 0) -> None:
    """Replace the shipped engine of ``bundle`` (``data``, or ``mib`` MiB of seeded random
    bytes) and reseal the manifest, so the bundle stays intact."""
    m = Manifest.model_validate_json((bundle / "manifest.json").read_bytes())
    path = bundle / m.engines.shipped.path
    with open(path, "wb") as f:
        if data is not None:
            f.write(data)
        rng = random.Random(mib)
        for _ in range(mib):
            f.write(rng.randbytes(1 << 20))
    digest, size = digest_file(path)

    def fix(entry: Any) -> Any:
        if entry is None or entry.path != m.engines.shipped.path:
            return entry
        return entry.model_copy(update={"size": size, "digest": digest})

    files = [fix(f) for f in m.files]
    engines = m.engines.model_copy(update={"shipped": fix(m.engines.shipped),
                                           "baseline": fix(m.engines.baseline)})
    new = seal(m.model_copy(update={"files": files, "engines": engines}))
    (bundle / "manifest.json").write_bytes(manifest_bytes(new))
    assert check_integrity(read_bundle(bundle))


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _dossier(*args: object) -> subprocess.Popen[bytes]:
    return dossier_process(args, os.environ.copy(), stdout=subprocess.PIPE, new_session=False,
                           cwd=h.REPO)


def _kill_when(server: Registry, proc: subprocess.Popen[bytes], condition: Any) -> bool:
    """SIGKILL the registry as soon as ``condition()`` holds; False if ``proc`` ended first."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            server.kill()
            return True
        time.sleep(0.002)
    return False


ENGINE_MIB = 96
"""Large enough that the registry is killed mid-transfer on this 2-core machine."""


def test_a_registry_that_dies_mid_push_and_mid_pull(tmp_path: Path, bundle: Path) -> None:
    _rewrite_engine(bundle, mib=ENGINE_MIB)
    before = h.snapshot(bundle.parent)
    server = Registry(tmp_path / "dying").start()
    try:
        ref = f"{server.addr}/ml/big:1"
        proc = _dossier("push", bundle, ref, "--insecure")
        killed = _kill_when(server, proc, lambda: any(s > 1 << 20 for s in server.upload_sizes()))
        _, stderr = proc.communicate(timeout=60)
        assert killed, "the push ended before the registry could be killed mid-upload"
        lines = stderr.decode().strip().splitlines()
        assert proc.returncode == ExitCode.REGISTRY, stderr
        assert len(lines) == 1 and lines[0].startswith("error: ") and server.addr in lines[0]
        assert h.snapshot(bundle.parent) == before  # nothing written beside the bundle

        server.start()  # same storage: a retry succeeds and the bundle round-trips
        res = h.cli("push", bundle, ref, "--insecure", "--json")
        assert res.exit_code == 0, h.said(res)
        digest = json.loads(res.stdout)["digest"]

        out = tmp_path / "out"
        proc = _dossier("pull", ref, "--out", out, "--insecure")
        engine = "engine/convnet.ort"
        killed = _kill_when(server, proc, lambda: any(
            p.stat().st_size > 1 << 20 for p in out.glob(f".*staging*/{engine}")))
        _, stderr = proc.communicate(timeout=60)
        assert killed, "the pull ended before the registry could be killed mid-download"
        lines = stderr.decode().strip().splitlines()
        assert proc.returncode == ExitCode.REGISTRY, stderr
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert _leftovers(out) == []  # nothing half-pulled, not even the staging folder

        server.start()
        res = h.cli("pull", f"{server.addr}/ml/big@{digest}", "--out", out, "--insecure")
        assert res.exit_code == 0, h.said(res)
        assert h.snapshot(out / bundle.name) == h.snapshot(bundle)
    finally:
        server.kill()
        shutil.rmtree(server.data, ignore_errors=True)
