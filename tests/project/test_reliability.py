"""Reliability under real faults, tampering and hostile archives; real processes, no mocks.

- kill -9 of ``dossier tune`` at many random moments, each time resumed with ``dossier tune
  --continue``: no finished trial lost or duplicated, the same (route, outcome) set and decision
  as an uninterrupted run, and a run folder that still bundles;
- kill -9 during the confirmation round, and a cache cut at every record boundary (what a kill
  between two appends leaves), resumed;
- trials whose process segfaults, aborts, hangs or exhausts its memory limit *after* the build
  (at load, at the first inference, while timing): recorded with the right outcome, the search
  goes on (build-time faults: tests/search/test_tuner.py);
- kill -9 of ``dossier bundle`` and ``dossier pack`` while they write: never a bundle or archive
  at the target path, and the leftovers are removed by the next write;
- every byte of every small file of a bundle changed, and sampled bytes of a multi-chunk engine:
  each change is detected;
- archive attacks that tests/bundle/test_bundle_archive.py does not cover: compressed archives and
  decompression bombs, pax and GNU long-name paths, malformed segments, a manifest member that
  is a link or too large, truncated archives, a member-count bomb.

The default suite runs a few kills of each kind (about 45 s on 2 cores); ``--run-slow`` runs
the full-size versions: 20 kills of an 8-route search (``DOSSIER_KILLS`` raises it), 10 in the
confirmation round, the cache cut at every record boundary, every post-build hazard, 20 kills of
each writer, every byte of every small file through the real integrity check (minutes), and a
member-count bomb. The figures in docs/reliability.md came from::

    DOSSIER_FIGURES=figures.jsonl pytest tests/project/test_reliability.py --run-slow -s
    DOSSIER_KILLS=100 pytest tests/project/test_reliability.py --run-slow -k search_survives  # bigger
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil
import signal
import subprocess
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import _bundles as h
import _stress_backend
import pytest
from _figures import figures
from conftest import TINY_TIMING, dossier_process, subprocess_env

from dossier.bundle import (
    check_integrity,
    extract_archive,
    open_bundle,
    parse_manifest,
    write_bundle,
)
from dossier.bundle.manifest import MANIFEST_MAX_BYTES, body_digest
from dossier.cache import TuningCache
from dossier.errors import BundleFormatError, ExitCode, UnsafeArchiveError
from dossier.hashing import CHUNK, digest_bytes, digest_file
from dossier.run_folder import CACHE_NAME
from dossier.trial import Outcome
from dossier.tuner import tune

REPO = Path(__file__).resolve().parents[2]
SLOW_KILLS = int(os.environ.get("DOSSIER_KILLS", "20"))
"""Kills of each kind in the slow versions (at least 20)."""
SEARCH_SELECTIONS = {
    "small": "-fault=[none|segv|nan|raise] -graph_optimization_level=all",
    "large": "-fault=[none|segv|nan|raise] -graph_optimization_level=[all|disable_all]",
}
"""Full searches of the ORT sample over 4 and 8 routes with four outcomes: ok, crashed
(SIGSEGV), rejected (NaN outputs), build_failed."""
CONFIRM_SELECTION = "-pace=[slow|brisk|fast]"
"""Two candidates that reliably beat the (slow-paced) baseline: a confirmation round of two."""


# ------------------------------------------------------------------------------- process tools
_env = subprocess_env


def _dossier(args: list[object], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``dossier ARGS`` as its own process group (the CLI and anything in its session)."""
    with open(log, "ab") as f:
        return dossier_process(args, env, stderr=f)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group. Trial processes run in sessions of their own and
    must die with their parent (PR_SET_PDEATHSIG); :func:`_assert_no_orphans` checks that."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _live_processes_mentioning(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _assert_no_orphans(run: Path) -> None:
    deadline = time.monotonic() + 5
    while (left := _live_processes_mentioning(str(run))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"trial processes outlived the killed search: {left}"


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait(condition, proc: subprocess.Popen[bytes], timeout: float = 300,  # type: ignore[no-untyped-def]
          poll: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and proc.poll() is None:
        assert time.monotonic() < deadline, "timed out waiting for the moment to kill"
        time.sleep(poll)


def _trials(cache: Path) -> list[dict]:
    return [t.model_dump(mode="json") for t in TuningCache.open(cache).trials]


def _log_text(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


# ------------------------------------------------------------------------------------- samples
def _spec(sample: Path, folder: Path, *, backend: str, selection: str, **timing: object) -> Path:
    """A release.toml in ``folder`` for ``sample`` with absolute paths and TINY timing."""
    t = {**TINY_TIMING.model_dump(exclude_none=True), **timing}
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["[release]", 'name = "convnet"', "version = 1", "", "[model]",
             f"path = {json.dumps(str(sample / 'model.onnx'))}", "", "[validation]",
             f"path = {json.dumps(str(sample / 'validation'))}", "", "[tune]",
             f"backend = {json.dumps(backend)}", 'strategy = "full"',
             f"selection = {json.dumps(selection)}", 'metric = "linf"', "threshold = 1e-4", "",
             "[timing]", *(f"{k} = {json.dumps(v)}" for k, v in t.items())]
    spec = folder / "release.toml"
    spec.write_text("\n".join(lines) + "\n")
    return spec


@dataclass(frozen=True)
class Reference:
    """An uninterrupted search: what every interrupted one must end up with."""

    run: Path
    pairs: frozenset[tuple[str, str]]
    """(route, outcome) of every baseline and search trial."""
    shipped: str
    candidates: tuple[str, ...]
    confirm_s: float


def _reference(spec: Path, run: Path, env: dict[str, str]) -> Reference:
    log = run.with_suffix(".log")
    proc = _dossier(["tune", spec, "--out", run, "--quiet"], env, log)
    assert proc.wait(timeout=600) == 0, _log_text(log)
    cache = TuningCache.open(run / CACHE_NAME)
    assert cache.decision is not None
    confirms = [t for t in cache.trials if t.role == "confirm"]
    return Reference(run, frozenset((t.route, t.outcome.value) for t in cache.trials
                                    if t.role != "confirm"),
                     cache.decision.shipped_route, tuple(sorted(cache.decision.candidates)),
                     max((t.trial_s for t in confirms), default=0.0))


def _check_resumed(run: Path, ref: Reference, snapshots: list[list[dict]], bundles: Path) -> int:
    """The finished run matches the uninterrupted one, kept every trial recorded before each
    kill, and bundles. Returns the number of trials recorded."""
    cache = TuningCache.open(run / CACHE_NAME)
    assert cache.decision is not None, "the resumed search did not finish"
    search = [t for t in cache.trials if t.role != "confirm"]
    routes = [t.route for t in search]
    assert len(routes) == len(set(routes)), "a finished trial was run twice"
    assert frozenset((t.route, t.outcome.value) for t in search) == ref.pairs
    assert [t.index for t in cache.trials] == list(range(len(cache.trials)))
    final = [t.model_dump(mode="json") for t in cache.trials]
    for snap in snapshots:
        assert final[: len(snap)] == snap, "a trial recorded before a kill was lost or changed"
    assert tuple(sorted(cache.decision.candidates)) == ref.candidates
    if not ref.candidates:
        assert cache.decision.shipped_route == ref.shipped
    written = write_bundle(run, bundles / run.name)  # the resumed run folder is complete
    with open_bundle(written.path) as b:
        assert check_integrity(b)
    return len(cache.trials)


# ============================================================================ kill -9 of a search
@dataclass
class Campaign:
    """What a kill campaign did."""

    kills: int = 0
    searches: int = 0
    resumes: int = 0
    phases: Counter = field(default_factory=Counter)
    trials_kept: int = 0
    """Trials that were on disk at a kill and still there, unchanged, at the end."""


def _phase(run: Path, since: float) -> str:
    """Where the search was when killed (``since``: when this run of tune started)."""
    cache = run / CACHE_NAME
    text = cache.read_bytes() if cache.exists() else b""
    if b"\n" not in text:
        return "start-up (no cache header yet)"
    if not (run / "fingerprint.json").exists():
        return "run setup (header written, fingerprint not yet)"
    if b'"kind":"decision"' in text:
        return "after the decision"
    work = run / ".work"
    fresh = [p for p in work.glob("*.request.json") if p.stat().st_mtime >= since] \
        if work.is_dir() else []
    confirming = [p for p in (work / "confirm").glob("measure-*.request.json")
                  if p.stat().st_mtime >= since] if (work / "confirm").is_dir() else []
    if confirming:
        return "confirmation round"
    if fresh:
        return "a trial in flight"
    return "start-up of tune --continue (no trial started yet)"


def _kill_search(spec: Path, root: Path, env: dict[str, str], kills: int, rng: random.Random,
                 ref: Reference) -> Campaign:
    """Run searches, killing each at random moments and resuming it with tune --continue,
    until ``kills`` kills landed; the last search then finishes undisturbed. Every finished
    search is checked against ``ref``."""
    c = Campaign()
    log = root / "campaign.log"
    while c.kills < kills:
        run = root / f"run-{c.searches}"
        c.searches += 1
        cache = run / CACHE_NAME
        snapshots: list[list[dict]] = []
        while True:
            if _lines(cache) >= 1:
                args: list[object] = ["tune", "--continue", run, "--quiet"]
                c.resumes += 1
            else:  # killed before the cache existed: nothing was recorded, start again
                args = ["tune", spec, "--out", run, "--quiet"]
            started = time.time()
            proc = _dossier(args, env, log)
            if rng.random() < 0.5:  # wait for the next record or two, then a moment more
                target = _lines(cache) + rng.randint(1, 2)
                _wait(lambda target=target, cache=cache: _lines(cache) >= target, proc)
                time.sleep(rng.uniform(0, 0.6))
            else:  # any moment of the next few seconds, process start-up included
                deadline = time.monotonic() + rng.uniform(0, 3.0)
                _wait(lambda deadline=deadline: time.monotonic() >= deadline, proc, poll=0.01)
            if proc.poll() is not None:
                assert proc.returncode == 0, _log_text(log)
                break
            phase = _phase(run, started)
            _kill(proc)
            c.kills += 1
            c.phases[phase] += 1
            _assert_no_orphans(run)
            if _lines(cache) >= 1:
                snapshots.append(_trials(cache))
            if c.kills >= kills:  # enough: resume once more and let it finish
                proc = _dossier(["tune", "--continue", run, "--quiet"] if _lines(cache) >= 1
                                else ["tune", spec, "--out", run, "--quiet"], env, log)
                assert proc.wait(timeout=600) == 0, _log_text(log)
                c.resumes += 1
                break
        _check_resumed(run, ref, snapshots, root / "bundles")
        c.trials_kept += sum(len(s) for s in snapshots[-1:])
    return c


_SEARCH_REFS: dict[str, tuple[Path, dict[str, str], Reference]] = {}


def _search_setup(samples_dir: Path, factory: pytest.TempPathFactory,
                  size: str) -> tuple[Path, dict[str, str], Reference]:
    if size not in _SEARCH_REFS:
        root = factory.mktemp(f"kill-search-{size}")
        spec = _spec(samples_dir / "convnet", root / "spec", backend="faulty",
                     selection=SEARCH_SELECTIONS[size])
        env = _env()
        _SEARCH_REFS[size] = spec, env, _reference(spec, root / "reference", env)
    return _SEARCH_REFS[size]


def _search_survives(samples_dir: Path, factory: pytest.TempPathFactory, tmp_path: Path,
                     size: str, kills: int, seed: int) -> None:
    spec, env, ref = _search_setup(samples_dir, factory, size)
    assert {o for _, o in ref.pairs} == {"ok", "crashed", "rejected", "build_failed"}
    t0 = time.monotonic()
    c = _kill_search(spec, tmp_path, env, kills, random.Random(seed), ref)
    assert c.kills >= kills
    figures("kill -9 of tune, resumed with tune --continue", routes=len(ref.pairs),
            kills=c.kills, searches=c.searches, resumes=c.resumes, phases=dict(c.phases),
            seconds=round(time.monotonic() - t0, 1))


def test_search_survives_kill_9_at_random_moments(samples_dir, tmp_path_factory,  # type: ignore[no-untyped-def]
                                                  tmp_path: Path) -> None:
    _search_survives(samples_dir, tmp_path_factory, tmp_path, "small", kills=3, seed=20)


@pytest.mark.slow
def test_search_survives_kill_9_at_many_random_moments(samples_dir, tmp_path_factory,  # type: ignore[no-untyped-def]
                                                       tmp_path: Path) -> None:
    _search_survives(samples_dir, tmp_path_factory, tmp_path, "large",
                     kills=max(SLOW_KILLS, 20), seed=2020)


# ============================================================ the confirmation round, killed
@pytest.fixture(scope="module")
def stress_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment whose Python processes know the ``stress`` backend (tests/_stress_backend)."""
    site = tmp_path_factory.mktemp("stress-site")
    _stress_backend.install(site)
    return _env(site)


@pytest.fixture(scope="module")
def confirm_setup(samples_dir: Path, stress_env: dict[str, str],  # type: ignore[no-untyped-def]
                  tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("kill-confirm")
    spec = _spec(samples_dir / "convnet", root / "spec", backend=_stress_backend.NAME,
                 selection=CONFIRM_SELECTION, confirm_top=2)
    ref = _reference(spec, root / "reference", stress_env)
    assert ref.candidates == ("-pace=brisk", "-pace=fast"), ref
    return spec, ref


@pytest.fixture
def stress_registered() -> Iterator[None]:
    """The stress backend in this process too (for bundling and in-process searches)."""
    from dossier.backends import register_backend, unregister_backend

    register_backend(_stress_backend.NAME, _stress_backend.TARGET)
    yield
    unregister_backend(_stress_backend.NAME)


def _kill_confirm(confirm_setup, stress_env, tmp_path: Path, kills: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    spec, ref = confirm_setup
    rng = random.Random(seed)
    log = tmp_path / "confirm.log"
    landed = attempts = 0
    while landed < kills:
        attempts += 1
        assert attempts <= 4 * kills, "the kills kept missing the confirmation round"
        run = tmp_path / f"run-{attempts}"
        proc = _dossier(["tune", spec, "--out", run, "--quiet"], stress_env, log)
        request = run / ".work" / "confirm" / "measure-0.request.json"
        started = time.time()
        _wait(request.exists, proc)
        time.sleep(rng.uniform(0, max(ref.confirm_s, 0.2)))
        if proc.poll() is not None:
            assert proc.returncode == 0, _log_text(log)
            continue  # finished before the moment came: no kill landed
        in_confirm = _phase(run, started) == "confirmation round"
        _kill(proc)
        _assert_no_orphans(run)
        snapshot = _trials(run / CACHE_NAME)
        landed += in_confirm
        resumed = _dossier(["tune", "--continue", run, "--quiet"], stress_env, log)
        assert resumed.wait(timeout=600) == 0, _log_text(log)
        _check_resumed(run, ref, [snapshot], tmp_path / "bundles")
    figures("kill -9 in the confirmation round", kills=landed, attempts=attempts)


def test_kill_9_in_the_confirmation_round(confirm_setup, stress_env, stress_registered,  # type: ignore[no-untyped-def]
                                          tmp_path: Path) -> None:
    _kill_confirm(confirm_setup, stress_env, tmp_path, kills=1, seed=7)


@pytest.mark.slow
def test_kill_9_in_the_confirmation_round_many_times(confirm_setup, stress_env,  # type: ignore[no-untyped-def]
                                                     stress_registered, tmp_path: Path) -> None:
    _kill_confirm(confirm_setup, stress_env, tmp_path, kills=max(SLOW_KILLS // 2, 10), seed=77)


def _cut_and_resume(ref: Reference, tmp_path: Path, env: dict[str, str], keep: int,
                    torn: bool) -> None:
    """The reference run's cache cut after ``keep`` records (plus half of the next one when
    ``torn``), as a kill between two appends leaves it; resumed, it must end as the reference."""
    run = tmp_path / f"cut-{keep}{'-torn' if torn else ''}"
    shutil.copytree(ref.run, run)
    cache = run / CACHE_NAME
    lines = cache.read_bytes().split(b"\n")[:-1]
    data = b"".join(line + b"\n" for line in lines[:keep])
    if torn:
        data += lines[keep][: len(lines[keep]) // 2]
    cache.write_bytes(data)
    kept = _trials(cache)
    log = run.with_suffix(".log")
    proc = _dossier(["tune", "--continue", run, "--quiet"], env, log)
    assert proc.wait(timeout=600) == 0, _log_text(log)
    _check_resumed(run, ref, [kept], tmp_path / "bundles")
    after = TuningCache.open(cache)
    confirms = sorted({t.route for t in after.trials if t.role == "confirm"
                       and t.route != after.decision.baseline_route})  # type: ignore[union-attr]
    assert tuple(confirms) == ref.candidates


def test_a_confirmation_round_cut_short_is_run_again(confirm_setup, stress_env,  # type: ignore[no-untyped-def]
                                                     stress_registered, tmp_path: Path) -> None:
    """A kill between the two confirmation records leaves one: the round must be re-run whole,
    and the decision must weigh both candidates (at alpha/2), as the uninterrupted run did."""
    _, ref = confirm_setup
    lines = (ref.run / CACHE_NAME).read_bytes().split(b"\n")
    first_confirm = next(i for i, line in enumerate(lines) if b'"role":"confirm"' in line)
    _cut_and_resume(ref, tmp_path, stress_env, keep=first_confirm + 1, torn=False)


def test_a_kill_right_after_the_cache_header_leaves_a_resumable_run(  # type: ignore[no-untyped-def]
        confirm_setup, stress_env, stress_registered, tmp_path: Path) -> None:
    """tune writes the cache header, then knobs.json and fingerprint.json: a kill in between
    leaves a run that --continue must complete, knob database and tuning host included, or
    the finished search could never be bundled. (The records are kept here so the resumed
    run is quick; what matters is the two missing files.)"""
    _, ref = confirm_setup
    run = tmp_path / "run"
    shutil.copytree(ref.run, run)
    cache = run / CACHE_NAME
    h.rewrite_cache(cache, lambda r: None if r["kind"] == "session" else r)
    for name in ("knobs.json", "fingerprint.json"):
        (run / name).unlink()
    log = tmp_path / "resume.log"
    proc = _dossier(["tune", "--continue", run, "--quiet"], stress_env, log)
    assert proc.wait(timeout=600) == 0, _log_text(log)
    _check_resumed(run, ref, [], tmp_path / "bundles")


@pytest.mark.slow
def test_a_cache_cut_at_every_record_boundary_resumes(confirm_setup, stress_env,  # type: ignore[no-untyped-def]
                                                      stress_registered, tmp_path: Path) -> None:
    """Every point a kill can leave the cache at: after each record, and halfway through the
    next (a torn line)."""
    _, ref = confirm_setup
    n = _lines(ref.run / CACHE_NAME)
    cuts = 0
    for keep in range(1, n):
        for torn in (False, True):
            _cut_and_resume(ref, tmp_path, stress_env, keep, torn)
            cuts += 1
    figures("cache cut at every record boundary, resumed", cuts=cuts)


# ================================================ trials that die after the build: the outcomes
EXPECTED = {
    "segv_load": (Outcome.CRASHED, "killed by SIGSEGV during load"),
    "abort_load": (Outcome.CRASHED, "killed by SIGABRT during load"),
    "oom_load": (Outcome.CRASHED, "out of memory"),
    "raise_load": (Outcome.RUNTIME_ERROR, "injected raise failure"),
    "segv_run": (Outcome.CRASHED, "killed by SIGSEGV during validate"),
    "oom_run": (Outcome.CRASHED, "out of memory"),
    "hang_run": (Outcome.TIMEOUT, "killed after 4 s during validate"),
    "raise_run": (Outcome.RUNTIME_ERROR, "injected raise failure"),
    "segv_time": (Outcome.CRASHED, "killed by SIGSEGV during time"),
    "oom_time": (Outcome.CRASHED, "out of memory"),
}
DEFAULT_HAZARDS = ("segv_load", "raise_load", "oom_run", "segv_time")


def _hazards(sample, stress_env, monkeypatch, tmp_path: Path, hazards: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PYTHONPATH", stress_env["PYTHONPATH"])
    _, spec = sample("convnet", backend=_stress_backend.NAME, strategy="fast",
                     selection=f"-pace=[slow|fast] -hazard=[none|{'|'.join(hazards)}]")
    # 4 s where a hang must hit the timeout; otherwise room for a slow phase of a shared host
    # (a healthy baseline trial took over 4 s there once)
    limit = 4.0 if "hang_run" in hazards else 20.0
    timing = TINY_TIMING.model_copy(update={"trial_timeout_s": limit,
                                            "trial_memory_limit_mb": 2048})
    t0 = time.monotonic()
    res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run")
    by_route = {t.route: t for t in res.cache.trials if t.role != "confirm"}
    assert len(by_route) == len(hazards) + 2  # the baseline, each hazard, then pace=fast
    for hazard in hazards:
        t = by_route[f"-hazard={hazard} -pace=slow"]
        outcome, reason = EXPECTED[hazard]
        assert t.outcome is outcome, (hazard, t.outcome, t.reason)
        assert reason in (t.reason or ""), (hazard, t.reason)
        assert t.engine is None  # an engine that crashes is not kept
    # the search went on after every crash, and the healthy route after them still won
    fast = by_route["-hazard=none -pace=fast"]
    assert fast.index == len(hazards) + 1 and fast.admissible
    # no screening reading vetoes (the run's own A/A included): the confirmation decides
    assert res.decision.gain and res.decision.shipped_route == fast.route, res.decision.reason
    assert len(TuningCache.open(tmp_path / "run" / CACHE_NAME).trials) == len(res.cache.trials)
    figures("trials dying after the build", hazards=len(hazards),
            outcomes=dict(Counter(by_route[f"-hazard={x} -pace=slow"].outcome.value
                                  for x in hazards)), seconds=round(time.monotonic() - t0, 1))


def test_trials_that_die_after_the_build_are_recorded_and_the_search_goes_on(  # type: ignore[no-untyped-def]
        sample, stress_env, stress_registered, monkeypatch, tmp_path: Path) -> None:
    _hazards(sample, stress_env, monkeypatch, tmp_path, DEFAULT_HAZARDS)


@pytest.mark.slow
def test_every_post_build_hazard(sample, stress_env, stress_registered, monkeypatch,  # type: ignore[no-untyped-def]
                                 tmp_path: Path) -> None:
    _hazards(sample, stress_env, monkeypatch, tmp_path, tuple(EXPECTED))


# ============================================================ kill -9 of bundle and pack writes
def _big_engine_run(rel: dict[str, h.Released], dest: Path, mib: int) -> Path:
    """A copy of the convnet run whose baseline engine is ``mib`` MiB of random bytes (its
    digest fixed in the cache): bundling it takes long enough to be interrupted."""
    run = dest / "run"
    shutil.copytree(rel["convnet"].run, run)
    engine = run / "engines" / "trial-0000.ort"
    rng = random.Random(mib)
    with open(engine, "wb") as f:
        for _ in range(mib):
            f.write(rng.randbytes(1 << 20))
    digest = digest_file(engine)[0]
    h.rewrite_cache(run / CACHE_NAME, lambda r: {**r, "engine_digest": digest}
                    if r["kind"] == "trial" and r["index"] == 0 else r)
    return run


def _staging(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if ".staging-" in p.name] if folder.exists() else []


def _kill_writes(rel: dict[str, h.Released], tmp_path: Path, kills: int, seed: int) -> None:
    """Kill ``dossier bundle`` and ``dossier pack`` until ``kills`` kills of each landed while
    they wrote (a staging entry of theirs is left over)."""
    run = _big_engine_run(rel, tmp_path, 48)
    env = _env()
    log = tmp_path / "writes.log"
    src = tmp_path / "src"
    proc = _dossier(["bundle", run, "--out", src], env, log)
    _wait(lambda: bool(_staging(src)), proc, poll=0.0005)
    t0 = time.monotonic()
    _wait(lambda: (src / "convnet-1.dossier").exists(), proc, poll=0.0005)
    write_s = time.monotonic() - t0  # from the staging folder's creation to the rename
    assert proc.wait(timeout=300) == 0, _log_text(log)
    bundle = src / "convnet-1.dossier"
    jobs = {"bundle": (["bundle", run, "--out"], tmp_path / "out-bundle", "convnet-1.dossier"),
            "pack": (["pack", bundle, "--out"], tmp_path / "out-pack", "convnet-1.dossier.tar")}
    rng = random.Random(seed)
    landed: Counter = Counter()
    attempts = 0
    while min(landed["bundle"], landed["pack"]) < kills:
        attempts += 1
        assert attempts <= 10 * kills, f"kills keep missing the writes: {dict(landed)}"
        kind = "bundle" if landed["bundle"] <= landed["pack"] else "pack"
        args, out, name = jobs[kind]
        target = out / name
        before = set(_staging(out))
        proc = _dossier([*args, out], env, log)
        if rng.random() < 0.8:  # a random moment of the write
            _wait(lambda out=out, before=before: bool(set(_staging(out)) - before), proc,
                  poll=0.0005)
            time.sleep(rng.uniform(0, write_s))
        else:  # any moment of the command, start-up included
            time.sleep(rng.uniform(0, 3.0))
        _kill(proc)
        if target.exists():  # the writer finished before the kill: the result must be whole
            with open_bundle(target) as b:
                assert check_integrity(b), "a partial bundle is visible at the target path"
            shutil.rmtree(target) if target.is_dir() else target.unlink()
            continue
        landed[kind] += bool(set(_staging(out)) - before)  # killed while writing: staging only
    leftovers = {kind: len(_staging(out)) for kind, (_, out, _) in jobs.items()}
    for args, out, name in jobs.values():
        res = h.cli(*args, out)  # the next write removes what killed ones left, and succeeds
        assert res.exit_code == 0, h.said(res)
        assert sorted(p.name for p in out.iterdir()) == [name]
        with open_bundle(out / name) as b:
            assert check_integrity(b)
    figures("kill -9 of bundle and pack writes", kills=dict(landed), attempts=attempts,
            leftovers_removed=leftovers, write_s=round(write_s, 3))


def test_killed_bundle_and_pack_writes_never_leave_a_partial_result(  # type: ignore[no-untyped-def]
        rel, tmp_path: Path) -> None:
    _kill_writes(rel, tmp_path, kills=2, seed=3)


@pytest.mark.slow
def test_killed_bundle_and_pack_writes_many_times(rel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _kill_writes(rel, tmp_path, kills=max(SLOW_KILLS, 20), seed=33)


# ============================================================================== tamper: every byte
def _small_files(bundle: Path) -> dict[str, bytes]:
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in sorted(bundle.rglob("*"))
            if p.is_file() and p.stat().st_size < (1 << 20)}


def _manifest_change_detected(data: bytes) -> bool:
    """A changed manifest is refused when it no longer parses, or when its content no longer
    matches its dossier id (what check_integrity reports)."""
    try:
        raw, manifest, _ = parse_manifest(data)
    except BundleFormatError:
        return True
    return body_digest(raw) != manifest.dossier_id


def test_every_byte_of_every_small_file_is_covered(rel: dict[str, h.Released]) -> None:
    """Each byte of each file under 1 MiB, changed (every bit inverted; for manifest.json also
    just the lowest bit), is detected: by the file's xxh3-128 against the file table (in memory,
    the digest check_integrity compares; the on-disk path is tested below), or for
    manifest.json by parse_manifest refusing it or by its dossier id.

    The id is computed over the manifest's JSON *value*, so a change that keeps the value (the
    17th significant digit of a float that rounds to the same double) is invisible to it, and
    harmless: every reader sees the same manifest. The signature, over the bytes, still sees
    it (tests/trust/test_signing.py)."""
    bundle = rel["convnet"].bundle
    with open_bundle(bundle) as b:
        table, original = b.manifest.table(), b.raw
    files = _small_files(bundle)
    assert "manifest.json" in files and "engine/convnet.ort" in files and len(files) == 18
    done = detected = same_value = 0
    for rel_path, data in files.items():
        buf = bytearray(data)
        masks = (0xFF, 0x01) if rel_path == "manifest.json" else (0xFF,)
        for offset in range(len(buf)):
            for mask in masks:
                buf[offset] ^= mask
                if rel_path == "manifest.json":
                    caught = _manifest_change_detected(bytes(buf))
                    if not caught:
                        assert json.loads(bytes(buf)) == original, (offset, mask)
                        same_value += 1
                else:
                    caught = digest_bytes(buf) != table[rel_path].digest  # type: ignore[arg-type]
                    assert caught, (rel_path, offset, mask)
                buf[offset] ^= mask
                done += 1
                detected += caught
    assert done == detected + same_value > 300_000
    assert same_value < 20
    figures("every byte of every small file changed", files=len(files), changes=done,
            detected=detected, manifest_value_unchanged=same_value,
            bytes=sum(map(len, files.values())))


def _flip_and_check(bundle: Path, rel_path: str, offset: int, opened=None) -> bool:  # type: ignore[no-untyped-def]
    """Invert one byte on disk, run the real check (open_bundle + check_integrity; an opened
    Bundle is reused unless the manifest itself changed), undo it. True when it was caught."""
    path = bundle / rel_path
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    try:
        if opened is not None and rel_path != "manifest.json":
            report = check_integrity(opened)
        else:
            with open_bundle(bundle) as b:
                report = check_integrity(b)
        return not report and any(p.path == rel_path for p in report.problems)
    except BundleFormatError:  # the manifest no longer parses: refused
        return rel_path == "manifest.json"
    finally:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(byte)


def _tamper_on_disk(rel: dict[str, h.Released], tmp_path: Path, sample: int | None) -> None:
    """Byte changes on disk, each through the real open_bundle + check_integrity: ``sample``
    random offsets, or (None) every byte of every small file."""
    bundle = h.copy_bundle(rel["convnet"].bundle, tmp_path)
    sizes = {k: len(v) for k, v in _small_files(bundle).items()}
    if sample is None:
        plan = [(f, o) for f, n in sizes.items() for o in range(n)]
    else:
        rng = random.Random(sample)
        names = sorted(sizes)
        plan = [(f, rng.randrange(sizes[f])) for f in (rng.choice(names) for _ in range(sample))]
    with open_bundle(bundle) as opened:
        missed = [(f, o) for f, o in plan if not _flip_and_check(bundle, f, o, opened)]
    assert not missed, missed[:10]
    with open_bundle(bundle) as b:
        assert check_integrity(b)  # every change was undone: the copy is intact again
    figures("byte changes through check_integrity", changes=len(plan), detected=len(plan))


def test_sampled_byte_changes_on_disk_are_named(rel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _tamper_on_disk(rel, tmp_path, sample=300)


@pytest.mark.slow
def test_every_byte_change_on_disk_is_named(rel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _tamper_on_disk(rel, tmp_path, sample=None)


def test_changes_anywhere_in_a_multi_chunk_engine_are_named(rel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An engine of several read chunks (1 MiB each): a change at either side of each chunk
    boundary, at the ends and at random offsets is named."""
    run = _big_engine_run(rel, tmp_path, 3)
    written = write_bundle(run, tmp_path / "out")
    bundle = written.path
    engine = written.manifest.engines.baseline.path
    size = (bundle / engine).stat().st_size
    assert size == 3 * CHUNK
    rng = random.Random(5)
    offsets = sorted({0, 1, size - 1, size - 2, *(k * CHUNK + d for k in (1, 2) for d in (-1, 0)),
                      *(rng.randrange(size) for _ in range(24))})
    for offset in offsets:
        assert _flip_and_check(bundle, engine, offset), offset
    with open(bundle / engine, "ab") as f:  # a byte appended
        f.write(b"\0")
    with open_bundle(bundle) as b:
        assert [str(p) for p in check_integrity(b).problems] == [
            f"{engine}: altered ({size + 1} bytes, the manifest says {size})"]
    figures("engine byte changes", engine_bytes=size, changes=len(offsets) + 1)


# ======================================================================== archive attacks (more)
@pytest.fixture(scope="module")
def packed(rel: dict[str, h.Released], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dossier.bundle import pack_bundle

    return pack_bundle(rel["convnet"].bundle, tmp_path_factory.mktemp("packed"))


def _members(tar_path: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f else None))
    return out


def _write_tar(path: Path, members, fmt: int = tarfile.PAX_FORMAT) -> Path:  # type: ignore[no-untyped-def]
    with tarfile.open(path, "w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _refused(archive: Path, tmp_path: Path, error: type[Exception]) -> str:
    """extract_archive refuses ``archive`` with ``error`` and writes nothing; the CLI says so
    in one line with exit 6. Returns the message."""
    parent = tmp_path / "extract"
    parent.mkdir(exist_ok=True)
    before = h.snapshot(tmp_path)
    with pytest.raises(error) as exc:
        extract_archive(archive, parent / "target")
    assert h.snapshot(tmp_path) == before
    res = h.cli("verify", archive, "--integrity-only")
    assert res.exit_code == ExitCode.BUNDLE and res.stderr.count("\n") == 1, res.stderr
    assert h.snapshot(tmp_path) == before
    return str(exc.value)


ROOT = "convnet-1.dossier"


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_compressed_archives_are_refused_before_expansion(packed: Path, tmp_path: Path,
                                                          compression: str) -> None:
    """A dossier archive is an uncompressed tar; a compressed one (even of a valid bundle) is
    not one, and its first block already says so: nothing is decompressed."""
    import bz2
    import lzma

    data = packed.read_bytes()
    squeeze = {"gz": lambda d: gzip.compress(d, mtime=0), "bz2": bz2.compress,
               "xz": lzma.compress}[compression]
    archive = tmp_path / f"convnet-1.dossier.tar.{compression}"
    archive.write_bytes(squeeze(data))
    assert "neither a bundle folder nor a bundle archive" in _refused(archive, tmp_path,
                                                                       BundleFormatError)


def test_a_decompression_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    """A 1 MiB gzip file that expands to 1 GiB (64 members of 16 MiB of zeros): refused after
    reading one 512-byte block, in well under a second, with nothing written."""
    member = gzip.compress(bytes(16 << 20), compresslevel=9, mtime=0)
    bomb = tmp_path / "bomb.dossier.tar"
    with open(bomb, "wb") as f:
        for _ in range(64):
            f.write(member)
    assert bomb.stat().st_size < (2 << 20)
    assert gzip.decompress(member[:64] + member[64:]).count(0) == 16 << 20  # it is gzip
    t0 = time.perf_counter()
    _refused(bomb, tmp_path, BundleFormatError)
    assert time.perf_counter() - t0 < 5  # both refusals together; expanding would take longer


def _pax_path(members, name: str):  # type: ignore[no-untyped-def]
    """Add a member whose pax header sets its path to ``name`` (the ustar name looks harmless)."""
    info = tarfile.TarInfo(f"{ROOT}/harmless.txt")
    info.size, info.mode = 1, 0o644
    info.pax_headers = {"path": name}
    return [*members, (info, b"x")]


def _long_name(members, name: str):  # type: ignore[no-untyped-def]
    info = tarfile.TarInfo(name)
    info.size, info.mode = 1, 0o644
    return [*members, (info, b"x")]


MORE_ATTACKS = {
    "pax-path-dotdot": lambda m: _pax_path(m, f"{ROOT}/../../evil"),
    "pax-path-absolute": lambda m: _pax_path(m, "/tmp/dossier-evil"),
    "gnu-longname-dotdot": lambda m: _long_name(m, f"{ROOT}/{'a' * 120}/../../../evil"),
    "backslash": lambda m: _long_name(m, f"{ROOT}\\..\\evil"),
    "dot-segment": lambda m: _long_name(m, f"{ROOT}/./knobs.json"),
    "empty-segment": lambda m: _long_name(m, f"{ROOT}//knobs.json"),
    "drive-letter": lambda m: _long_name(m, "C:/evil"),
}


@pytest.mark.parametrize("kind", sorted(MORE_ATTACKS))
def test_more_path_attacks_are_refused(packed: Path, tmp_path: Path, kind: str) -> None:
    fmt = tarfile.GNU_FORMAT if kind.startswith("gnu") else tarfile.PAX_FORMAT
    evil = _write_tar(tmp_path / "evil.tar", MORE_ATTACKS[kind](_members(packed)), fmt)
    assert "nothing was extracted" in _refused(evil, tmp_path, UnsafeArchiveError)
    assert not Path("/tmp/dossier-evil").exists()


def test_a_manifest_member_that_is_a_link_is_refused(packed: Path, tmp_path: Path) -> None:
    members = [(m, d) for m, d in _members(packed) if m.name != f"{ROOT}/manifest.json"]
    link = tarfile.TarInfo(f"{ROOT}/manifest.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    evil = _write_tar(tmp_path / "evil.tar", [members[0], (link, None), *members[1:]])
    assert "is not a regular file" in _refused(evil, tmp_path, UnsafeArchiveError)


def test_a_huge_manifest_member_is_refused_unread(tmp_path: Path) -> None:
    info = tarfile.TarInfo(f"{ROOT}/manifest.json")
    info.size = MANIFEST_MAX_BYTES + 1
    evil = _write_tar(tmp_path / "evil.tar", [(info, bytes(info.size))])
    assert "larger than 16 MiB" in _refused(evil, tmp_path, BundleFormatError)


def test_truncated_archives_are_refused_and_leave_nothing(packed: Path, tmp_path: Path) -> None:
    """Cut anywhere before the end of the last member's data: inside a header or a file's data
    the archive is refused as corrupt, and exactly at a member boundary (tar needs no end
    marker) as an archive that holds fewer files than its manifest lists; either way before a
    byte is written, verify exits 6 and nothing is left behind. (Cut in the zero blocks after
    the last member, the archive is whole.)"""
    data = packed.read_bytes()
    with tarfile.open(packed) as tar:
        members = tar.getmembers()
    boundaries = [m.offset for m in members][2:]
    end = members[-1].offset_data + members[-1].size
    rng = random.Random(11)
    cuts = sorted({100, 700, len(data) // 2, end - 1, *boundaries[::4],
                   *(rng.randrange(512, end) for _ in range(8))})
    corrupt = short = 0
    for cut in cuts:
        archive = tmp_path / "in" / f"cut-{cut}.dossier.tar"
        archive.parent.mkdir(exist_ok=True)
        archive.write_bytes(data[:cut])
        before = h.snapshot(tmp_path)
        with pytest.raises((BundleFormatError, UnsafeArchiveError)) as exc:
            extract_archive(archive, tmp_path / "x")
        if isinstance(exc.value, UnsafeArchiveError):
            assert "the manifest lists 17 files, the archive holds" in str(exc.value)
            short += 1
        else:
            corrupt += 1
        assert h.snapshot(tmp_path) == before
        for args in (("verify", archive, "--integrity-only"), ("inspect", archive)):
            res = h.cli(*args)
            assert res.exit_code == ExitCode.BUNDLE, (cut, res.stderr)
            assert h.snapshot(tmp_path) == before
        archive.unlink()
    assert corrupt and short
    figures("truncated archives", cuts=len(cuts), refused_as_corrupt=corrupt,
            refused_as_short=short)


@pytest.mark.slow
def test_a_member_count_bomb_is_refused(tmp_path: Path) -> None:
    from dossier.bundle.archive import MAX_MEMBERS

    evil = tmp_path / "many.dossier.tar"
    with tarfile.open(evil, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(MAX_MEMBERS + 2):
            info = tarfile.TarInfo(f"d/{i}")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
    assert f"more than {MAX_MEMBERS} members" in _refused(evil, tmp_path, UnsafeArchiveError)
