"""Hostile inputs to the serving path, third round: signature referrers anyone with push access
can add, FIFOs where dossier reads a small file, inputs of the other byte order or crafted
``.npy``/``.npz`` files, and a bundle whose timing header would make ``verify --rebench`` run
for days. Every case here failed before its fix; the docstrings say how."""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_bundle_helpers as h
from conftest import isolate_registry
from test_registry_hostile import _http, _ref, needs_registry

import dossier
from dossier.errors import EngineFailedError, ExitCode, InputError


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_registry(monkeypatch, tmp_path)



@pytest.fixture
def host(bundle: Path, tmp_path: Path) -> Path:
    """The golden bundle's tuning host (VALID here, whatever this CPU is)."""
    path = tmp_path / "host.json"
    path.write_bytes((bundle / "fingerprint.json").read_bytes())
    return path


def _pair(bundle: Path) -> Any:
    from dossier.validation import load_validation_set

    return load_validation_set(bundle / "validation").pairs[0]


# ----------------------------------------------------------------------- referrers (item 2)
def _client(ref: str) -> Any:
    from dossier.registry.client import connect
    from dossier.registry.reference import parse_reference

    return connect(parse_reference(ref), insecure=True)


def _digest(registry: Any, ref: str) -> tuple[str, int]:  # noqa: F811 - the fixture's value
    repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
    _, headers, body = _http(registry, "GET", f"/v2/{repo}/manifests/{tag}",
                             headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    return headers["Docker-Content-Digest"], len(body)


def _foreign_signature(tmp_path: Path, registry: Any, ref: str) -> None:  # noqa: F811
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


def _not_an_envelope(tmp_path: Path, registry: Any, ref: str) -> None:  # noqa: F811
    from dossier.registry.referrers import attach_signature

    junk = tmp_path / "junk.sig.json"
    if not junk.exists():
        junk.write_text('{"not": "a DSSE envelope"}')
    digest, size = _digest(registry, ref)
    attach_signature(_client(ref), digest, size, junk)


def _wrong_subject(tmp_path: Path, registry: Any, ref: str) -> None:  # noqa: F811
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


def _too_many(tmp_path: Path, registry: Any, ref: str) -> None:  # noqa: F811
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
        registry: Any, bundle: Path, host: Path, tmp_path: Path, plant: str,  # noqa: F811
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


# --------------------------------------------------------------------------- FIFOs (item 3)
def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result or exception, or a failure when it takes longer than ``seconds``
    (a FIFO nobody writes to blocks its reader for ever)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        # unblock it: a writer opens the FIFO, which lets the reader see end of file
        pytest.fail(f"still blocked after {seconds} s")
    return out[0]


FIFOS = ["signature beside", "trusted key", "--host-fingerprint", "run -i", "policy"]


@pytest.mark.parametrize("where", FIFOS)
def test_a_fifo_where_a_small_file_is_read_is_refused_at_once(bundle: Path, host: Path,
                                                              tmp_path: Path, where: str) -> None:
    """Before: verify, run, sign and dossier.load waited for ever on a FIFO in place of the
    signature beside the bundle, a trusted key, a host fingerprint or run's inputs."""
    from dossier.trust.sigfile import signature_path

    fifo = tmp_path / "fifo"
    args: list[object]
    if where == "signature beside":
        _fifo(signature_path(bundle))
        args, code = ["verify", bundle, "--host-fingerprint", host], ExitCode.SIGNATURE
    elif where == "trusted key":
        args = ["verify", bundle, "--host-fingerprint", host, "--trusted-key", _fifo(fifo),
                "--require-signature"]
        code = ExitCode.INPUT
    elif where == "--host-fingerprint":
        args, code = ["verify", bundle, "--host-fingerprint", _fifo(fifo)], ExitCode.INPUT
    elif where == "run -i":
        args = ["run", bundle, "--host-fingerprint", host, "-i", _fifo(fifo)]
        code = ExitCode.INPUT
    else:
        args = ["verify", bundle, "--host-fingerprint", host, "--policy", _fifo(fifo)]
        code = ExitCode.INPUT
    res = _within(20, lambda: h.cli(*args))
    assert not isinstance(res, BaseException), res
    assert res.exit_code == code, h.said(res)
    assert "Traceback" not in h.said(res)
    if where == "signature beside":
        for command in (["verify", bundle, "--integrity-only"],
                        ["sign", bundle, "--key", tmp_path / "none.key"]):
            res = _within(20, lambda c=command: h.cli(*c))
            assert not isinstance(res, BaseException), res
            assert res.exit_code != 0 and "Traceback" not in h.said(res)
        got = _within(20, lambda: dossier.load(bundle, host=host))
        assert isinstance(got, dossier.errors.SignatureError), got


def test_read_small_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    from dossier.files import NotAFileError, read_small

    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_small(tmp_path / "f", 10) == b"x" * 10
    with pytest.raises(NotAFileError, match="more than the 9"):
        read_small(tmp_path / "f", 9)
    got = _within(5, lambda: read_small(_fifo(tmp_path / "p")))
    assert isinstance(got, NotAFileError) and "FIFO" in str(got), got
    with pytest.raises(NotAFileError, match="folder"):
        read_small(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert read_small(tmp_path / "link") == b"x" * 10
    with pytest.raises(NotAFileError, match="symbolic link"):
        read_small(tmp_path / "link", follow=False)


# ------------------------------------------------------------------------- inputs (item 4)
def test_inputs_of_the_other_byte_order_give_the_same_outputs(bundle: Path, host: Path,
                                                              tmp_path: Path) -> None:
    """Before: ``>f4`` inputs gave NaN or garbage outputs, exit 0 (Engine.__call__, run -i)."""
    engine = dossier.load(bundle, host=host)
    pair = _pair(bundle)
    x = pair.inputs["x"]
    swapped = x.astype(x.dtype.newbyteorder(">"))
    np.testing.assert_array_equal(engine(x=swapped)["logits"], engine(x=x)["logits"])
    np.savez(tmp_path / "big.npz", x=swapped)
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "big.npz", "--check")
    assert res.exit_code == 0, h.said(res)


def test_run_reads_a_single_npy_for_a_one_input_engine(bundle: Path, host: Path,
                                                       tmp_path: Path) -> None:
    """Before: ``run -i x.npy`` was exit 70 with a traceback."""
    np.save(tmp_path / "x.npy", _pair(bundle).inputs["x"])
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "x.npy", "--check")
    assert res.exit_code == 0, h.said(res)
    from dossier.serve import read_inputs

    with pytest.raises(InputError, match="single .npy array; this engine takes 2 inputs"):
        read_inputs(tmp_path / "x.npy", ["a", "b"])


def _npz(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _nested_header(depth: int) -> bytes:
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * depth + ")" * depth \
        + ", }"
    text += " " * (63 - (len(text) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


CRAFTED: dict[str, Callable[[Path], Path | str]] = {
    "an empty path": lambda tmp: "",
    "a member claiming 2**40 rows": lambda tmp: _npz(tmp / "rows.npz",
                                                     {"x.npy": _header((2**40, 3, 32, 32))}),
    "5000 nested brackets": lambda tmp: _npz(tmp / "nested.npz", {"x.npy": _nested_header(5000)}),
    "a .npy of 5000 nested brackets": lambda tmp: _write(tmp / "nested.npy",
                                                         _nested_header(5000)),
    "a truncated array": lambda tmp: _npz(tmp / "short.npz",
                                          {"x.npy": _header((1, 3, 32, 32)) + b"\0" * 10}),
    "a pickled object array": lambda tmp: _npz(tmp / "obj.npz", {"x.npy": _header((1,), "|O")}),
    "not a zip": lambda tmp: _write(tmp / "junk.npz", b"PK\x03\x04 junk"),
    "a folder": lambda tmp: tmp,
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(CRAFTED), ids=list(CRAFTED))
def test_a_crafted_inputs_file_gets_one_line_and_exit_3(bundle: Path, host: Path,
                                                        tmp_path: Path, case: str) -> None:
    """Before: an empty path, an .npz member whose header claims 2**40 rows, headers of 5000
    nested brackets: exit 70 with a traceback."""
    path = CRAFTED[case](tmp_path)
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", path)
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "Traceback" not in h.said(res) and "error:" in res.stderr


def test_an_npz_bomb_is_refused_before_it_is_unpacked(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the cap was on the compressed size: a 1 MB .npz of 1 GiB of zeros was unpacked
    whole. The cap here is lowered to 1 MiB; the file holds 4 MiB of zeros."""
    import dossier.serve as serve

    monkeypatch.setattr(serve, "UNPACKED_MAX_BYTES", 1 << 20)
    buf = io.BytesIO()
    np.save(buf, np.zeros((1 << 20,), np.float32))
    path = _npz(tmp_path / "bomb.npz", {"x.npy": buf.getvalue()})
    assert path.stat().st_size < 64 << 10
    with pytest.raises(InputError, match="unpacks to"):
        serve.read_inputs(path)


def test_a_wrong_shape_is_exit_3_with_the_runtimes_whole_message(bundle: Path, host: Path,
                                                                  tmp_path: Path) -> None:
    """Before: exit 11 (the INVALID-host code) with the runtime's message cut after its
    first line."""
    np.savez(tmp_path / "wrong.npz", x=np.zeros((1, 3, 16, 16), np.float32))
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "wrong.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    engine = dossier.load(bundle, host=host)
    with pytest.raises(InputError) as exc:
        engine(x=np.zeros((1, 3, 16, 16), np.float32))
    native = exc.value.__cause__.__cause__  # type: ignore[union-attr]
    lines = str(native).strip().splitlines()
    assert len(lines) > 1 and all(x.strip() in str(exc.value) for x in lines), str(exc.value)


def test_no_exception_but_dossiers_leaves_a_call(bundle: Path, host: Path) -> None:
    """Before: a ragged list or an object went through as numpy's or the runtime's own
    exception (the docs promise InputError or EngineFailedError)."""
    engine = dossier.load(bundle, host=host)
    for bad in ([[1.0], [1.0, 2.0]], object(), "text"):
        with pytest.raises((InputError, EngineFailedError)):
            engine(x=bad)


# -------------------------------------------------------------------------- rebench (item 6)
def _greedy_timing(bundle: Path) -> None:
    """Every timing setting of the tuning header at a value that runs for days; resealed."""
    cache = bundle / "tuning-cache.jsonl"
    lines = cache.read_text().splitlines()
    header = json.loads(lines[0])
    from dossier.measure.timing import TIMING_MAXIMA

    header["timing"].update({k: v for k, v in TIMING_MAXIMA.items()
                             if k not in ("warmup_tolerance", "min_effect",
                                          "trial_memory_limit_mb")})
    cache.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    h.reseal(bundle)


def test_rebench_clamps_a_bundles_timing_settings(bundle: Path) -> None:
    from dossier.bundle import open_bundle
    from dossier.verify import REBENCH_LIMITS, rebench_timing

    _greedy_timing(bundle)
    with open_bundle(bundle) as b:
        timing = rebench_timing(b.tuning_cache().header.timing, max_s=100)
    for name, limit in REBENCH_LIMITS.items():
        assert getattr(timing, name) <= limit, name
    assert timing.trial_timeout_s <= 100 / timing.confirm_processes


def test_rebench_within_max_s_keeps_its_log_where_it_says(bundle: Path, host: Path) -> None:
    """Before: a bundle's timing header made --rebench run for days with no option to bound
    it, and a failed measuring process named a log already deleted."""
    import re

    _greedy_timing(bundle)
    res = _within(120, lambda: h.cli("verify", bundle, "--host-fingerprint", host, "--rebench",
                                     "--max-s", "2"))
    assert not isinstance(res, BaseException), res
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "--max-s" in h.said(res)
    log = re.search(r"its log is (\S+\.log)", h.said(res))
    assert log is not None and Path(log.group(1)).is_file(), h.said(res)


def test_rebench_of_an_unreadable_validation_set_is_a_bundle_error(bundle: Path,
                                                                   host: Path) -> None:
    """Before: exit 4 ("the search could not produce a result")."""
    (bundle / "validation" / "pair-000" / "inputs.arrow").write_bytes(b"not arrow")
    h.reseal(bundle)
    res = h.cli("verify", bundle, "--host-fingerprint", host, "--rebench")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert "validation set cannot be read" in h.said(res)


# ------------------------------------------------------------------------ spec paths (item 4)
def _spec(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(f'[release]\nname = "a"\n[model]\npath = "{model}"\n[validation]\n'
                    'path = "validation"\n[tune]\nbackend = "onnxruntime"\n'
                    'selection = "-graph_optimization_level=[all|basic]"\nmetric = "linf"\n'
                    "threshold = 1e-4\n")
    return path


@pytest.mark.parametrize("case", ["a symbolic link loop", "a name over NAME_MAX", "a FIFO"])
def test_a_hostile_spec_path_gets_one_line(tmp_path: Path, case: str) -> None:
    """Before: a model path that is a symbolic link loop or longer than NAME_MAX was exit 70
    with a traceback; a FIFO in place of the spec blocked for ever."""
    if case == "a symbolic link loop":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        spec = _spec(tmp_path, str(tmp_path / "loop"))
    elif case == "a name over NAME_MAX":
        spec = _spec(tmp_path, "x" * 300 + ".onnx")
    else:
        spec = _fifo(tmp_path / "spec.toml")
    res = _within(20, lambda: h.cli("tune", spec, "--dry-run"))
    assert not isinstance(res, BaseException), res
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "Traceback" not in h.said(res)
