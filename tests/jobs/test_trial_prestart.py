"""The search's trial processes started on standby (``timing.trial_prestart``): each trial
starts the next one's process, which imports while this one runs and waits for its turn.

ONNX Runtime's default is off (its loads take milliseconds): these tests force it on, and
build in the trial's process (one build job) unless they say otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import TINY_TIMING

from dossier.errors import TuneError
from dossier.run_folder import WORK, trial_name
from dossier.trial import Outcome, TrialRecord
from dossier.tuner import TuneObserver, tune

SELECTION = "-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]"
"""Three trials under fast: the baseline, a route reusing its engine (a load-time knob), and a
rebuilt one."""


def _timing(prestart: bool | None) -> object:
    return TINY_TIMING.model_copy(update={"trial_prestart": prestart})


def _standbys(work: Path) -> list[str]:
    """The pids of processes of this run still on standby (or started as one)."""
    return subprocess.run(["pgrep", "-f", str(work / "standby-")], capture_output=True,
                          text=True, check=False).stdout.split()


def _found(res) -> list[tuple]:  # type: ignore[no-untyped-def]
    """What a search found, without its timings and digests."""
    return [(t.index, t.route, t.role, t.outcome, t.worst_loss, t.engine, t.losses,
             t.build_s is None, t.extra) for t in res.cache.trials if t.role != "confirm"]


def test_prestarted_trials_find_what_trials_started_at_their_turn_find(sample,
                                                                      tmp_path: Path) -> None:
    """Each trial after the first ran in the process started on standby during the one before
    (its record has that wait as its standby phase), the trial before it waited for its
    imports before timing, and the search records the same trials, outcomes and decision
    kinds as one without; the finished search leaves no process and no work folder."""
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    off = tune(spec.model_copy(update={"timing": _timing(False)}), tmp_path / "off", build_jobs=1)
    on = tune(spec.model_copy(update={"timing": _timing(True)}), tmp_path / "on", build_jobs=1)
    assert _found(on) == _found(off) and len(_found(on)) == 3
    assert on.decision.shipped_route in {t.route for t in on.cache.trials}
    trials = [t for t in on.cache.trials if t.role != "confirm"]
    # the decision is one of the two it can be: a gain ships another route than the baseline
    assert (on.decision.shipped_route != trials[0].route) == bool(on.decision.gain), \
        on.decision.reason
    assert "standby" not in trials[0].phases_s  # the first started at its turn
    assert all(t.phases_s["standby"] > 0 for t in trials[1:])
    assert all("wait" in t.phases_s for t in trials)  # each had a successor on standby
    assert all("standby" not in t.phases_s and "wait" not in t.phases_s
               for t in off.cache.trials)
    assert all(t.outcome is Outcome.OK for t in trials)
    assert not (tmp_path / "on" / ".work").exists()  # the unused standby's files went too
    assert _standbys(tmp_path / "on" / ".work") == []


def test_the_onnxruntime_default_starts_each_trial_at_its_turn(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    res = tune(spec.model_copy(update={"timing": _timing(None)}), tmp_path / "run", build_jobs=1)
    assert all("standby" not in t.phases_s for t in res.cache.trials)


class _Stop(TuneObserver):
    """Interrupts the search once the first trial is recorded, having seen the standby."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.seen: list[str] = []

    def trial_finished(self, record: TrialRecord) -> None:
        self.seen = _standbys(self.work)
        raise KeyboardInterrupt


def test_an_interrupted_search_leaves_no_process_on_standby(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    run = tmp_path / "run"
    stop = _Stop(run / ".work")
    with pytest.raises(KeyboardInterrupt):
        tune(spec.model_copy(update={"timing": _timing(True)}), run, observer=stop, build_jobs=1)
    assert len(stop.seen) == 1  # the next trial's process was there, waiting
    assert _standbys(run / ".work") == []


def test_a_failed_search_leaves_no_process_on_standby(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", backend="faulty", strategy="fast", selection="-fault=raise")
    with pytest.raises(TuneError, match="did not pass"):
        tune(spec.model_copy(update={"timing": _timing(True)}), tmp_path / "run", build_jobs=1)
    assert _standbys(tmp_path / "run" / ".work") == []


def test_a_failed_trials_log_is_where_explain_says(sample, tmp_path: Path) -> None:
    """A trial that crashed in a process started on standby: its log, with what it said as it
    died, is the trial's (``.work/trial-NNNN.log``, the path explain names), and the only file
    the finished search keeps."""
    from dossier.audit.explain import worker_log

    _, spec = sample("convnet", backend="faulty", strategy="fast",
                     selection="-fault=[none|segv|raise|nan]")
    run = tmp_path / "run"
    res = tune(spec.model_copy(update={"timing": _timing(True)}), run, build_jobs=1)
    by_route = {t.route: t for t in res.cache.trials}
    crashed = by_route["-fault=segv"]
    assert crashed.outcome is Outcome.CRASHED
    work, log = run / WORK, f"{trial_name(crashed.index)}.log"
    assert sorted(p.name for p in work.iterdir()) == [log]
    assert "Segmentation fault" in (work / log).read_text()
    assert worker_log(run, crashed) == str(work / log)
    # the trials after it ran in prestarted processes too, each judged as without
    assert by_route["-fault=nan"].outcome is Outcome.REJECTED
    assert by_route["-fault=raise"].outcome is Outcome.BUILD_FAILED
    assert all(by_route[r].phases_s["standby"] > 0 for r in ("-fault=nan", "-fault=raise"))


def test_a_trial_whose_loader_environment_differs_starts_a_process_of_its_own(
        sample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader environment (LD_PRELOAD) is set at exec: a trial whose environment differs
    from the one its standby was started in (here: each engine asks for its own) runs in a
    fresh process with its own, and the standby is killed."""
    from dossier.backends.onnxruntime import OnnxRuntimeBackend
    from dossier.executors import local
    from dossier.jobs.child import Child

    monkeypatch.setattr(OnnxRuntimeBackend, "loader_env_impl",
                        lambda self, engine: {"DOSSIER_TEST_LOADER": engine.name})
    started: list[tuple[str, dict[str, str]]] = []
    killed: list[str] = []

    class Spy(Child):
        def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kw)
            started.append((self.name, dict(args[3] or {})))

        def kill(self) -> None:
            if self.proc.poll() is None:
                killed.append(self.name)
            super().kill()

    monkeypatch.setattr(local, "Child", Spy)
    # full: the baseline, then a route reusing its engine, a rebuilt one, one reusing that
    _, spec = sample("convnet", strategy="full", selection=SELECTION)
    res = tune(spec.model_copy(update={"timing": _timing(True)}), tmp_path / "run", build_jobs=1)
    trials = [t for t in res.cache.trials if t.role != "confirm"]
    assert len(trials) == 4 and all(t.outcome is Outcome.OK for t in trials)
    reused = {t.index: t.extra.get("reused_engine") for t in trials}
    # the environment each trial needs: the baseline engine's, then a reused engine's
    env = {t.index: reused[t.index] or ("trial-0000.ort" if t.index else None) for t in trials}
    assert len({v for v in reused.values() if v} - {"trial-0000.ort"}) == 1  # a rebuilt one's
    for t in trials[1:]:
        # on standby since the trial before began: in that one's environment
        same = env[t.index] == env[t.index - 1]
        assert ("standby" in t.phases_s) is same, (t.index, env, t.phases_s)
    differs = [t.index for t in trials[1:] if env[t.index] != env[t.index - 1]]
    assert differs  # the case under test happened
    assert len(killed) == len(differs) + 1  # those standbys, and the last, unused one
    assert all(name.startswith("standby-") for name, _ in started)
    assert [e.get("DOSSIER_TEST_LOADER") for _, e in started] == [env[t.index] for t in trials]


def test_with_build_jobs_the_first_trial_imports_while_its_build_runs(sample,
                                                                    tmp_path: Path) -> None:
    """Builds of their own (two build jobs): the first trial's process starts on standby while
    its build is awaited, the others as the trial before begins (their builds done) or as
    their own builds are awaited; the builds paused while each trial runs do not stop them;
    the results are those of a search without."""
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    off = tune(spec.model_copy(update={"timing": _timing(False)}), tmp_path / "off",
               build_jobs=2)
    on = tune(spec.model_copy(update={"timing": _timing(True)}), tmp_path / "on", build_jobs=2)
    assert _found(on) == _found(off)
    trials = [t for t in on.cache.trials if t.role != "confirm"]
    assert all(t.phases_s["standby"] > 0 for t in trials if not t.extra.get("reused_engine"))
    assert "wait" not in trials[-1].phases_s  # no next route known: none started for it
    assert any("startup_build" in t.phases_s for t in trials)  # built by build jobs
    assert _standbys(tmp_path / "on" / ".work") == []


def test_a_trial_whose_build_still_runs_starts_its_process_as_it_waits_for_it(
        sample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the next trial's build is still running as a trial begins (here: always said so),
    that trial's process is not started then (which would make this one wait for its imports)
    but as the wait for its build begins: every trial with a build runs in a prestarted
    process, and none waits for another's imports. A trial with no build to wait for (it
    reuses an engine) then starts at its turn."""
    from dossier.jobs.builds import Builds

    monkeypatch.setattr(Builds, "pending", lambda self, route: True)
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    res = tune(spec.model_copy(update={"timing": _timing(True)}), tmp_path / "run",
               build_jobs=2)
    trials = [t for t in res.cache.trials if t.role != "confirm"]
    assert len(trials) == 3 and all(t.outcome is Outcome.OK for t in trials)
    reused = [bool(t.extra.get("reused_engine")) for t in trials]
    assert reused.count(True) == 1
    assert [t.phases_s.get("standby", 0) > 0 for t in trials] == [not r for r in reused]
    # none started its successor as it began (for the last, no next route is known)
    assert not any("wait" in t.phases_s for t in trials)
    assert _standbys(tmp_path / "run" / ".work") == []


def _killed_at_go(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every process on standby dies (SIGKILL, as from the host's memory killer) just as its
    turn comes, after the parent last saw it alive: the names of those killed."""
    import os
    import signal

    from dossier.jobs.child import Child

    go, killed = Child.go, []

    def dies_first(self: Child, *args: object, **kw: object) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        killed.append(self.name)
        go(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Child, "go", dies_first)
    return killed


def test_a_trial_whose_standby_died_runs_in_a_new_process(sample, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that ended on standby ran nothing of its trial: the trial runs in a new
    process, and the search finds what one without prestart finds (no crash is put on a
    route that never ran)."""
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    off = tune(spec.model_copy(update={"timing": _timing(False)}), tmp_path / "off", build_jobs=1)
    killed = _killed_at_go(monkeypatch)
    on = tune(spec.model_copy(update={"timing": _timing(True)}), tmp_path / "on", build_jobs=1)
    assert len(killed) == 2  # the second and third trials' processes
    assert _found(on) == _found(off)
    assert all(t.outcome is Outcome.OK for t in on.cache.trials if t.role != "confirm")
    assert _standbys(tmp_path / "on" / ".work") == []
