"""``dossier.verify.verify`` and ``dossier.load`` of a registry reference, against the real
distribution registry of tests/registry/test_registry.py: pulled into the cache, signature referrers
checked, the registry's refusals (exit 21, 22) reported as the fetch step."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import _bundles as h
import pytest
from conftest import isolate_registry
from test_registry import REGISTRY_BIN, Registry

from dossier.errors import NotFoundError, RegistryAuthError, SignatureError
from dossier.trust.signing import generate_key_pair
from dossier.verify import StepName, VerifyOptions, refused_report, verify

pytestmark = pytest.mark.skipif(not REGISTRY_BIN.exists(), reason="docker-registry is not "
                                "installed")
pytest.importorskip("oras", reason="registries need the [oci] extra (oras)")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_registry(monkeypatch, tmp_path)


@pytest.fixture
def pushed(registry: Registry, tmp_path: Path) -> tuple[str, Path, object]:
    """The golden bundle signed and pushed (its signature as a referrer)."""
    bundle = h.copy_bundle(h.GOLDEN, tmp_path / "release")
    keys = generate_key_pair(tmp_path / "keys", "release")
    assert h.cli("sign", bundle, "--key", keys.private).exit_code == 0
    ref = f"{registry.addr}/ml/verify-{tmp_path.name[-12:].strip('_').lower()}:1"
    res = h.cli("push", bundle, ref, "--insecure", "--json")
    assert res.exit_code == 0, h.said(res)
    return ref, bundle, keys


def test_a_reference_is_fetched_and_its_referrer_signature_checked(
        pushed: tuple[str, Path, object], tmp_path: Path) -> None:
    ref, bundle, keys = pushed
    options = VerifyOptions(insecure=True, require_signature=True,
                            trusted_keys=(keys.public,),  # type: ignore[attr-defined]
                            host=bundle / "fingerprint.json")
    report = verify(ref, options)
    fetch = report.steps[0]
    assert fetch.name is StepName.FETCH and fetch.outcome.value == "passed"
    assert "pulled into" in fetch.detail and "1 signature referrer(s)" in fetch.detail
    assert report.reference and report.reference.split("@")[1].startswith("sha256:")
    assert report.signature and report.signature.startswith("signed by trusted key")
    assert report.verdict is not None and report.verdict.value == "VALID"
    assert Path(report.bundle).is_relative_to(tmp_path / "cache")
    again = verify(ref, options)
    assert "in the cache at" in again.steps[0].detail
    stranger = generate_key_pair(tmp_path / "keys", "stranger")
    with pytest.raises(SignatureError):
        verify(ref, VerifyOptions(insecure=True, require_signature=True,
                                  trusted_keys=(stranger.public,)))


def test_a_missing_tag_is_exit_22(pushed: tuple[str, Path, object]) -> None:
    ref = pushed[0].rsplit(":", 1)[0] + ":2"
    with pytest.raises(NotFoundError) as exc:
        verify(ref, VerifyOptions(insecure=True))
    report = refused_report(exc.value)
    assert report is not None and report.exit_code == 22
    assert report.steps[0].outcome.value == "failed" and report.steps[1].outcome.value == "skipped"


def test_missing_credentials_are_exit_21(tmp_path: Path) -> None:
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
        with pytest.raises(RegistryAuthError) as exc:
            verify(f"{server.addr}/ml/convnet:1", VerifyOptions(insecure=True))
        report = refused_report(exc.value)
        assert report is not None and report.exit_code == 21
        assert json.loads(report.model_dump_json())["steps"][0]["outcome"] == "failed"
    finally:
        server.kill()


def test_a_reference_loads_and_verifies(pushed: tuple[str, Path, object], tmp_path: Path) -> None:
    import numpy as np

    import dossier
    from dossier.validation import load_validation_set

    ref, bundle, keys = pushed
    engine = dossier.load(ref, insecure=True, require_signature=True,
                          trusted_key=keys.public,  # type: ignore[attr-defined]
                          host=bundle / "fingerprint.json")
    assert engine.report.reference and engine.report.steps[0].outcome.value == "passed"
    assert engine.report.signature and engine.report.signature.startswith("signed by trusted")
    assert engine.bundle_id == json.loads((bundle / "manifest.json").read_text())["dossier_id"]
    pair = load_validation_set(bundle / "validation").pairs[0]
    out = engine(pair.inputs)
    assert out.keys() == pair.references.keys()
    assert float(np.max(np.abs(out["logits"] - pair.references["logits"]))) < 1e-4
    res = h.cli("run", ref, "--insecure", "--check", "--host-fingerprint",
                bundle / "fingerprint.json")
    assert res.exit_code == 0 and "in the cache at" not in res.stderr, h.said(res)
    stranger = generate_key_pair(tmp_path / "keys", "stranger")
    with pytest.raises(SignatureError):
        dossier.load(ref, insecure=True, require_signature=True, trusted_key=stranger.public)
