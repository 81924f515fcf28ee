"""Registry references and the loopback rule of ``--insecure`` (no registry needed)."""

from __future__ import annotations

import pytest

from dossier.errors import InputError
from dossier.registry import is_loopback, looks_like_reference, parse_reference

HEX = "a" * 64


@pytest.mark.parametrize(("text", "registry", "repository", "tag", "digest"), [
    ("registry.example.com/ml/convnet:1", "registry.example.com", "ml/convnet", "1", None),
    ("127.0.0.1:5000/convnet@sha256:" + HEX, "127.0.0.1:5000", "convnet", None, "sha256:" + HEX),
    ("localhost/a/b/c:v1.2-rc_3", "localhost", "a/b/c", "v1.2-rc_3", None),
    ("[::1]:5000/x__y.z:t", "[::1]:5000", "x__y.z", "t", None),
    ("host.io/r:t@sha256:" + HEX, "host.io", "r", "t", "sha256:" + HEX),
])
def test_references_parse(text: str, registry: str, repository: str, tag: str | None,
                          digest: str | None) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag,
                                                                    digest)
    assert ref.target == (digest or tag)
    assert looks_like_reference(text)


@pytest.mark.parametrize("text", [
    "convnet:1",                                   # no registry: no implicit docker.io
    "ml/convnet:1",                                # first component is not a host
    "registry.example.com/ml/convnet",             # neither tag nor digest: no implicit latest
    "registry.example.com/ML/convnet:1",           # repositories are lowercase
    "registry.example.com/ml/convnet@sha512:" + HEX,
    "registry.example.com/ml/convnet@sha256:" + HEX[:-1],
    "registry.example.com/ml//convnet:1",
    "registry.example.com/../convnet:1",
    "registry.example.com/ml/convnet:" + "t" * 129,
    "out/convnet-1.dossier",
    "",
])
def test_malformed_references_are_refused(text: str) -> None:
    with pytest.raises(InputError):
        parse_reference(text)
    assert not looks_like_reference(text)


def test_push_needs_a_tag() -> None:
    with pytest.raises(InputError, match="names no tag"):
        parse_reference("registry.example.com/ml/convnet@sha256:" + HEX, need_tag=True)


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
    ("10.0.0.1", False), ("192.168.1.2", False), ("::2", False), ("registry.example.com", False),
    ("localhost.example.com", False), ("127.0.0.1.nip.io", False),
])
def test_insecure_is_for_loopback_hosts_only(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    bracketed = f"[{host}]" if ":" in host else host
    assert parse_reference(f"{bracketed}:5000/x:1").host == host
