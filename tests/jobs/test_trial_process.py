"""The trial process takes the search's knob database from its request instead of reading the
backend's again (ONNX Runtime's probe imports onnx and opens a session: it cost more than the
build of a trial)."""

from __future__ import annotations

from pathlib import Path

from conftest import TINY_TIMING

from dossier.backends import get_backend
from dossier.jobs.child import run_child
from dossier.jobs.worker import JudgedResult, WorkerRequest
from dossier.routes import Route

ROUTE = "-intra_op_num_threads=1"
"""A route that leaves graph_optimization_level at its default."""


def _trial(sample_dir: Path, work: Path, **kw: object) -> WorkerRequest:
    work.mkdir(parents=True, exist_ok=True)
    return WorkerRequest(mode="trial", backend="onnxruntime", model=str(sample_dir / "model.onnx"),
                         validation=str(sample_dir / "validation"), metric="linf",
                         threshold=1e-4, atol=0.0, rtol=0.0, timing=TINY_TIMING,
                         timeout_s=120.0, baseline_route=ROUTE, route=ROUTE, engine=str(work / "engine.ort"),
                         result=str(work / "result.json"), stage=str(work / "stage"),
                         **kw)  # type: ignore[arg-type]


def test_a_trial_process_uses_the_knob_database_of_its_request(sample, tmp_path: Path) -> None:
    spec_path, _ = sample("convnet")
    db = get_backend("onnxruntime").knob_database()
    real = db.get("graph_optimization_level").default
    other = next(v for v in db.get("graph_optimization_level").values or () if v != real)
    # the same database with another default: only a process that took it builds at that level
    changed = db.model_copy(update={"knobs": tuple(
        k.model_copy(update={"default": other}) if k.name == "graph_optimization_level" else k
        for k in db.knobs)})
    given = run_child(_trial(spec_path.parent, tmp_path / "given", knobs=changed),
                      tmp_path / "given", "trial")
    own = run_child(_trial(spec_path.parent, tmp_path / "own"), tmp_path / "own", "trial")
    assert isinstance(given, JudgedResult) and isinstance(own, JudgedResult), (given, own)
    assert given.facts["optimization_level"] == other
    assert own.facts["optimization_level"] == real
    assert Route.parse(ROUTE).effective(changed)["graph_optimization_level"] == other


def test_the_search_sends_its_knob_database_with_every_trial(sample, tmp_path: Path,
                                                             monkeypatch) -> None:
    from dossier.jobs import child
    from dossier.tuner import tune

    sent: list[WorkerRequest] = []
    start = child.Child.__init__

    def recording(self, req: WorkerRequest, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        sent.append(req)
        start(self, req, *args, **kw)

    monkeypatch.setattr(child.Child, "__init__", recording)
    _, spec = sample("convnet", strategy="full", selection="-intra_op_num_threads=[0|1]")
    result = tune(spec, tmp_path / "run")
    db = get_backend("onnxruntime").knob_database()
    assert len(sent) >= 2  # the baseline and the one search trial, at least
    for req in sent:
        assert req.knobs is not None and req.knobs.digest() == db.digest()
    assert result.cache.header.knob_db_digest == db.digest()
