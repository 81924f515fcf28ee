"""The confirmation: measuring processes that each hold the baseline, its A/A load and the
candidates; the sequential design's error rates and power on simulated processes; end to end on
the convnet sample and on the faulty backend's known gain; verify --rebench's judgement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import _bundles as h
import numpy as np
import pytest
from _records import STARTED, Simulated, screened

from dossier.backends import Backend, get_backend
from dossier.decision import decide
from dossier.errors import TuneError
from dossier.jobs import measuring
from dossier.measure import confirmation
from dossier.measure.timing import PROCESS_TEST, TimingSettings
from dossier.routes import Route
from dossier.trial import Comparison, TimingSummary
from dossier.tuner import Tuner, prepare
from dossier.validation import load_validation_set
from dossier.verify import judge_speedup

FAST = "-graph_optimization_level=all"
SLOW = "-graph_optimization_level=disable_all"  # no Conv+BN fusion, no NCHWc: several x slower
SETTINGS = TimingSettings(confirm_rounds=4, confirm_warmup=2, confirm_runs=10,
                          confirm_block_s=0.02, warmup_max_s=0.3, warmup_window=3,
                          confirm_processes=3, confirm_max_processes=3)
BASE = (Path("base"), "-a=x")
PACED = "-fault=none -pace=clock"
"""The faulty backend's baseline on its clock (2.0 ms a run, read the same on any host)."""
SLOWED = "-fault=slow -pace=clock"
"""Its ``slow`` fault on the clock: 2 ms more a run, a known 0.5x."""


def _built(backend: str, routes: tuple[str, ...], model: Path, out: Path) -> dict[str, Path]:
    """Each route of ``routes`` built by ``backend`` into ``out``: its engine's path."""
    paths = {}
    for route in routes:
        paths[route] = out / f"{len(paths)}.ort"
        get_backend(backend).build(model, Route.parse(route), paths[route])
    return paths


@pytest.fixture(scope="module")
def engines(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _built("onnxruntime", (FAST, SLOW), samples_dir / "convnet" / "model.onnx",
                  tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="module")
def clocked(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The faulty backend's engines of :data:`PACED` and :data:`SLOWED`."""
    return _built("faulty", (PACED, SLOWED), samples_dir / "convnet" / "model.onnx",
                  tmp_path_factory.mktemp("clocked"))


def _run(speedups: dict[str, float], settings: TimingSettings = TimingSettings(),
         seed: int = 0, **model: float) -> confirmation.Confirmation:
    cands = [(Path(r), r) for r in speedups]
    return confirmation.confirm(BASE, cands, settings, Simulated(speedups, seed=seed, **model))  # type: ignore[arg-type]


def test_looks_and_the_level_per_look() -> None:
    s = TimingSettings()
    assert s.looks() == [3, 5, 8, 12, 18, 20]
    assert s.look_level(3) == pytest.approx(0.05 / 18)
    assert TimingSettings(confirm_processes=4, confirm_max_processes=4).looks() == [4]
    assert TimingSettings(confirm_processes=1).problems()  # a t-test needs two processes
    assert TimingSettings(confirm_processes=6, confirm_max_processes=5).problems()


def test_a_real_3x_gain_whose_size_depends_on_the_process_ships_at_the_first_look() -> None:
    """The H200 case (under the GPU timing defaults): the CUDA-graph route gained 2.2x to 3.7x
    depending on the process, and each process ran at one of two speeds. Paired inside the
    process, the state cancels."""
    shipped = covered = 0
    gpu = TimingSettings(**Backend.GPU_TIMING)  # type: ignore[arg-type]
    for seed in range(40):
        r = _run({"-a=g": 2.6}, gpu, seed=seed, state_sd=0.3, gain_sd=0.15)
        c = r.candidates[0].comparison
        assert c is not None and c.test == PROCESS_TEST and c.against == "aa"
        if r.candidates[0].status == "confirmed":
            shipped += 1
            first = gpu.confirm_processes
            assert r.processes == first and r.candidates[0].look == first  # the first look
            assert c.speedup_ci_low > 1.5 and c.prediction_low is not None
            assert c.prediction_low < c.speedup_ci_low < c.speedup < c.speedup_ci_high
            covered += c.speedup_ci_low <= 2.6 <= c.speedup_ci_high
    assert shipped == 40 and covered >= 35


def test_an_aa_candidate_never_ships_however_noisy_the_processes() -> None:
    found = [_run({"-a=twin": 1.0}, seed=seed, state_sd=0.5, block_sd=0.1).candidates[0]
             for seed in range(100)]
    assert not any(t.status == "confirmed" for t in found)
    # most are dropped early as futile: their interval lies below the minimum effect
    assert sum(t.status == "futile" for t in found) > 50


def test_stopping_early_keeps_the_false_positive_rate_where_re_testing_does_not() -> None:
    """At the null's edge (a true gain of exactly the minimum effect), re-testing a fixed-n
    test at alpha after every process ships far more often than alpha; the looks at
    alpha/(k x L) do not."""
    s = TimingSettings(confirm_processes=3, confirm_max_processes=20)
    edge = math.exp(math.log1p(s.min_effect))
    naive = ours = 0
    runs = 400
    for seed in range(runs):
        r = _run({"-a=edge": edge}, s, seed=seed, block_sd=0.05, state_sd=0.0)
        ours += r.candidates[0].status == "confirmed"
        logs = r.candidates[0].logs  # all its processes when nothing stopped it early
        from dossier.measure.timing import process_stats
        sim = Simulated({"-a=edge": edge}, seed=10_000 + seed, block_sd=0.05, state_sd=0.0)
        xs: list[float] = []
        for n in range(20):
            run = sim([BASE, BASE, (Path("e"), "-a=edge")], n)
            from dossier.measure.timing import process_log
            xs.append(process_log(run.rounds[0], run.rounds[2], 0.95)
                      - process_log(run.rounds[0], run.rounds[1], 0.95))
            if n >= 2 and process_stats(xs, 0.95, bound=math.log1p(s.min_effect)).p_value < s.alpha:
                naive += 1
                break
        assert logs
    assert ours / runs <= s.alpha
    assert naive / runs > 2 * s.alpha


def test_a_five_percent_gain_ships_a_two_percent_one_is_not_claimed() -> None:
    five = [_run({"-a=f": 1.05}, seed=s, state_sd=0.2, block_sd=0.02).candidates[0].status
            for s in range(30)]
    assert five.count("confirmed") >= 27
    small = [_run({"-a=s": 1.01}, seed=s, block_sd=0.02).candidates[0].status for s in range(30)]
    assert small.count("confirmed") == 0


def test_every_candidate_is_decided_or_the_cap_says_so() -> None:
    r = _run({"-a=g": 3.0, "-a=t": 1.0, "-a=n": 1.03}, seed=1, block_sd=0.08)
    status = {t.route: t.status for t in r.candidates}
    assert status["-a=g"] == "confirmed" and status["-a=t"] in ("futile", "outranked")
    assert r.level == pytest.approx(0.05 / (3 * len(TimingSettings().looks())))
    if status["-a=n"] == "undecided":
        assert r.processes == 20 and "cap" in r.stopped and "1 candidate(s) undecided" in r.stopped
    else:
        assert "every candidate was decided" in r.stopped
    assert r.aa.comparison is not None and r.aa.comparison.against == "baseline"
    assert r.aa.comparison.processes == r.processes


def test_decided_candidates_leave_the_later_processes() -> None:
    speedups = {"-a=g": 3.0, "-a=n": 1.03}
    sim = Simulated(speedups, seed=3, block_sd=0.05)
    # the confirmed route may not ship (say, it failed the hold-out set): it outranks nothing
    asked: list[str] = []
    r = confirmation.confirm(BASE, [(Path(k), k) for k in speedups], TimingSettings(), sim,
                             may_ship=lambda route: asked.append(route) is not None)
    assert asked[0] == "-a=g" and len(asked) == len(set(asked))  # once each, at most
    first_look = TimingSettings().confirm_processes
    assert r.candidates[1].status != "outranked" and r.processes > first_look
    first, last = sim.calls[0], sim.calls[-1]
    assert first == ["-a=x", "-a=x", "-a=g", "-a=n"]  # baseline, its A/A load, candidates
    assert "-a=g" not in last and len(sim.calls) == r.processes
    assert len(r.candidates[0].logs) == first_look and len(r.aa.logs) == r.processes


def test_a_candidate_below_a_confirmed_one_is_outranked_and_stops_holding_the_measurement(
        ) -> None:
    """The tblock case: dynamic int8 confirmed at 1.6x at the first look, static int8 at 1.04x
    [1.02, 1.07] undecided; it could not ship past the confirmed route, so it does not hold the
    measurement to the cap of 20 processes."""
    outranked = 0
    for seed in range(20):
        r = _run({"-a=g": 1.6, "-a=n": 1.02}, seed=seed, block_sd=0.1)
        g, n = r.candidates
        first = TimingSettings().confirm_processes
        assert g.status == "confirmed" and g.comparison is not None and g.look == first
        assert r.processes == first
        if n.status != "outranked":  # confirmed at the first look: a 2% gain may be
            assert n.status == "confirmed"
            continue
        outranked += 1
        assert n.outranked_by == "-a=g" and n.look == g.look
        assert n.comparison is not None
        assert n.comparison.speedup_ci_high < g.comparison.speedup_ci_low
        assert r.processes == g.look and "every candidate was decided" in r.stopped
        settings = TimingSettings()
        recs = confirmation.records(
            r, screened(0, "-a=x", 1.0, settings, role="baseline"),
            [screened(1, "-a=g", 1.6, settings), screened(2, "-a=n", 1.04, settings)],
            settings, 3, STARTED)
        assert recs[2].extra == {"confirmation": "outranked", "decided_at": str(n.look),
                                 "outranked_by": "-a=g"}
    assert outranked >= 17
    # without a confirmed route that may ship, the same candidate holds the measurement
    held = confirmation.confirm(BASE, [(Path(k), k) for k in ("-a=g", "-a=n")],
                                TimingSettings(), Simulated({"-a=g": 1.6, "-a=n": 1.02},
                                                            seed=1, block_sd=0.1),
                                may_ship=lambda route: False)
    assert held.candidates[1].status == "undecided" and held.processes == 20
    # intervals that overlap: the faster of two routes 10% apart is never outranked
    for seed in range(10):
        r = _run({"-a=g": 1.30, "-a=h": 1.45}, seed=seed, gain_sd=0.2, block_sd=0.02)
        assert r.candidates[1].status == "confirmed"


def test_a_candidate_no_faster_than_a_confirmed_one_paired_by_process_is_outranked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tblock sample's case: two int8 routes 6% apart, the host's state moving both alike
    from process to process, each one's interval wide and overlapping the other's. Paired
    process by process with the confirmed one, the slower is not faster than it by the
    minimum effect, and stops holding the measurement: never more processes than without the
    pairing, fewer in many releases, and the same route confirmed."""
    speeds = {"-a=g": 1.25, "-a=h": 1.18}
    paired = [_run(speeds, seed=seed, gain_sd=0.1, block_sd=0.02) for seed in range(20)]
    monkeypatch.setattr(confirmation, "paired_high", lambda *a: None)
    apart = [_run(speeds, seed=seed, gain_sd=0.1, block_sd=0.02) for seed in range(20)]
    bound = math.log1p(TimingSettings().min_effect)
    fewer = 0
    for a, b in zip(paired, apart):
        assert a.processes <= b.processes
        assert a.candidates[0].status == b.candidates[0].status == "confirmed"
        if a.processes == b.processes:
            continue
        fewer += 1
        g, h = a.candidates
        assert h.status == "outranked" and h.outranked_by == "-a=g" and h.look == a.processes
        assert h.comparison is not None and g.comparison is not None
        assert h.comparison.speedup_ci_high >= g.comparison.speedup_ci_low  # overlapping
        n = min(len(h.logs), len(g.logs))
        d = np.subtract(h.logs[:n], g.logs[:n])
        from scipy import stats
        high = d.mean() + stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
        assert high < bound
    assert fewer >= 5


def test_a_confirmation_frees_its_share_of_alpha_for_the_candidates_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tblock case with threads searched: three int8 routes of about the same gain, each
    read with noise of its own on a noisy host. Once one is confirmed the others are tested again at that look at alpha / (m x L),
    m the candidates not confirmed yet (Holm's step-down), and at later looks at that level
    from the start: never more processes than at alpha / (k x L) throughout, fewer in many
    releases, each time because a route was confirmed by the freed share alone (its p between
    the strict level and the one its comparison records)."""
    speeds = {"-a=g": 1.6, "-a=h": 1.55, "-a=i": 1.5}
    s = TimingSettings()
    strict = s.look_level(3)
    holm = [_run(speeds, seed=seed, gain_sd=0.05, block_sd=0.15) for seed in range(30)]
    monkeypatch.setattr(TimingSettings, "look_level", lambda self, m: strict)
    bonferroni = [_run(speeds, seed=seed, gain_sd=0.05, block_sd=0.15) for seed in range(30)]
    fewer = freed = 0
    for a, b in zip(holm, bonferroni):
        assert a.processes <= b.processes
        assert a.level == b.level == strict
        fewer += a.processes < b.processes
        for t in a.candidates:
            c = t.comparison
            assert c is not None and c.level is not None
            if t.status == "confirmed":
                assert c.p_value < c.level
                if c.level > strict:  # tested after another was confirmed
                    assert c.level in (s.alpha / (2 * len(s.looks())), s.alpha / len(s.looks()))
                    freed += c.p_value > strict  # confirmed by the freed share alone
    assert fewer >= 5 and freed >= fewer


def test_with_the_freed_alpha_a_candidate_without_the_gain_is_still_confirmed_at_most_at_alpha(
        ) -> None:
    """A real 3x gain confirmed first frees its share; two candidates at the null's edge (a
    gain of exactly the minimum effect) are then tested at alpha / (2 x L) and alpha / L: the
    chance that either is confirmed stays under alpha."""
    s = TimingSettings()
    edge = math.exp(math.log1p(s.min_effect))
    runs, wrong, first = 300, 0, 0
    for seed in range(runs):
        r = _run({"-a=g": 3.0, "-a=e": edge, "-a=f": edge}, s, seed=seed, block_sd=0.05,
                 state_sd=0.0)
        g, e, f = r.candidates
        first += g.status == "confirmed"
        wrong += e.status == "confirmed" or f.status == "confirmed"
    assert first == runs
    assert wrong / runs <= s.alpha


def test_fixed_processes_decide_once_at_the_end() -> None:
    r = confirmation.confirm(BASE, [(Path("c"), "-a=t")], TimingSettings(),
                             Simulated({"-a=t": 1.0}, seed=2), fixed=4)
    assert r.processes == 4 and r.looks == [4] and r.candidates[0].status == "undecided"
    assert r.level == 0.05


def test_measuring_processes_find_a_known_slowdown(clocked: dict[str, Path], samples_dir: Path,
                                                  tmp_path: Path) -> None:
    """The faulty backend's ``slow`` fault on its clock: a known 0.5x, read the same on a busy
    host as on a quiet one."""
    settings = SETTINGS.model_copy(update={"confirm_prestart": True})  # not ORT's default
    measure = measuring.local_processes("faulty", samples_dir / "convnet" / "validation",
                                        settings, work=tmp_path / "w")
    r = confirmation.confirm((clocked[PACED], PACED), [(clocked[SLOWED], SLOWED)], settings,
                             measure)
    assert r.processes == 3 and sorted(p.name for p in (tmp_path / "w").glob("*.log")) == [
        "measure-0.log", "measure-1.log", "measure-2.log"]
    c = r.candidates[0].comparison
    assert c is not None and c.speedup == pytest.approx(0.5, rel=0.03) and not c.faster
    assert r.candidates[0].status == "futile"  # slower: it can never reach the minimum effect
    assert len(r.candidates[0].samples) == 3 * SETTINGS.confirm_rounds  # rounds of 3 processes
    # the A/A is a second load of the baseline: two loads read alike
    assert r.aa.comparison is not None and r.aa.route == PACED
    assert r.aa.comparison.speedup == pytest.approx(1.0, abs=0.03)
    # each process but the last started its successor on standby and waited for its imports
    # before timing; the successors waited for their turns
    assert r.phases_s["standby"] > 0 and r.phases_s["wait"] >= 0
    assert r.phases_s["process"] <= r.wall_s and r.phases_s["time"] > 0


def test_a_measuring_process_that_died_on_standby_is_replaced(
        engines: dict[str, Path], samples_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that ended on standby (here: killed just as its turn came) measured nothing:
    a new process measures in its place, and the confirmation goes on to its looks."""
    from test_trial_prestart import _killed_at_go

    killed = _killed_at_go(monkeypatch)
    settings = SETTINGS.model_copy(update={"confirm_prestart": True})
    measure = measuring.local_processes("onnxruntime", samples_dir / "convnet" / "validation",
                                           settings, work=tmp_path / "w")
    r = confirmation.confirm((engines[FAST], FAST), [(engines[SLOW], SLOW)], settings, measure)
    assert killed == ["measure-1", "measure-2"] and r.processes == 3
    assert len(r.aa.logs) == 3 and len(r.candidates[0].logs) == 3
    assert "standby" not in r.phases_s  # every reading came from a process started at its turn


@pytest.mark.parametrize("prestart", [False, None], ids=["off", "onnxruntime-default"])
def test_without_prestart_each_process_starts_at_its_turn(engines: dict[str, Path],
                                                          samples_dir: Path, tmp_path: Path,
                                                          prestart: bool | None) -> None:
    """ONNX Runtime's loads take milliseconds: starting a successor ahead would save no more
    than that, so its confirmation starts each process at its turn unless told otherwise."""
    settings = SETTINGS.model_copy(update={"confirm_prestart": prestart})
    measure = measuring.local_processes("onnxruntime", samples_dir / "convnet" / "validation",
                                           settings, work=tmp_path / "w")
    r = confirmation.confirm((engines[FAST], FAST), [(engines[SLOW], SLOW)], settings, measure,
                             fixed=2)
    assert r.processes == 2 and "standby" not in r.phases_s and "wait" not in r.phases_s
    assert r.phases_s["startup"] > 0 and r.phases_s["load"] > 0
    assert get_backend("torch-inductor").traits.prestart_measuring  # loads of seconds: on


def test_a_confirmation_cut_short_stops_the_process_on_standby(engines: dict[str, Path],
                                                              samples_dir: Path,
                                                              tmp_path: Path) -> None:
    """An error in the parent between processes (here: the observer raising) leaves no
    process waiting on standby."""
    settings = SETTINGS.model_copy(update={"confirm_prestart": True})
    measure = measuring.local_processes("onnxruntime", samples_dir / "convnet" / "validation",
                                           settings, work=tmp_path / "w")

    def stop(n: int, cap: int, open_routes: list[str]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        confirmation.confirm((engines[FAST], FAST), [(engines[SLOW], SLOW)], settings, measure,
                             on_process=stop)
    assert measure.next is None
    import subprocess

    left = subprocess.run(["pgrep", "-f", str(tmp_path / "w" / "measure-1.request.json")],
                          capture_output=True, text=True, check=False).stdout.split()
    assert left == []


def test_a_process_that_cannot_load_its_engine_is_a_clear_error(tmp_path: Path,
                                                                samples_dir: Path) -> None:
    bad = tmp_path / "bad.ort"
    bad.write_bytes(b"not an engine")
    measure = measuring.local_processes("onnxruntime", samples_dir / "convnet" / "validation",
                                           SETTINGS, work=tmp_path / "w")
    with pytest.raises(TuneError, match="measuring process 1 ended runtime_error") as err:
        confirmation.confirm((bad, FAST), [], SETTINGS, measure, fixed=2)
    assert "measure-0.log" in (err.value.hint or "")


def test_measuring_processes_run_under_the_trial_memory_limit(engines: dict[str, Path],
                                                             samples_dir: Path,
                                                             tmp_path: Path) -> None:
    """A measuring process is a worker child like a trial's (dossier.jobs.child), with the trial
    memory limit: its request carries the limit, and a limit too small to load the engine ends
    the process, a clear error (a MemoryError, or another error raised where an allocation
    failed); the same process under a workable limit measures."""
    vset = samples_dir / "convnet" / "validation"
    pair = ((engines[FAST], FAST), [(engines[SLOW], SLOW)])
    tight = SETTINGS.model_copy(update={"trial_memory_limit_mb": 64})
    measure = measuring.local_processes("onnxruntime", vset, tight, work=tmp_path / "tight")
    with pytest.raises(TuneError,
                       match="measuring process 1 ended (runtime_error|crashed)"):
        confirmation.confirm(*pair, tight, measure, fixed=1)
    assert json.loads((tmp_path / "tight" / "measure-0.request.json").read_text())[
        "memory_mb"] == 64
    roomy = SETTINGS.model_copy(update={"trial_memory_limit_mb": 1 << 16})
    measure = measuring.local_processes("onnxruntime", vset, roomy, work=tmp_path / "roomy")
    assert confirmation.confirm(*pair, roomy, measure, fixed=2).processes == 2
    assert json.loads((tmp_path / "roomy" / "measure-0.request.json").read_text())[
        "memory_mb"] == 1 << 16


def test_tuner_confirmation_records_the_readings(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", backend="faulty", strategy="full",
                     selection="-pace=clock -fault=[none|slow]")
    spec = spec.model_copy(update={"timing": spec.timing.model_copy(update={
        k: getattr(SETTINGS, k) for k in ("confirm_rounds", "confirm_runs", "confirm_block_s",
                                          "confirm_processes", "confirm_max_processes")})})
    from dossier.cache import TuningCache
    from dossier.run_folder import CACHE_NAME
    from dossier.tuner.resume import header

    p = prepare(spec)
    run = tmp_path / "run"
    run.mkdir()
    cache = TuningCache.create(run / CACHE_NAME, header(p, None, [], None))
    tuner = Tuner(p, run, cache)
    try:
        tuner.run_trial(p.baseline, "baseline")
        slow = tuner.run_trial(Route.parse(SLOWED, p.db), "search")
        stopped = tuner.confirm([slow])  # re-measure it as if it had screened faster
    finally:
        tuner.scheduler.close()  # what tune() does after a search: its fork server ends
    confirms = [t for t in cache.trials if t.role == "confirm"]
    assert [t.route for t in confirms] == [PACED, SLOWED]  # the confirmation's A/A, the route
    for t in confirms:
        c = t.comparison
        assert c is not None and c.procedure == "independent" and c.processes == 3
        assert t.sample_rounds is not None and len(t.sample_rounds) == len(t.samples_ms or [])
        assert max(t.sample_rounds) == 3 * SETTINGS.confirm_rounds - 1
    assert [t.comparison.against for t in confirms] == ["baseline", "aa"]  # type: ignore[union-attr]
    assert confirms[1].comparison.speedup == pytest.approx(0.5, rel=0.03)  # type: ignore[union-attr]
    assert confirms[1].extra["confirmation"] == "futile"  # never confirmed
    d = decide(cache.trials, p.spec.timing, stopped=stopped)
    assert not d.gain and d.confirm_aa is not None and d.confirm_aa.processes == 3
    assert d.k == 1 and d.level == pytest.approx(0.05) and d.stopped == stopped


def test_the_faulty_backends_known_gain_ships_end_to_end(sample, tmp_path: Path) -> None:
    """The synthetic ground truth: on the faulty backend's clock ``gain=x1.25`` reads every run
    at 1.6 ms against 2.0 ms (times a small noise), however busy the host: the confirmation
    measures 1.25x and ships it at its first look."""
    from dossier.tuner import tune

    gain = "-gain=x1.25 -intra_op_num_threads=1 -pace=clock"
    _, spec = sample("convnet", backend="faulty", strategy="full",
                     selection="-pace=clock -gain=[none|x1.25] -intra_op_num_threads=1")
    spec = spec.model_copy(update={"timing": spec.timing.model_copy(update={
        "confirm_rounds": 4, "confirm_runs": 10, "confirm_block_s": 0.05,
        "confirm_processes": 3, "confirm_max_processes": 3})})
    result = tune(spec, tmp_path / "out")
    d = result.decision
    (c,) = [t.comparison for t in result.cache.trials if t.role == "confirm" and t.route == gain]
    assert c is not None and c.speedup == pytest.approx(1.25, rel=0.03), d.reason  # the known gain
    assert d.processes == 3 and d.aa_stops is False and d.k == 1
    assert c.p_value < c.level and c.speedup_ci_low > 1.0  # type: ignore[operator]
    assert d.gain and d.shipped_route == gain and d.speedup == c.speedup, d.reason
    # the confirmation's A/A (the baseline's second load) reads the two loads alike
    assert d.confirm_aa is not None and d.confirm_aa.speedup == pytest.approx(1.0, abs=0.03)


def _comparison(x: float, lo: float, hi: float, processes: int | None = None) -> Comparison:
    t = TimingSummary(n=1, median_ms=1, ci_low_ms=1, ci_high_ms=1, mean_ms=1, p10_ms=1,
                      p90_ms=1, warmup_runs=0)
    return Comparison(baseline=t, speedup=x, speedup_ci_low=lo, speedup_ci_high=hi,
                      p_value=0.01, significant=True, faster=True, slower=False, rounds=12,
                      processes=processes)


def test_rebench_judges_the_speedup_against_the_recorded_prediction_interval() -> None:
    predicted = (1.08, 1.03, 1.13)  # recorded speedup, then the prediction interval
    assert judge_speedup(_comparison(1.04, 1.01, 1.08, 5), *predicted) == []
    fell = judge_speedup(_comparison(1.02, 1.01, 1.04, 5), *predicted)
    assert fell and "fell to 1.020x [1.010, 1.040], below the recorded 1.080x" in fell[0]
    lost = judge_speedup(_comparison(1.04, 0.99, 1.06, 5), *predicted)
    assert lost and "no longer excludes 1.0" in lost[0]
    assert judge_speedup(None, *predicted) == []  # the baseline ships: nothing to judge
    # an older bundle: its interval had to be reached by the re-measured interval
    assert judge_speedup(_comparison(1.07, 1.04, 1.10), 1.08, 1.05, 1.11) == []


def test_inspect_shows_the_aa_reading_and_a_load_snippet_that_works(
        rel: dict[str, h.Released]) -> None:
    r = rel["convnet"]
    text = h.cli("inspect", r.bundle).stdout
    assert "A/A check" in text and "rounds, screening)" in text
    assert f"load with    dossier.load({str(r.bundle)!r})" in text
    assert "raw loader   onnxruntime.InferenceSession('engine/convnet.ort', so" in text
    o = json.loads(h.cli("inspect", r.bundle, "--json").stdout)
    assert o["aa"]["rounds"] == h.SMALL_TIMING["rounds"] and o["aa"]["trial_index"] == 0
    assert o["load"]["options"] == {"graph_optimization_level": "ORT_DISABLE_ALL"}
    assert "force_spinning_stop" not in o["load"]["snippet"]
    # the snippet loads the shipped engine; it reproduces the float64 reference outputs
    namespace: dict = {"ENGINE": str(r.bundle / o["winner"]["engine"])}
    exec(o["load"]["snippet"], namespace)  # noqa: S102 - the bundle's own snippet, under test
    session = namespace["session"]
    for pair in load_validation_set(r.bundle / "validation").pairs:
        (got,) = session.run(None, dict(pair.inputs))
        assert float(np.max(np.abs(got - pair.references["logits"]))) < o["threshold"]


def test_production_load_names_only_what_differs_from_the_defaults() -> None:
    backend = get_backend("onnxruntime")
    db = backend.knob_database()
    plain = backend.production_load(Route.parse(FAST, db), db)
    assert plain.options == {"graph_optimization_level": "ORT_DISABLE_ALL"}
    tuned = backend.production_load(
        Route.parse("-intra_op_num_threads=1 -prepacking=off -execution_mode=parallel", db), db)
    assert tuned.options == {"graph_optimization_level": "ORT_DISABLE_ALL",
                             "intra_op_num_threads": "1", "session.disable_prepacking": "1",
                             "execution_mode": "ORT_PARALLEL"}
    assert "so.intra_op_num_threads = 1" in tuned.snippet
    assert "so.add_session_config_entry('session.disable_prepacking', '1')" in tuned.snippet
    assert "so.execution_mode = ort.ExecutionMode.ORT_PARALLEL" in tuned.snippet
    for name in ("torch-inductor", "tensorrt"):  # without their libraries: text only
        other = get_backend(name)
        other.configure({}, [])
        assert "ENGINE" in other.production_load(Route.parse(""), db).call


def test_production_load_of_a_cuda_graph_route_says_how_to_replay_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the knob database of a GPU host
    backend = get_backend("torch-inductor")
    db = backend.knob_database()
    graph = backend.production_load(Route.parse("-device=cuda -cuda_graph=on", db), db)
    assert "run_single_threaded=True" in graph.call and graph.options == {
        "run_single_threaded": "True"}
    assert "torch.cuda.graph(graph)" in graph.snippet and "graph.replay()" in graph.snippet
    compile(graph.snippet, "snippet", "exec")  # the lines a user copies are valid Python
    plain = backend.production_load(Route.parse("-device=cuda -cuda_graph=off", db), db)
    assert "run_single_threaded" not in plain.call and "graph" not in plain.snippet


def test_a_crafted_conclusion_in_a_confirmation_record_is_read_as_none() -> None:
    """The trade reads what the confirmation concluded from the record's ``extra``: a value
    that is no status (a cache line edited by hand) is no conclusion, not text to print."""
    from dossier.audit.trade import _concluded

    settings = TimingSettings()
    rec = screened(1, "-a=g", 1.6, settings)
    for value, read in (("outranked", "outranked"), ("futile", "futile"),
                        ("shipped!", None), ("", None)):
        assert _concluded(rec.model_copy(update={"extra": {"confirmation": value}})) == read
    assert _concluded(rec) is None and _concluded(None) is None
