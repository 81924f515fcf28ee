"""Declared target conditions (the spec's ``[target]``): the estimator a busier-than-declared
measurement is read with, conditional routes, placement, the co-tenant load, the host check,
what a release says when its figures do not hold for the target, and the re-measurement's
judgement of a record. Known timings come from simulated measuring processes and host
conditions the test sets (no test here needs the host to be fast or quiet)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from _records import STARTED, screened
from conftest import cli, tiny_spec

from dossier.decision import decide
from dossier.errors import TuneError
from dossier.jobs.cotenants import CoTenants, cotenants
from dossier.jobs.placement import placed
from dossier.measure import confirmation
from dossier.measure.conditions import Conditions, summarize, waited_share
from dossier.measure.confirmation import ProcessRun
from dossier.measure.target import (
    TargetConditions,
    conditional,
    estimator_for,
    held_conditional,
    not_comparable,
    problems,
)
from dossier.measure.timing import TimingSettings, block_stat, round_ratios
from dossier.trial import Comparison, TimingSummary
from dossier.verify.host import judge_record

QUIET = Conditions(wall_s=1.0, cores=2, load_1m=0.1, other_cpu_s=0.05, steal_s=0.0,
                   cpu_mhz=None)
BUSY = Conditions(wall_s=1.0, cores=2, load_1m=9.0, other_cpu_s=1.8, steal_s=0.0,
                  cpu_mhz=None)


class Contended:
    """Measuring processes on a host that other work preempts: every engine's true latency is
    fixed (the candidate ``speedup`` times faster than the baseline), and each run is delayed
    by preemption with probability ``p`` by 1 to 4 times its length, more often for the
    baseline (a 2-thread engine waits for both of its threads)."""

    on_this_host = True

    def __init__(self, speedup: float, *, p_base: float, p_cand: float, seed: int = 0) -> None:
        self.speedup, self.p_base, self.p_cand = speedup, p_base, p_cand
        self.rng = np.random.default_rng(seed)

    def __call__(self, engines: Sequence[tuple[Path, str]], offset: int, /, *,
                 more: bool = True) -> ProcessRun:
        rounds = []
        for _, route in engines:
            fast = route != "base"
            ms, p = (1.0 / self.speedup, self.p_cand) if fast else (1.0, self.p_base)
            blocks = []
            for _ in range(6):
                runs = ms * np.exp(self.rng.normal(0, 0.01, 40))
                hit = self.rng.random(40) < p
                runs = runs * (1 + hit * self.rng.uniform(1, 4, 40))
                blocks.append(list(runs))
            rounds.append(blocks)
        return ProcessRun(rounds=rounds, warmup_runs=[5] * len(engines), wall_s=0.1)


class _Watch:
    def __init__(self, seen: Conditions) -> None:
        self.seen = seen

    def stop(self) -> Conditions:
        return self.seen


def _confirm(monkeypatch: pytest.MonkeyPatch, seen: Conditions, **kw: float) -> Comparison:
    monkeypatch.setattr(confirmation.host, "start", lambda *a: _Watch(seen))
    settings = TimingSettings(confirm_max_processes=5)
    result = confirmation.confirm((Path("b"), "base"), [(Path("c"), "cand")], settings,
                                  Contended(1.5, **kw))  # type: ignore[arg-type]
    c = result.candidates[0].comparison
    assert c is not None
    return c


def test_the_engines_wait_for_a_core_is_recorded_beside_each_measuring_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A measuring process reports the share of its threads' ready time spent waiting for a
    core; the confirmation keeps it in that process's conditions and the summary says it."""
    class Waiting(Contended):
        def __call__(self, engines: Sequence[tuple[Path, str]], offset: int, /, *,
                     more: bool = True) -> ProcessRun:
            run = super().__call__(engines, offset, more=more)
            return ProcessRun(rounds=run.rounds, warmup_runs=run.warmup_runs, wall_s=0.1,
                              waited_share=0.1 * (offset + 1))

    monkeypatch.setattr(confirmation.host, "start", lambda *a: _Watch(QUIET))
    result = confirmation.confirm((Path("b"), "base"), [(Path("c"), "cand")],
                                  TimingSettings(confirm_max_processes=3),
                                  Waiting(1.5, p_base=0.0, p_cand=0.0))  # type: ignore[arg-type]
    shares = [c.waited_share for c in result.conditions]
    assert shares == pytest.approx([0.1 * (k + 1) for k in range(len(shares))])
    brief = summarize(result.conditions)
    assert brief is not None and brief.waited_share_max == pytest.approx(shares[-1])
    assert f"the engine waited for a core up to {shares[-1]:.0%} of the time" in brief.text()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or not hasattr(os, "sched_setaffinity"),
                    reason="Linux schedstat and affinity")
def test_a_process_sharing_its_core_with_busy_ones_reads_how_long_it_waited() -> None:
    """Pinned to one core beside three busy processes pinned there too, a busy loop is ready
    all the time and runs about a quarter of it: most of its ready time is waiting."""
    core = min(os.sched_getaffinity(0))
    code = ("import os, time; from dossier.measure.conditions import thread_times, "
            f"waited_share; os.sched_setaffinity(0, {{{core}}}); t = thread_times(); "
            "end = time.perf_counter() + 1.0\nwhile time.perf_counter() < end: pass\n"
            "print(waited_share(t, thread_times()))")
    with cotenants(3, [core], 60):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
    assert float(out) > 0.4, out
    assert waited_share(None, (1.0, 1.0)) is None and waited_share((0, 0), (0, 0)) is None
    assert waited_share((1.0, 0.0), (2.0, 3.0)) == pytest.approx(0.75)


def test_a_busier_than_declared_confirmation_reads_10th_percentiles_and_the_true_gain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Preemption that slows the baseline's runs more than the candidate's inflates the median
    ratio; read of the blocks' 10th percentiles the same processes give the true 1.5x."""
    busy = _confirm(monkeypatch, BUSY, p_base=0.6, p_cand=0.2)
    assert busy.estimator == "p10"
    assert busy.speedup == pytest.approx(1.5, rel=0.05)
    # the same processes read as a quiet host's: the medians, inflated by the load
    quiet = _confirm(monkeypatch, QUIET, p_base=0.6, p_cand=0.2)
    assert quiet.estimator == "median"
    assert quiet.speedup > 1.5 * 1.5


def test_block_statistics_and_the_estimator_chosen_from_the_conditions() -> None:
    block = [1.0, 1.1, 1.2, 5.0, 9.0]
    assert block_stat(block) == 1.2
    assert block_stat(block, "p10") == pytest.approx(np.percentile(block, 10))
    assert round_ratios([[2.0, 2.0, 8.0]], [[1.0, 1.0, 1.0]], "p10")[0] == pytest.approx(2.0)
    assert estimator_for([QUIET, None]) == "median"
    assert estimator_for([QUIET, BUSY]) == "p10"


def test_a_route_differing_only_in_load_dependent_knobs_is_conditional() -> None:
    knobs = {"intra_op_allow_spinning", "intra_op_num_threads"}
    base = {"intra_op_allow_spinning": "on", "graph_optimization_level": "all"}
    assert conditional({**base, "intra_op_allow_spinning": "off"}, base, knobs)
    assert not conditional({**base, "intra_op_allow_spinning": "off",
                            "graph_optimization_level": "basic"}, base, knobs)
    assert not conditional(dict(base), base, knobs)


def _trials(estimator: str) -> list:  # type: ignore[type-arg]
    settings = TimingSettings()
    base = screened(0, "-a=x -spin=on", 1.0, settings, role="baseline")
    cand = screened(1, "-a=x -spin=off", 1.6, settings)
    confirm_c = cand.comparison.model_copy(update={  # type: ignore[union-attr]
        "estimator": estimator, "test": "t-test-processes", "against": "aa", "level": 0.01,
        "p_value": 1e-5, "processes": 5, "speedup_ci_low": 1.4, "speedup_ci_high": 1.8})
    confirm = cand.model_copy(update={"index": 2, "role": "confirm", "comparison": confirm_c,
                                      "started_at": STARTED})
    return [base, cand, confirm]


def test_a_contention_only_gain_confirmed_busier_than_declared_does_not_ship() -> None:
    settings = TimingSettings()
    trials = _trials("p10")
    assert decide(trials, settings).gain  # the rule alone would ship it
    held = held_conditional(trials, TargetConditions(), {"spin"})
    assert list(held) == ["-a=x -spin=off"]
    d = decide(trials, settings, excluded=held)
    assert not d.gain and "held back as conditional" in d.reason
    # confirmed as the target declares (medians: no busier measurement): it ships
    assert not held_conditional(_trials("median"), TargetConditions(), {"spin"})
    # opted in: not held, but still known to be conditional (to label it)
    opt_in = TargetConditions(conditional="ship")
    assert not held_conditional(trials, opt_in, {"spin"})
    assert held_conditional(trials, opt_in, {"spin"}, hold=False)
    # a shared target declares the load: nothing is conditional on it
    assert not held_conditional(trials, TargetConditions(co_tenants=1), {"spin"})


def test_declarations_the_host_cannot_honour_are_named() -> None:
    said = problems(TargetConditions(cores=4, co_tenants=5, gpu="shared"), cores=[0, 1],
                    gpus=0)
    assert len(said) == 3
    assert "target.cores = 4" in said[0] and "2 cores" in said[0]
    assert "co_tenants = 5" in said[1]
    assert "no GPU" in said[2]
    assert problems(TargetConditions(cores=2, co_tenants=2), cores=[0, 1], gpus=0) == []


def test_a_target_the_host_cannot_honour_is_refused_before_any_build(
        convnet_folder: Path, tmp_path: Path) -> None:
    spec = tiny_spec(convnet_folder, extra=f"[target]\ncores = {len(os.sched_getaffinity(0)) + 1}\n")
    r = cli("release", spec, "--out", tmp_path / "out")
    assert r.exit_code == 3, r.stderr
    assert "[target] cannot be honoured" in " ".join(r.stderr.split())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.jsonl"))


def test_placement_pins_and_raises_the_priority_then_restores_both() -> None:
    cores, nice = os.sched_getaffinity(0), os.getpriority(os.PRIO_PROCESS, 0)
    with placed(TargetConditions(cores=1)) as where:
        assert os.sched_getaffinity(0) == {sorted(cores)[0]} == set(where.cores)
        if where.notes:  # not permitted here, or started lowered: said, and kept as it was
            assert ("could not be raised" if nice <= 0 else "lower priority") in where.notes[0]
            assert os.getpriority(os.PRIO_PROCESS, 0) == nice
        else:
            assert os.getpriority(os.PRIO_PROCESS, 0) == where.nice < nice
    assert os.sched_getaffinity(0) == cores
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice
    with placed(TargetConditions(co_tenants=1)) as where:  # shared: the priority is kept
        assert os.getpriority(os.PRIO_PROCESS, 0) == nice and not where.notes


def test_placement_keeps_a_lowered_priority_its_starter_asked_for() -> None:
    code = ("import os; from dossier.jobs.placement import placed; "
            "from dossier.measure.target import TargetConditions; os.nice(19 - os.nice(0)); "
            "w = placed(TargetConditions()).__enter__(); "
            "print(os.getpriority(os.PRIO_PROCESS, 0), w.nice, w.notes[0][:30])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=2)
    assert out[:2] == ["19", "19"] and out[2].startswith("started at nice 19"), out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_co_tenant_load_runs_its_processes_and_stops_them() -> None:
    with cotenants(2, [0], 60.0) as load:
        assert load is not None
        pids = load.pids()
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        assert all(os.sched_getaffinity(p) == {0} for p in pids)
    assert not any(_alive(p) for p in pids)
    with cotenants(0, [0], 60.0) as none:
        assert none is None


def test_the_co_tenant_load_dies_with_a_release_killed_with_kill_9(tmp_path: Path) -> None:
    code = ("import sys, time\nfrom dossier.jobs.cotenants import CoTenants\n"
            "c = CoTenants(2, [0], 120.0)\nc.start()\nprint(*c.pids(), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_a_co_tenant_load_that_does_not_start_stops_cleanly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    load = CoTenants(1, [0], 10.0)
    with pytest.raises(TuneError, match="co-tenant load .* did not start"):
        load.start()
    assert load.procs == []


def _reading(speedup: float, lo: float, hi: float) -> Comparison:
    return Comparison(baseline=TimingSummary(n=3, median_ms=1, ci_low_ms=1, ci_high_ms=1,
                                             mean_ms=1, p10_ms=1, p90_ms=1, warmup_runs=0),
                      speedup=speedup, speedup_ci_low=lo, speedup_ci_high=hi, p_value=1e-4,
                      significant=True, faster=True, slower=False, processes=3)


def test_a_rebench_flags_an_overstated_record_and_one_too_wide_to_check() -> None:
    here = _reading(3.04, 2.74, 3.37)
    # the case: 18.4x [7.0, 48.0] recorded, prediction interval [2.70, 125.1]
    said = judge_record(here, 18.4, 7.0, 48.0, 2.70)
    assert len(said) == 2
    assert "not reproduced" in said[0] and "cannot be checked" in said[1]
    # an honest record the re-measurement agrees with: nothing
    assert judge_record(_reading(1.70, 1.50, 1.93), 1.66, 1.45, 1.905, 1.19) == []
    # a record overstated 2x with a narrow interval: not reproduced
    assert judge_record(_reading(1.66, 1.5, 1.8), 3.3, 2.9, 3.8, 2.4)


def test_the_line_a_release_ends_with_says_when_figures_do_not_hold_for_the_target() -> None:
    t = TargetConditions()
    assert not_comparable(t, busier_count=0, measurements=5, of="confirmation",
                          estimator="median") is None
    line = not_comparable(t, busier_count=5, measurements=5, of="confirmation", estimator="p10")
    assert line is not None and line.startswith(
        "not comparable with the declared target (all cores, dedicated): 5 of 5")
    assert "10th percentile" in line


def test_a_release_busier_than_declared_ends_with_that_line_and_strict_exits_12(
        convnet_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's conditions are the test's: every measurement reads busy."""
    monkeypatch.setattr(Conditions, "busy", lambda self, share=0.25: True)
    spec = tiny_spec(convnet_folder)
    r = cli("release", spec, "--out", tmp_path / "a", "-q")
    assert r.exit_code == 0, r.stderr
    last = " ".join(r.stderr.split()).rsplit("dossier", 1)[-1]
    assert "not comparable with the declared target (all cores, dedicated)" in last
    r = cli("release", spec, "--out", tmp_path / "b", "-q", "--strict-conditions")
    assert r.exit_code == 12, r.stderr
    assert (tmp_path / "b" / "tiny-1.dossier" / "manifest.json").is_file()
    o = cli("inspect", tmp_path / "b" / "tiny-1.dossier")
    text = " ".join(o.stdout.split())
    assert "declared: all cores, dedicated" in text and "not comparable" in text


def test_a_rebench_reading_too_noisy_to_tell_is_read_again_over_more_processes(
        sample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A known 1.25x gain (the faulty backend's clock) released, then re-timed: the first
    reading is made to hold 1.0 in its interval (as a noisy host's can); the re-timing reads
    again over twice the processes and judges that reading."""
    from conftest import TINY_TIMING

    from dossier.bundle import open_bundle, write_bundle
    from dossier.tuner import tune
    from dossier.verify import host as verify_host

    _, spec = sample("convnet", backend="faulty", strategy="full",
                     selection="-pace=clock -gain=[none|x1.25] -intra_op_num_threads=1")
    res = tune(spec.model_copy(update={"timing": TINY_TIMING}), tmp_path / "run")
    assert res.decision.gain, res.decision.reason
    written = write_bundle(tmp_path / "run", tmp_path / "out")
    real = confirmation.confirm
    asked: list[int] = []

    def noisy_first(*a, fixed: int | None = None, **kw):  # type: ignore[no-untyped-def]
        asked.append(fixed or 0)
        result = real(*a, fixed=fixed, **kw)
        if len(asked) == 1:
            c = result.candidates[0].comparison
            result.candidates[0].comparison = c.model_copy(update={"speedup_ci_low": 0.9})
        return result

    monkeypatch.setattr(confirmation, "confirm", noisy_first)
    with open_bundle(written.path) as b:
        rb = verify_host.rebench(b)
    assert asked == [3, 6]
    assert rb.comparison is not None and rb.comparison.processes == 6
    assert rb.reason.startswith("the first reading,") and "read again over 6" in rb.reason
    assert not rb.regression, rb.reason


def test_a_rebench_refuses_a_crafted_target_before_starting_any_load(
        convnet_bundle: Path, tmp_path: Path) -> None:
    """An unsigned bundle's header is anyone's: a [target] asking for more busy co-tenants
    than this host has cores is refused (exit 3) before a process is started."""
    import json
    import shutil

    import _bundles as h

    bundle = tmp_path / convnet_bundle.name
    shutil.copytree(convnet_bundle, bundle)

    def edit(rec: dict) -> dict:  # type: ignore[type-arg]
        if rec.get("kind") == "header":
            rec["spec"]["target"] = {"co_tenants": 1024}
        return rec

    h.rewrite_cache(bundle / "tuning-cache.jsonl", edit)
    h.reseal(bundle)
    assert json.loads((bundle / "tuning-cache.jsonl").read_text().splitlines()[0])
    started: list[int] = []
    real = subprocess.Popen.__init__

    def watched(self: subprocess.Popen[bytes], *a: object, **kw: object) -> None:
        real(self, *a, **kw)  # type: ignore[arg-type]
        started.append(self.pid)

    with pytest.MonkeyPatch.context() as mp:  # every process the command starts, in-process
        mp.setattr(subprocess.Popen, "__init__", watched)
        r = cli("verify", bundle, "--rebench")
    assert r.exit_code == 3, r.stderr
    assert "co_tenants = 1024" in " ".join(r.stderr.split())
    assert started == []  # no co-tenant (nor any other process) was started
