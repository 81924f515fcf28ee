"""The build plan: routes with the same build-time knob values share a build key, a build's
identity and an engine to reuse; the request factory names that engine and the baseline's."""

from __future__ import annotations

from pathlib import Path

import pytest

from dossier import build_plan
from dossier.backends import get_backend
from dossier.build_plan import BuildPlan
from dossier.cache import TuningCache
from dossier.fingerprint import collect
from dossier.jobs.requests import JobRequests
from dossier.routes import Route
from dossier.run_folder import CACHE_NAME
from dossier.trial import Outcome, TrialRecord
from dossier.tuner import Tuner, prepare

BASE = "-intra_op_num_threads=0 -optimizer:NchwcTransformer=on"
THREADS = "-intra_op_num_threads=1 -optimizer:NchwcTransformer=on"
"""Differs from BASE in a load-time knob only."""
NCHWC = "-intra_op_num_threads=0 -optimizer:NchwcTransformer=off"
"""Differs from BASE in a build-time knob."""


@pytest.fixture(scope="module")
def plan() -> BuildPlan:
    backend = get_backend("onnxruntime")
    return BuildPlan(backend, backend.knob_database(), model_digest="0" * 32,
                     host=collect(include_compiler=False))


def _trial(index: int, route: str, engine: str | None, role: str = "search") -> TrialRecord:
    return TrialRecord(index=index, route=route, role=role, outcome=Outcome.OK, trial_s=1.0,
                       started_at="2026-01-01T00:00:00+00:00", engine=engine,
                       extra={"optimized_model_bytes": "123"})


def test_routes_differing_only_in_load_time_knobs_share_a_build(plan: BuildPlan) -> None:
    db = plan.db
    base, threads, nchwc = (Route.parse(r, db) for r in (BASE, THREADS, NCHWC))
    assert plan.key(base) == plan.key(threads) != plan.key(nchwc)
    assert ("optimizer:NchwcTransformer", "on") in plan.key(base)
    assert not any(k == "intra_op_num_threads" for k, _ in plan.key(base))
    assert plan.identity(base) == plan.identity(threads)
    assert plan.identity(base).key() != plan.identity(nchwc).key()
    assert plan.engine_name(7) == "trial-0007.ort"


def test_the_identity_names_every_build_input(plan: BuildPlan) -> None:
    route = Route.parse(BASE, plan.db)
    other = BuildPlan(plan.backend, plan.db, model_digest="1" * 32,
                      host=collect(include_compiler=False))
    assert other.identity(route).key() != plan.identity(route).key()  # another model
    shaped = BuildPlan(plan.backend, plan.db, model_digest="0" * 32, builder={"x": 1},
                       host=collect(include_compiler=False))
    assert shaped.identity(route).builder == {"x": 1}
    assert shaped.identity(route).key() != plan.identity(route).key()


def test_the_host_is_collected_once_and_only_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                        plan: BuildPlan) -> None:
    calls: list[dict[str, object]] = []
    real = build_plan.collect

    def counting(**kw):  # type: ignore[no-untyped-def]
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(build_plan, "collect", counting)
    lazy = BuildPlan(plan.backend, plan.db, model_digest="0" * 32)
    assert calls == []
    route = Route.parse(BASE, plan.db)
    assert lazy.identity(route) == lazy.identity(Route.parse(THREADS, plan.db))
    assert calls == [{"include_compiler": plan.backend.fingerprint_compiler}]
    assert lazy.identity(route) == plan.identity(route)


def test_reuse_takes_an_earlier_engine_with_the_same_build_key(plan: BuildPlan,
                                                               tmp_path: Path) -> None:
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "trial-0001.ort").write_bytes(b"e")
    trials = [_trial(0, BASE, "engines/trial-0000.ort", "baseline"),  # its file is gone
              _trial(1, BASE, "engines/trial-0001.ort"),
              _trial(2, NCHWC, None)]
    threads, nchwc = Route.parse(THREADS, plan.db), Route.parse(NCHWC, plan.db)
    assert plan.reuse(threads, trials, tmp_path) is trials[1]
    assert plan.reuse(nchwc, trials, tmp_path) is None  # a build knob differs
    assert plan.reuse(threads, trials[:1], tmp_path) is None  # no engine file to take
    confirm = _trial(1, BASE, "engines/trial-0001.ort", "confirm")
    assert plan.reuse(threads, [confirm], tmp_path) is None  # a confirmation's is not a build
    assert plan.reused_facts(trials[1]) == {"optimized_model_bytes": "123",
                                            "reused_engine": "trial-0001.ort"}


def test_the_request_factory_names_the_baseline_and_the_reused_engine(sample,
                                                                     tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast",
                     selection="-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]")
    from dossier.tuner.resume import header  # the header a search writes first

    p = prepare(spec)
    run = tmp_path / "run"
    run.mkdir()
    cache = TuningCache.create(run / CACHE_NAME, header(p, None, [], None))
    tuner = Tuner(p, run, cache)
    requests: JobRequests = tuner.requests
    first = requests.trial(p.baseline, 0, "baseline")
    assert first.req.mode == "trial" and first.req.baseline_engine is None
    assert first.reuse is None and first.req.prebuilt is None
    assert requests.baseline_engine() is None and requests.recorded() == 0
    base = tuner.run_trial(p.baseline, "baseline")
    assert base.outcome is Outcome.OK and base.engine == "engines/trial-0000.ort"
    assert requests.baseline_engine() == run / "engines" / "trial-0000.ort"
    load_only = Route.parse("-intra_op_num_threads=1", p.db)
    job = requests.trial(load_only, 1, "search")
    assert job.req.baseline_engine == str(run / "engines" / "trial-0000.ort")
    assert job.reuse == run / "engines" / "trial-0000.ort"
    assert job.req.prebuilt is not None and job.req.prebuilt.build_s is None
    assert job.req.prebuilt.facts["reused_engine"] == "trial-0000.ort"
    assert job.req.engine == str(run / "engines" / "trial-0001.ort")
    rebuilt = requests.trial(Route.parse("-optimizer:NchwcTransformer=off", p.db), 1, "search")
    assert rebuilt.reuse is None and rebuilt.req.prebuilt is None
    build = requests.build(load_only, tmp_path / "b" / "trial-0001.ort")
    assert build.mode == "build" and build.route == load_only.text()
    reused = tuner.run_trial(load_only, "search")
    assert reused.extra["reused_engine"] == "trial-0000.ort" and reused.build_s is None
    assert (run / "engines" / "trial-0001.ort").read_bytes() == \
        (run / "engines" / "trial-0000.ort").read_bytes()
    tuner.scheduler.close()  # what tune() does after a search: its fork server ends
