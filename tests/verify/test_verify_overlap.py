"""``verify`` collects this host's fingerprint in a background thread while the bundle is
checked and ``prepare_backend`` runs with the bundle's backend (``dossier.load`` imports its
runtime there): the two overlap, the report is that of the sequential path, what the thread
raises is raised at the environment step, no thread outlives the verification, and what the
fingerprint records does not depend on what the calling thread imports meanwhile.

Every wait has a timeout: an overlap that does not happen fails, never hangs."""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import dossier.fingerprint
import dossier.verify.pipeline
from dossier.backends import Backend
from dossier.errors import ExitCode, InputError, IntegrityError
from dossier.fingerprint import Fingerprint, load_fingerprint
from dossier.host.policy import Verdict
from dossier.verify import StepOutcome, VerifyOptions, VerifyReport, refused_report, verify

WAIT_S = 20.0
"""Longest wait for the other thread (a loaded 2-core CI host included)."""
THREAD = "dossier-fingerprint"



def _tuning_host(bundle: Path) -> Fingerprint:
    return load_fingerprint(bundle / "fingerprint.json")


def _no_thread_left() -> bool:
    return not any(t.name.startswith(THREAD) for t in threading.enumerate())


def _sequential(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the path of earlier versions: nothing collected before the environment step."""
    monkeypatch.setattr(dossier.verify.pipeline, "_compiler_recorded", lambda _bundle: None)


def _comparable(report: VerifyReport) -> dict[str, Any]:
    return report.model_dump(mode="json")


# ------------------------------------------------------------------------------- overlap
def test_the_fingerprint_is_collected_while_the_backend_is_prepared(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector waits for the hook and the hook for the collector: run one after the
    other, either wait would time out and the test fail."""
    collecting, prepared = threading.Event(), threading.Event()
    threads: dict[str, str] = {}

    def collector(**kw: Any) -> Fingerprint:
        threads["collector"] = threading.current_thread().name
        collecting.set()
        if not prepared.wait(WAIT_S):
            raise AssertionError("collected after the backend was prepared, not meanwhile")
        return _tuning_host(bundle)

    def prepare(backend: Backend) -> None:
        threads["hook"] = threading.current_thread().name
        assert backend.name == "onnxruntime"
        if not collecting.wait(WAIT_S):
            raise AssertionError("the fingerprint was not being collected meanwhile")
        prepared.set()

    monkeypatch.setattr(dossier.verify.pipeline, "collect", collector)
    t0 = time.monotonic()
    report = verify(bundle, VerifyOptions(prepare_backend=prepare))
    assert time.monotonic() - t0 < WAIT_S
    assert threads["hook"] == threading.current_thread().name  # the calling thread
    assert threads["collector"].startswith(THREAD)
    assert report.verdict is not None and report.exit_code == report.verdict.exit_code
    assert _no_thread_left()


def test_the_report_is_that_of_the_sequential_path(bundle: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """This host's real fingerprint, collected in the background or at the environment step
    (as earlier versions did): the same findings, verdict, reasons and steps."""
    calls: list[Backend] = []
    overlapped = verify(bundle, VerifyOptions(prepare_backend=calls.append))
    assert [b.name for b in calls] == ["onnxruntime"]
    _sequential(monkeypatch)
    sequential = verify(bundle)
    assert _comparable(overlapped) == _comparable(sequential)
    assert overlapped.findings and overlapped.steps[3].name.value == "environment"


def test_a_fingerprint_of_a_tuning_host_changed_after_the_peek_is_collected_anew(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The early start reads fingerprint.json before the checks; the environment step
    decides again on the checked file and, where the two disagree, collects anew."""
    asked: list[bool] = []
    real = dossier.verify.pipeline.collect

    def recording(**kw: Any) -> Fingerprint:
        asked.append(kw["include_compiler"])
        return real(**kw)

    monkeypatch.setattr(dossier.verify.pipeline, "collect", recording)
    monkeypatch.setattr(dossier.verify.pipeline, "_compiler_recorded", lambda _bundle: True)
    assert _tuning_host(bundle).compiler is None  # an ONNX Runtime bundle's
    report = verify(bundle)
    assert asked == [True, False]  # the early guess discarded
    finding = {f.field: f for f in report.findings}["compiler"]
    assert finding.host_value is None  # collected without the compiler, as the bundle asks
    assert _no_thread_left()


def test_the_peek_reads_only_a_regular_file_of_its_recorded_size(bundle: Path) -> None:
    from dossier.bundle import open_bundle

    with open_bundle(bundle) as b:
        assert dossier.verify.pipeline._compiler_recorded(b) is False
    fp = bundle / "fingerprint.json"
    data = json.loads(fp.read_text())
    data["compiler"] = "g++ 99"
    fp.write_text(json.dumps(data))  # another size than the manifest's: not read early
    with open_bundle(bundle) as b:
        assert dossier.verify.pipeline._compiler_recorded(b) is None
    fp.unlink()
    fp.symlink_to(bundle / "manifest.json")
    with open_bundle(bundle) as b:
        assert dossier.verify.pipeline._compiler_recorded(b) is None


# ----------------------------------------------------------------------- what it records
def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(cuda="12.4")  # type: ignore[attr-defined]
    return torch


@pytest.mark.parametrize("before", [False, True], ids=["torch-imported-meanwhile",
                                                       "torch-imported-by-the-caller"])
def test_cuda_runtime_does_not_depend_on_an_import_during_the_collection(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, before: bool) -> None:
    """``cuda_runtime`` falls back on an already imported torch. The hook imports a torch
    stand-in while the collection runs (the collector waits until it has): the field is what
    the sequential path records with no hook, i.e. what the caller had imported when the
    verification began."""
    real_packages = dossier.fingerprint._packages
    monkeypatch.setattr(dossier.fingerprint, "_packages", lambda: {
        k: v for k, v in real_packages().items() if not k.startswith("nvidia-cuda-runtime")})
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    if before:
        monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    imported = threading.Event()
    got: list[Fingerprint] = []
    real = dossier.verify.pipeline.collect

    def after_the_import(**kw: Any) -> Fingerprint:
        if threading.current_thread().name.startswith(THREAD) and not imported.wait(WAIT_S):
            raise AssertionError("the hook did not run while the fingerprint was collected")
        got.append(real(**kw))
        return got[-1]

    def import_torch(_backend: Backend) -> None:
        monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or _fake_torch())
        imported.set()

    monkeypatch.setattr(dossier.verify.pipeline, "collect", after_the_import)
    overlapped = verify(bundle, VerifyOptions(prepare_backend=import_torch))
    assert "torch" in sys.modules  # imported during the collection
    if not before:
        monkeypatch.delitem(sys.modules, "torch")
    _sequential(monkeypatch)
    sequential = verify(bundle)
    assert len(got) == 2
    want = "12.4" if before else None
    assert got[0].cuda_runtime == got[1].cuda_runtime == want
    assert _comparable(overlapped) == _comparable(sequential)


def test_collect_reads_torch_from_the_modules_it_is_given() -> None:
    torch = _fake_torch()
    assert dossier.fingerprint._torch_cuda({"torch": torch}) == "12.4"
    assert dossier.fingerprint._torch_cuda({}) is None
    assert dossier.fingerprint.imported_now() == (
        {"torch": sys.modules["torch"]} if sys.modules.get("torch") is not None else {})


# ------------------------------------------------------------------------------- failures
@pytest.mark.parametrize("error", [InputError("no fingerprint here"),
                                   RuntimeError("collector crashed")],
                         ids=lambda e: type(e).__name__)
def test_what_the_collector_raises_is_raised_at_the_environment_step(
        bundle: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def collector(**kw: Any) -> Fingerprint:
        raise error

    monkeypatch.setattr(dossier.verify.pipeline, "collect", collector)
    reports = []
    for run in ("overlapped", "sequential"):
        if run == "sequential":
            _sequential(monkeypatch)
        with pytest.raises(type(error)) as raised:
            verify(bundle)
        assert raised.value is error
        assert _no_thread_left()
        reports.append(refused_report(raised.value))
    if isinstance(error, InputError):
        report = reports[0]
        assert report is not None and report.exit_code == ExitCode.INPUT
        env = {s.name.value: s for s in report.steps}["environment"]
        assert env.outcome is StepOutcome.FAILED and "no fingerprint here" in env.detail
        assert reports[1] is not None and _comparable(report) == _comparable(reports[1])
    else:
        assert reports == [None, None]  # not a refusal: raised as it was


def test_a_refusal_before_the_environment_step_leaves_no_thread(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flipped engine byte: refused at integrity while the collector is still busy; the
    verification returns only once it is done, its result (or error) never taken."""
    started, finished = threading.Event(), threading.Event()

    def slow(**kw: Any) -> Fingerprint:
        started.set()
        time.sleep(0.3)
        finished.set()
        raise AssertionError("never taken")

    monkeypatch.setattr(dossier.verify.pipeline, "collect", slow)
    engine = bundle / "engine" / "convnet.ort"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="convnet.ort") as exc:
        verify(bundle, VerifyOptions(prepare_backend=lambda _: started.wait(WAIT_S)))
    assert started.is_set() and finished.is_set() and _no_thread_left()
    report = refused_report(exc.value)
    assert report is not None and report.exit_code == ExitCode.BUNDLE
    assert {s.name.value: s.outcome for s in report.steps}["environment"] is StepOutcome.SKIPPED


def test_no_collection_without_an_environment_step(bundle: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(**kw: Any) -> Fingerprint:
        raise AssertionError("collected")

    monkeypatch.setattr(dossier.verify.pipeline, "collect", boom)
    assert verify(bundle, VerifyOptions(integrity_only=True)).verdict is None
    host = _tuning_host(bundle)
    assert verify(bundle, VerifyOptions(host=host)).verdict is not None


# ---------------------------------------------------------------------- the backend handed
def test_a_backend_not_known_here_is_not_handed_and_is_refused_as_before(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle names a backend this host does not register: ``prepare_backend`` is not
    called, and the environment step finds the bundle INVALID in one line (a bundle naming a
    backend that is not a shipped one is never served)."""
    from dossier.backends import registry

    known = registry._known()
    monkeypatch.setattr(registry, "_known",
                        lambda: {k: v for k, v in known.items() if k != "onnxruntime"})
    calls: list[Backend] = []
    report = verify(bundle, VerifyOptions(prepare_backend=calls.append,
                                          host=_tuning_host(bundle)))
    assert calls == []
    assert report.verdict is Verdict.INVALID
    assert report.reasons[0].startswith("backend: onnxruntime -> not served: 'onnxruntime' is "
                                        "not a shipped backend")
    assert {s.name.value: s.outcome for s in report.steps}["environment"] is StepOutcome.FAILED


def test_a_backend_that_fails_to_import_is_not_handed_and_the_checks_come_first(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend package that fails to import ahead of the checks: no hook call, and a
    flipped engine byte is still refused at integrity (the import error comes at the
    environment step, as without a hook)."""
    from dossier.backends import registry

    def broken(name: str, target: object) -> Backend:
        raise ImportError("No module named 'plugin'")

    monkeypatch.setattr(registry, "_load", broken)
    calls: list[Backend] = []
    options = VerifyOptions(prepare_backend=calls.append, host=_tuning_host(bundle))
    with pytest.raises(ImportError, match="plugin"):
        verify(bundle, options)
    engine = bundle / "engine" / "convnet.ort"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="convnet.ort"):
        verify(bundle, options)
    assert calls == []
