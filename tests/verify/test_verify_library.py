"""``dossier.verify.verify``: one library function owns every step of a verification, in the
safety order, and reports each; every outcome of verify's exit-code table is reached through it;
the CLI only prints what it reports (every ``--json`` prints JSON)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import _bundles as h
import pytest

from dossier.errors import (
    BundleError,
    BundleFormatError,
    DiskFullError,
    ExitCode,
    InputError,
    IntegrityError,
    RegistryError,
    SignatureError,
)
from dossier.fingerprint import load_fingerprint
from dossier.verify import (
    Step,
    StepName,
    StepOutcome,
    VerifyOptions,
    VerifyReport,
    refused_report,
    verified,
    verify,
)
from dossier.verify.policy import Verdict

ORDER = [s.value for s in StepName]



def _host(bundle: Path, tmp_path: Path, edit: Any = None) -> Path:
    """The bundle's own tuning host as a fingerprint file, edited (a fleet host elsewhere)."""
    fp = json.loads((bundle / "fingerprint.json").read_text())
    if edit is not None:
        edit(fp)
    path = tmp_path / f"host-{len(list(tmp_path.glob('host-*')))}.json"
    path.write_text(json.dumps(fp))
    return path


def _keys(tmp_path: Path) -> Any:
    from dossier.trust.signing import generate_key_pair

    return {n: generate_key_pair(tmp_path / "keys", n) for n in ("release", "stranger")}


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _refusal(exc: pytest.ExceptionInfo[Any]) -> VerifyReport:
    report = refused_report(exc.value)
    assert report is not None
    assert report.exit_code == int(exc.value.exit_code) and report.error
    assert [s.name.value for s in report.steps] == ORDER  # every step listed, in order
    return report


def _outcomes(report: VerifyReport) -> dict[str, str]:
    return {s.name.value: s.outcome.value for s in report.steps}


# --------------------------------------------------------------------------------- outcomes
def test_valid_lists_every_step_in_order(bundle: Path, tmp_path: Path) -> None:
    seen: list[Step] = []
    report = verify(bundle, VerifyOptions(host=_host(bundle, tmp_path)), on_step=seen.append)
    assert report.verdict is Verdict.VALID and report.exit_code == ExitCode.OK
    assert seen == report.steps and [s.name.value for s in seen] == ORDER
    assert _outcomes(report) == {"fetch": "skipped", "signature": "skipped",
                                 "integrity": "passed", "environment": "passed",
                                 "recheck": "skipped", "rebench": "skipped"}
    assert report.steps[2].detail.startswith("convnet-1 (") and "16 files intact" in \
        report.steps[2].detail
    assert report.findings and report.dossier_id and report.source == str(bundle)


def test_suboptimal_and_invalid(bundle: Path, tmp_path: Path) -> None:
    other_cpu = _host(bundle, tmp_path, lambda fp: fp["cpu"].update(model="Some Other CPU"))
    r = verify(bundle, VerifyOptions(host=other_cpu))
    assert (r.verdict, r.exit_code) == (Verdict.SUBOPTIMAL, ExitCode.SUBOPTIMAL)
    env = r.steps[3]
    assert env.outcome is StepOutcome.WARNED and env.verdict is Verdict.SUBOPTIMAL
    assert "cpu.model" in env.detail
    other_ort = _host(bundle, tmp_path,
                      lambda fp: fp["packages"].update(onnxruntime="1.31.1"))
    r = verify(bundle, VerifyOptions(host=load_fingerprint(other_ort)))  # a model, or a file
    assert (r.verdict, r.exit_code) == (Verdict.INVALID, ExitCode.INVALID)
    assert r.steps[3].outcome is StepOutcome.FAILED and "packages.onnxruntime" in r.reasons[0]
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\npattern = "cpu.model"\nverdict = "VALID"\nreason = "same"\n')
    assert verify(bundle, VerifyOptions(host=other_cpu, policy=policy)).verdict is Verdict.VALID


def test_integrity_only_has_no_verdict_and_reads_no_fingerprint(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dossier.bundle.reader import Bundle

    def boom(*_: object) -> None:
        raise AssertionError("the environment was read")

    monkeypatch.setattr(Bundle, "fingerprint", boom)
    r = verify(bundle, VerifyOptions(integrity_only=True))
    assert r.verdict is None and r.exit_code == 0 and r.findings == []
    assert _outcomes(r)["environment"] == "skipped" and r.integrity


def test_a_flipped_byte_is_refused_at_integrity_naming_the_file(bundle: Path) -> None:
    engine = bundle / "engine" / "convnet.ort"
    _flip(engine)
    with pytest.raises(IntegrityError, match="convnet.ort") as exc:
        verify(bundle, VerifyOptions(recheck=True, rebench=True))
    report = _refusal(exc)
    assert report.exit_code == ExitCode.BUNDLE and report.verdict is None
    step = report.steps[2]
    assert step.outcome is StepOutcome.FAILED and any("engine/convnet.ort" in p
                                                  for p in step.problems)
    assert _outcomes(report)["environment"] == "skipped"
    assert "the integrity step failed" in report.steps[3].detail


def test_unreadable_and_unsafe_bundles(bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleFormatError, match="no such folder or archive") as exc:
        verify(tmp_path / "nowhere")
    assert _refusal(exc).steps[2].outcome is StepOutcome.FAILED
    (bundle / "manifest.json").write_text("{not json")
    with pytest.raises(BundleFormatError) as exc:
        verify(bundle)
    assert _refusal(exc).exit_code == ExitCode.BUNDLE
    evil = tmp_path / "evil.dossier.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../outside.json")
        info.size = 2
        import io

        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(BundleError) as unsafe:  # UnsafeArchiveError: exit 6
        verify(evil)
    assert _refusal(unsafe).exit_code == ExitCode.BUNDLE


def test_signatures(bundle: Path, tmp_path: Path) -> None:
    from dossier.trust.signing import sign_bundle

    keys = _keys(tmp_path)
    required = VerifyOptions(require_signature=True, trusted_keys=(keys["release"].public,),
                             integrity_only=True)
    with pytest.raises(SignatureError, match="is not signed") as exc:
        verify(bundle, required)
    report = _refusal(exc)
    assert report.exit_code == ExitCode.SIGNATURE
    assert _outcomes(report)["signature"] == "failed"
    assert _outcomes(report)["integrity"] == "skipped"  # nothing after a bad signature
    sign_bundle(bundle, keys["release"].private)
    ok = verify(bundle, required)
    assert ok.signature and ok.signature.startswith("signed by trusted key")
    assert _outcomes(ok)["signature"] == "passed"
    with pytest.raises(SignatureError, match="not signed by a trusted key") as exc:
        verify(bundle, VerifyOptions(require_signature=True,
                                     trusted_keys=(keys["stranger"].public,)))
    assert _refusal(exc).exit_code == ExitCode.SIGNATURE
    # a signature beside the bundle is checked even when not required: a changed file fails
    (bundle / "knobs.json").write_bytes(b"{}")
    with pytest.raises(SignatureError, match="knobs.json"):
        verify(bundle)
    # a manifest that no longer parses: what the signature says comes first
    (bundle / "manifest.json").write_text("{not json")
    with pytest.raises(SignatureError, match="manifest.json: BLAKE3 differs") as exc:
        verify(bundle, required)
    assert _outcomes(_refusal(exc))["signature"] == "failed"


def test_bad_input_is_exit_3(bundle: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[[rule]]\npattern = 1\n")
    with pytest.raises(InputError) as exc:
        verify(bundle, VerifyOptions(policy=policy))
    report = _refusal(exc)
    assert report.exit_code == ExitCode.INPUT and _outcomes(report)["environment"] == "failed"
    assert _outcomes(report)["integrity"] == "passed"


def test_an_unreachable_registry_is_exit_20(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("oras", reason="registries need the [oci] extra (oras)")
    monkeypatch.setenv("DOSSIER_REGISTRY_CACHE", str(tmp_path / "cache"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RegistryError, match="unreachable") as exc:
        verify(f"127.0.0.1:{port}/ml/convnet:1", VerifyOptions(insecure=True))
    report = _refusal(exc)
    assert report.exit_code == ExitCode.REGISTRY and _outcomes(report)["fetch"] == "failed"


_FULL_DISK = """
import resource, signal, sys
from dossier.errors import DiskFullError
from dossier.verify import VerifyOptions, refused_report, verify
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
try:
    verify(sys.argv[1], VerifyOptions(extract=True, workdir=sys.argv[2]))
except DiskFullError as exc:
    r = refused_report(exc)
    print(r.exit_code, [s.outcome.value for s in r.steps if s.name.value == "integrity"][0])
"""


def test_no_room_to_extract_an_archive_is_exit_74(bundle: Path, tmp_path: Path) -> None:
    """A file size limit (EFBIG, as a full disk) while an archive is extracted for checking."""
    from dossier.bundle import pack_bundle

    packed = pack_bundle(bundle, tmp_path / "packed")
    work = tmp_path / "work"
    work.mkdir()
    res = subprocess.run([sys.executable, "-c", _FULL_DISK, str(packed), str(work)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.stdout.split() == [str(int(ExitCode.DISK_FULL)), "failed"], res.stderr
    assert list(work.iterdir()) == []  # nothing left behind
    assert DiskFullError.exit_code == ExitCode.DISK_FULL


def test_an_archive_verifies_like_its_folder_and_verified_keeps_it_open(
        bundle: Path, tmp_path: Path) -> None:
    from dossier.bundle import pack_bundle

    packed = pack_bundle(bundle, tmp_path / "packed")
    host = _host(bundle, tmp_path)
    folder, archive = verify(bundle, VerifyOptions(host=host)), verify(packed,
                                                                       VerifyOptions(host=host))
    assert (folder.dossier_id, folder.verdict) == (archive.dossier_id, archive.verdict)
    with verified(packed, VerifyOptions(host=host, extract=True)) as (b, report):
        engine = b.file(b.manifest.engines.shipped.path)
        assert engine.read_bytes() == (bundle / "engine" / "convnet.ort").read_bytes()
        assert report.verdict is Verdict.VALID
    assert not engine.exists()  # the extracted copy is removed with the block


# ------------------------------------------------------------------------------------- CLI
def test_every_json_prints_json(bundle: Path, tmp_path: Path) -> None:
    res = h.cli("verify", bundle, "--integrity-only", "--json")
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["verdict"] is None and [s["name"] for s in data["steps"]] == ORDER
    assert VerifyReport.model_validate(data).integrity
    _flip(bundle / "engine" / "convnet.ort")
    res = h.cli("verify", bundle, "--json")
    assert res.exit_code == ExitCode.BUNDLE
    data = json.loads(res.stdout)
    assert data["exit_code"] == ExitCode.BUNDLE and "convnet.ort" in data["error"]
    assert res.stderr.splitlines()[0].startswith("FAIL: ") and "convnet.ort" in res.stderr
    res = h.cli("verify", tmp_path / "nowhere", "--json")
    assert res.exit_code == ExitCode.BUNDLE and json.loads(res.stdout)["exit_code"] == 6


def cli_verify_calls(source: str) -> tuple[set[str], list[str]]:
    """What a CLI module imports from the library (``module.name``) and the names it calls."""
    tree = ast.parse(source)
    imported = {f"{n.module}.{a.name}" for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("dossier")
                for a in n.names}
    calls = [n.func.id for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return imported, calls


STEP_FUNCTIONS = {"scan_bundle", "check_integrity", "check_signature", "open_bundle",
                  "fetch_bundle", "check_referrer_signatures", "verify_bundle"}


def test_the_cli_holds_no_ordering_logic() -> None:
    """``dossier verify`` calls the library's ``verify`` once and imports none of the steps'
    functions (read from the module's syntax tree, not its text)."""
    ordering = ("from dossier.bundle import open_bundle\nfrom dossier.verify import verify\n"
                "def f(p):\n    with open_bundle(p): pass\n    verify(p)\n")
    imported, calls = cli_verify_calls(ordering)
    assert {i.rpartition(".")[2] for i in imported} & STEP_FUNCTIONS == {"open_bundle"}  # it can fail
    imported, calls = cli_verify_calls((h.REPO / "cli" / "cmd_verify.py").read_text())
    assert "dossier.verify.verify" in imported
    assert not {i.rpartition(".")[2] for i in imported} & STEP_FUNCTIONS, imported
    assert not set(calls) & STEP_FUNCTIONS
    verify_as = {"run_verify"}  # the name cmd_verify imports verify under
    assert sum(c in verify_as for c in calls) == 1


# ------------------------------------------------------------------------------ import cost
_IMPORTED = """
import sys
sys.argv = ["dossier", *sys.argv[1:]]
from dossier_cli.main import main
try:
    main()
except SystemExit:
    pass
"""


def _imported(*args: str) -> tuple[int, set[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(h.REPO), str(h.REPO / ".shim"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", _IMPORTED, *args],
                         capture_output=True, text=True, timeout=120, check=False, env=env)
    names = {ln.split("|")[-1].strip() for ln in res.stderr.splitlines()
             if ln.startswith("import time:") and "|" in ln}
    return len(names), names


def test_verify_of_an_onnxruntime_bundle_imports_neither_the_tuner_nor_scipy(
        bundle: Path, tmp_path: Path) -> None:
    count, names = _imported("verify", str(bundle), "--host-fingerprint",
                             str(_host(bundle, tmp_path)))
    assert count > 50 and "dossier.verify" in names and "dossier.host.policy" in names
    heavy = {"scipy", "dossier.tuner", "pyarrow", "dossier.measure.confirmation",
             "dossier.jobs.worker"}
    assert all(importlib.util.find_spec(m) for m in heavy)  # every name is a real module
    assert not heavy & names, heavy & names
    _, quick = _imported("verify", str(bundle), "--integrity-only")
    assert not {"numpy", "dossier.backends", "dossier.trust.signing", "rich"} & quick


def test_verify_collecting_this_hosts_fingerprint_imports_no_runtime(bundle: Path) -> None:
    """This host's fingerprint collected (in a background thread): no engine library is
    imported, as dossier.load imports one while its checks run."""
    _, names = _imported("verify", str(bundle))
    assert "dossier.verify" in names and "dossier.fingerprint" in names
    runtimes = {n for n in names if n.split(".")[0] in ("onnxruntime", "torch", "tensorrt")}
    assert not runtimes, runtimes
