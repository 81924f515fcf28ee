"""The tuner end to end on ONNX Runtime: outcomes, isolation, resume, the decision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_TIMING, write_tiny_timing

from dossier.cache import TuningCache
from dossier.errors import CacheMismatchError, OutputError, TuneError
from dossier.measure.timing import REJECTED_ROUNDS, TimingSettings
from dossier.run_folder import CACHE_NAME
from dossier.spec import load_spec
from dossier.trial import Outcome
from dossier.tuner import continue_tune, plan, prepare, tune


def test_trials_that_really_die_are_recorded_and_the_search_finishes(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", backend="faulty", strategy="fast",
                     selection="-fault=[none|abort|segv|hang|raise|nan|oom]")
    # the hang is killed at the limit; a healthy trial takes about 2.5 s on a busy host, so the
    # limit leaves room for a slow spike (6 s did not, once, under 4 busy processes)
    timing = TINY_TIMING.model_copy(update={"trial_timeout_s": 15.0,
                                            "trial_memory_limit_mb": 2048})
    res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run")
    by_route = {t.route: t for t in res.cache.trials}
    expect = {"abort": (Outcome.CRASHED, "SIGABRT"), "segv": (Outcome.CRASHED, "SIGSEGV"),
              "hang": (Outcome.TIMEOUT, "killed after 15 s"),
              "raise": (Outcome.BUILD_FAILED, "injected build failure"),
              "nan": (Outcome.REJECTED, "NaN or Inf"), "oom": (Outcome.CRASHED, "out of memory")}
    for fault, (outcome, reason) in expect.items():
        t = by_route[f"-fault={fault}"]
        assert t.outcome is outcome, (fault, t.reason)
        assert reason in (t.reason or ""), (fault, t.reason)
        assert t.engine is None
    assert by_route["-fault=none"].role == "baseline" and by_route["-fault=none"].admissible
    nan = by_route["-fault=nan"]  # rejected: timed race_rounds rounds, for the trade's picture
    assert nan.raced and "rejected for accuracy" in nan.raced
    assert nan.comparison is not None and nan.comparison.rounds == REJECTED_ROUNDS
    assert not res.decision.gain and res.decision.shipped_route == "-fault=none"
    # every trial's record reached the cache on disk
    assert len(TuningCache.open(tmp_path / "run" / CACHE_NAME).trials) == 7


def test_failing_baseline_stops_the_search(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", backend="faulty", strategy="fast", selection="-fault=raise")
    with pytest.raises(TuneError, match="baseline route -fault=raise did not pass"):
        tune(spec, tmp_path / "run")


def test_full_search_ranks_known_slow_routes_significantly_slower(sample, tmp_path: Path) -> None:
    """The screening's own test on known speeds (the faulty backend's clock, read the same on
    any host): ``fault=slow`` adds 2 ms to a 2 ms run (0.5x; 0.56x with ``gain=x1.25``), and
    ``gain=x1.25`` alone is 1.25x."""
    _, spec = sample("convnet", backend="faulty", strategy="full",
                     selection="-pace=clock -fault=[none|slow] -gain=[none|x1.25]")
    # every round of every trial (racing off): the screening's own test is what is checked
    timing = TINY_TIMING.model_copy(update={"samples": 48, "rounds": 12, "warmup_window": 5,
                                            "race_rounds": 0})
    res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run")
    trials = {t.route: t for t in res.cache.trials if t.role != "confirm"}
    known = {"-fault=none -gain=none -pace=clock": 1.0,
             "-fault=none -gain=x1.25 -pace=clock": 1.25,
             "-fault=slow -gain=none -pace=clock": 2.0 / 4.0,
             "-fault=slow -gain=x1.25 -pace=clock": 2.0 / 3.6}
    assert set(trials) == set(known) and all(t.admissible for t in trials.values())
    for route, speedup in known.items():
        c = trials[route].comparison
        assert c is not None and c.speedup == pytest.approx(speedup, rel=0.03), (route, c)
        if "slow" in route:
            assert c.slower and not c.faster and c.speedup_ci_high < 1.0, (route, c)
    gain = trials["-fault=none -gain=x1.25 -pace=clock"].comparison
    assert gain is not None and gain.faster and gain.speedup_ci_low > 1.0
    assert res.decision.gain and res.decision.shipped_route == "-fault=none -gain=x1.25 -pace=clock"


def test_a_route_wholly_below_the_floor_races_out_and_the_rest_time_every_round(
        sample, tmp_path: Path) -> None:
    """Racing: with the confirmation's floor at 0.7x, a route that reads below it in each of
    its first ``race_rounds`` rounds (the faulty backend's ``slow`` on its clock: 2 ms more per
    run than the 2 ms of the baseline, a known 0.5x on any host) stops there and says why; the
    baseline's A/A times every round."""
    _, spec = sample("convnet", backend="faulty", strategy="full",
                     selection="-pace=clock -fault=[none|slow]")
    timing = TINY_TIMING.model_copy(update={"rounds": 10, "samples": 20, "confirm_floor": 0.7})
    res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run")
    by_route = {t.route: t for t in res.cache.trials if t.role != "confirm"}
    slow = by_route["-fault=slow -pace=clock"]
    assert slow.comparison is not None and slow.comparison.speedup_ci_high < 0.7
    assert slow.comparison.rounds == timing.race_rounds < 10, slow.comparison.round_ratios
    assert slow.raced and "confirmation's floor" in slow.raced
    base = by_route["-fault=none -pace=clock"]
    assert base.comparison is not None and base.comparison.rounds == 10 and base.raced is None
    assert not res.decision.gain  # nothing above the floor to confirm


def test_output_folder_must_be_new(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", selection="-intra_op_num_threads=[0|1]")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    with pytest.raises(OutputError, match="not empty"):
        tune(spec, tmp_path / "run")


def test_continue_refuses_changed_inputs(sample, tmp_path: Path) -> None:
    spec_path, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    tune(spec, tmp_path / "run")
    with pytest.raises(CacheMismatchError, match="selection changed"):
        tune(spec.model_copy(update={"tune": spec.tune.model_copy(
            update={"selection": "-intra_op_num_threads=[0|2]"})}), tmp_path / "run", resume=True)
    import onnx

    model = spec_path.parent / "model.onnx"
    proto = onnx.load(str(model))
    proto.doc_string = "edited"  # same graph, other file
    onnx.save(proto, str(model))
    with pytest.raises(CacheMismatchError, match="model changed"):
        continue_tune(tmp_path / "run")


def test_continue_of_a_finished_search_runs_nothing(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    first = tune(spec, tmp_path / "run")
    again = continue_tune(tmp_path / "run" / CACHE_NAME)
    assert again.trials_run == 0
    assert again.decision == first.decision


def test_dry_run_routes_match_the_strategy(sample) -> None:
    _, spec = sample("tblock")
    baseline, routes = plan(spec)
    assert len(routes) == 1 + 1 + 1 + 1 + 1 + 1 + 2  # 1 + sum(values != default)
    assert routes[0] == baseline


@pytest.mark.parametrize("jobs", [1, 2])
def test_kill_9_then_continue_loses_only_the_trial_in_flight(samples_dir: Path, tmp_path: Path,
                                                             jobs: int) -> None:
    """A real SIGKILL of the search while trials run (its children die with it), then
    --continue: no finished trial is lost or duplicated and the search ends with every planned
    route; with two build jobs, the builds in flight are simply rebuilt. The killed run's time,
    up to its last finished trial, is recorded by the continue (it wrote no record of its
    own)."""
    import shutil

    work = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", work)
    write_tiny_timing(work / "release.toml")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dossier_cli.main", "tune", str(work / "release.toml"), "--out", str(run),
           "--quiet", "--build-jobs", str(jobs)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    cache = run / CACHE_NAME
    deadline = time.time() + 120
    while time.time() < deadline:
        if cache.exists() and cache.read_text().count('"kind":"trial"') >= 3:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the search did not get going")
    os.killpg(proc.pid, signal.SIGKILL)
    killed_after = time.time() - t0
    proc.wait()
    _no_worker_left(run)  # its children died with it, paused builds included
    _lock_freed(run)
    before = [json.loads(line) for line in cache.read_text().splitlines()[1:] if line.strip()]
    assert 3 <= len(before) < 12 and all(r["kind"] == "trial" for r in before)
    res = continue_tune(run, build_jobs=jobs)
    trials = [t for t in res.cache.trials if t.role != "confirm"]
    routes = [t.route for t in trials]
    assert len(routes) == len(set(routes)) == 12  # nothing duplicated, nothing missing
    assert all(t.admissible for t in trials)
    assert res.trials_run == 12 - len(before)
    assert [t.model_dump(mode="json") for t in res.cache.trials[: len(before)]] == before
    assert [t.index for t in res.cache.trials] == list(range(len(res.cache.trials)))
    lost, resumed = res.cache.sessions
    assert lost.recovered and lost.interrupted and not resumed.recovered
    assert lost.trials_run == len(before) and 0 < lost.wall_s <= killed_after + 1


def _no_worker_left(run: Path, wait_s: float = 10.0) -> None:
    """No process whose command line names ``run`` outlives the search (a worker the search
    had paused before it set its parent-death signal once stayed stopped for ever)."""
    left: list[str] = []
    deadline = time.time() + wait_s
    while time.time() < deadline:
        left = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(run) in text:
                left.append(text)
        if not left:
            return
        time.sleep(0.1)
    pytest.fail(f"processes outlived the killed search: {left}")


def _lock_freed(run: Path, wait_s: float = 10.0) -> None:
    """The run folder's flock is free within ``wait_s``: a process killed with the search (one
    forked and not yet exec'd holds a copy of the lock's descriptor) reads an empty command
    line while the kernel tears it down, before its descriptors are closed."""
    import fcntl

    from dossier.lock import RUN_LOCK

    deadline = time.time() + wait_s
    while True:
        with open(run / RUN_LOCK, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return  # closing the file releases it
            except BlockingIOError:
                if time.time() > deadline:
                    pytest.fail(f"the killed search's lock is still held after {wait_s:g} s")
        time.sleep(0.05)


def test_spec_errors_are_specific(tmp_path: Path) -> None:
    from dossier.errors import SpecError

    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[release\nname=1")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(tmp_path / "bad.toml")
    (tmp_path / "t.toml").write_text(
        '[release]\nname="x"\n[model]\npath="m.onnx"\n[validation]\npath="v"\n'
        '[tune]\nselection="-a=b"\nthreshold=0\n')
    with pytest.raises(SpecError, match="tune.threshold"):
        load_spec(tmp_path / "t.toml")
    assert TimingSettings().samples >= 30  # the defaults measure, the tests shrink them


def test_routes_that_differ_only_in_load_time_knobs_reuse_the_engine(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast",
                     selection="-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]")
    res = tune(spec, tmp_path / "run")
    by_route = {t.route: t for t in res.cache.trials if t.role != "confirm"}
    threads = by_route["-intra_op_num_threads=1 -optimizer:NchwcTransformer=on"]
    nchwc = by_route["-intra_op_num_threads=0 -optimizer:NchwcTransformer=off"]
    assert threads.extra.get("reused_engine") == "trial-0000.ort" and threads.build_s is None
    assert "reused_engine" not in nchwc.extra and nchwc.build_s is not None  # a build knob: rebuilt


def _comparable(res) -> list[tuple]:  # type: ignore[no-untyped-def]
    """What a search found, without its timings (nor the engines' digests: ONNX Runtime writes
    other bytes for the same route in every process, with one build job as with two)."""
    drop = {"reused_engine"}
    return [(t.index, t.route, t.role, t.outcome, t.worst_loss, t.engine, t.losses,
             t.build_s is None, {k: v for k, v in t.extra.items() if k not in drop})
            for t in res.cache.trials if t.role != "confirm"]


def test_two_build_jobs_give_the_results_of_one(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast",
                     selection="-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]")
    one = tune(spec, tmp_path / "one", build_jobs=1)
    two = tune(spec, tmp_path / "two", build_jobs=2)
    assert _comparable(one) == _comparable(two)
    assert len(_comparable(two)) == 3 and all(t.admissible for t in two.cache.trials)
    # one job builds inside the trial's process; two run build jobs of their own, whose phases
    # are kept with the trial's
    assert not any("startup_build" in t.phases_s for t in one.cache.trials)
    built = [t for t in two.cache.trials if t.build_s is not None]
    assert len(built) == 2 and all("startup_build" in t.phases_s for t in built)
    assert not (tmp_path / "two" / ".work").exists()


def test_build_jobs_below_one_are_refused(sample, tmp_path: Path) -> None:
    from dossier.errors import InputError

    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    with pytest.raises(InputError, match="at least 1"):
        tune(spec, tmp_path / "run", build_jobs=0)


def _as_format_1(cache_path: Path) -> None:
    """Rewrite a cache's header line as format 1 wrote it: the spec's settings as flat fields."""
    lines = cache_path.read_text().split("\n")
    h = json.loads(lines[0])
    spec = h.pop("spec")
    release, tune_ = spec["release"], spec["tune"]
    h.update(cache_format=1, release=release["name"], release_version=release["version"],
             description=release["description"], validation_path=spec["validation"]["path"],
             backend=tune_["backend"], strategy=tune_["strategy"], selection=tune_["selection"],
             metric=tune_["metric"], threshold=tune_["threshold"], atol=tune_["atol"],
             rtol=tune_["rtol"], timing=spec["timing"], shapes=spec["shapes"],
             deployment=spec["deployment"], builder=spec["builder"])
    cache_path.write_text("\n".join([json.dumps(h), *lines[1:]]))


def test_a_format_1_cache_resumes_and_a_changed_setting_is_named(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    first = tune(spec, tmp_path / "run")
    cache_path = tmp_path / "run" / CACHE_NAME
    assert json.loads(cache_path.read_text().split("\n")[0])["cache_format"] == 2
    _as_format_1(cache_path)
    old = TuningCache.open(cache_path).header
    assert old.spec == first.cache.header.spec and old.cache_format == 2
    assert (old.threshold, old.release) == (spec.tune.threshold, spec.release.name)
    again = continue_tune(cache_path)
    assert again.trials_run == 0 and again.decision == first.decision
    stricter = spec.tune.model_copy(update={"threshold": spec.tune.threshold / 2})
    with pytest.raises(CacheMismatchError, match=r"the spec\.tune\.threshold changed"):
        tune(spec.model_copy(update={"tune": stricter}), tmp_path / "run", resume=True)
    lines = cache_path.read_text().split("\n")
    cache_path.write_text("\n".join([json.dumps({**json.loads(lines[0]), "cache_format": 3}),
                                     *lines[1:]]))
    with pytest.raises(CacheMismatchError, match=r"is a dossier tuning cache of format 3; "
                                                 r"this dossier \S+ reads formats 1, 2"):
        continue_tune(cache_path)


def test_a_sample_times_one_inference_per_input_shape_and_older_caches_read_as_passes(
        sample, tmp_path: Path) -> None:
    """With a fourth validation pair of the first pair's shape, a timed sample is still three
    inferences (one per shape), the header says so and every latency divides by it. A header
    from before ``[timing] inputs`` (no ``inferences_per_sample``) timed every pair: it reads
    as ``inputs = "pairs"``, and continuing it under a spec that times per shape names the
    setting."""
    import shutil

    root, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    shutil.copytree(root.parent / "validation" / "pair-000", root.parent / "validation" / "pair-003")
    spec = spec.model_copy(update={"validation": spec.validation.model_copy(
        update={"path": root.parent / "validation"})})
    first = tune(spec, tmp_path / "run")
    header = first.cache.header
    assert (header.validation_pairs, header.inferences_per_sample, header.per_sample) == (4, 3, 3)
    assert header.spec.timing.inputs == "shapes"
    passes = tune(spec.model_copy(update={"timing": spec.timing.model_copy(
        update={"inputs": "pairs"})}), tmp_path / "passes")
    assert passes.cache.header.per_sample == 4
    cache_path = tmp_path / "run" / CACHE_NAME
    lines = cache_path.read_text().split("\n")
    old = json.loads(lines[0])
    del old["inferences_per_sample"], old["spec"]["timing"]["inputs"]
    cache_path.write_text("\n".join([json.dumps(old), *lines[1:]]))
    read = TuningCache.open(cache_path).header
    assert (read.spec.timing.inputs, read.per_sample) == ("pairs", 4)
    with pytest.raises(CacheMismatchError, match=r"the spec\.timing\.inputs changed "
                                                 r"since the search started \(pairs -> shapes\)"):
        tune(spec, tmp_path / "run", resume=True)


def test_gpu_engines_confirm_in_more_processes_unless_the_spec_says(
        sample, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A backend's timing defaults (a first look after 6 measuring processes for GPU engines)
    fill what the spec's [timing] leaves unset, never what it sets."""
    from dossier.backends import get_backend

    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    spec = spec.model_copy(update={"timing": TimingSettings(**{
        k: v for k, v in spec.timing.model_dump().items()
        if k not in ("confirm_processes", "confirm_max_processes")})})
    assert prepare(spec).spec.timing.confirm_processes == TimingSettings().confirm_processes  # CPU
    backend = type(get_backend("onnxruntime"))
    monkeypatch.setattr(backend, "timing_defaults",
                        lambda self, route, db: dict(self.GPU_TIMING))
    assert "confirm_processes" not in spec.timing.model_fields_set
    assert prepare(spec).spec.timing.confirm_processes == 6
    said = spec.timing.model_copy(update={"confirm_processes": 4})
    assert prepare(spec.model_copy(update={"timing": said})).spec.timing.confirm_processes == 4
