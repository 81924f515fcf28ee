"""The highest rate meeting a server scenario's bound, found by a bounded search over LoadGen
runs; the throughput of an offline scenario.

The search (:func:`highest_rate`) probes a rate, doubles it while the bound holds and halves it
while it does not, then bisects between the highest rate met and the lowest missed, until the
two are within :data:`RESOLUTION` of each other or ``steps`` runs are spent. Whether a rate is
met is dossier's reading of LoadGen's own statistics
(:meth:`~dossier.scenarios.logs.LoadGenRun.meets`); a run that fails (overran its time limit)
counts as not met and is recorded as failed. LoadGen's VALID/INVALID is kept on every probe,
as LoadGen's.

:func:`serve_configuration` runs that search for one engine configuration, each LoadGen run in
a child process (:func:`dossier.scenarios.child.measure`), and appends each finished probe to
``probes.jsonl`` as it ends: a run killed half-way loses no finished probe, and the same call
resumes from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from dossier.files import read_small
from dossier.scenario import ScenarioSection, check_bound
from dossier.scenarios.child import RunFailed, ScenarioRequest, measure
from dossier.scenarios.models import Probe, RunSettings, ScenarioResult

RESOLUTION = 1.05
"""The search stops when the lowest rate missed is within 5% of the highest met."""
PROBES = "probes.jsonl"
"""The record of a configuration's finished LoadGen runs."""
PROBES_MAX_BYTES = 8 << 20
"""Largest probe record read back."""


def highest_rate(probe: Callable[[float], Probe], start: float, steps: int,
                 done: list[Probe] | None = None) -> tuple[float, float | None, list[Probe]]:
    """The highest rate met, the lowest missed (None if none), and every probe, after at most
    ``steps`` probes (``done``: probes already made, replayed without running again)."""
    probes = list(done or [])
    met, missed = 0.0, math.inf
    for p in probes:
        if p.met:
            met = max(met, p.qps)
        else:
            missed = min(missed, p.qps)
    while len(probes) < steps:
        if missed <= met * RESOLUTION and met > 0:
            break
        if not probes:
            qps = start
        elif met == 0:
            qps = missed / 2
        elif missed == math.inf:
            qps = met * 2
        else:
            qps = (met + missed) / 2
        p = probe(qps)
        probes.append(p)
        if p.met:
            met = max(met, p.qps)
        else:
            missed = min(missed, p.qps)
    return met, (None if missed == math.inf else missed), probes


def read_probes(path: Path) -> list[Probe]:
    """The finished probes of a record (untrusted: size-limited, each line validated; a line
    cut short by a kill, the last one, is dropped)."""
    try:
        text = read_small(path, PROBES_MAX_BYTES, follow=False).decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    out: list[Probe] = []
    for line in text.splitlines():
        probe = _probe(line)
        if probe is None:  # a half-written last line: what follows is not trusted either
            break
        out.append(probe)
    return out


def _probe(line: str) -> Probe | None:
    try:
        return Probe.model_validate_json(line)
    except ValidationError:
        return None


def serve_configuration(source: ScenarioRequest, scenario: ScenarioSection, work: Path, *,
                        start_qps: float | None = None, seed: int = 0) -> ScenarioResult:
    """The scenario's metric for one configuration (``source``: the engine and its sessions,
    its ``settings`` replaced here), its LoadGen runs in child processes under ``work``.
    SpecError when the bound is below the engine's single-inference time."""
    if scenario.kind not in ("server", "offline"):
        raise ValueError(f"no LoadGen search for {scenario.kind!r}")
    work.mkdir(parents=True, exist_ok=True)
    record = work / PROBES
    done = read_probes(record)

    def settings(qps: float) -> RunSettings:
        return RunSettings(kind=scenario.kind, qps=qps, bound_ns=scenario.bound_ns,
                           percentile=scenario.percentile, duration_s=scenario.duration_s,
                           min_queries=scenario.min_queries,
                           max_duration_s=_max_duration(scenario, qps), seed=seed)

    def probe(qps: float) -> Probe:
        req = source.model_copy(update={"settings": settings(qps)})
        try:
            run, single = measure(req, work / f"run-{len(done) + n[0]:03d}",
                                  timeout_s=scenario.run_timeout_s)
            check_bound(scenario, single)
            met = run.meets(scenario.bound_ns, scenario.percentile) \
                if scenario.kind == "server" else run.query_count > 0 and not run.errors
            p = Probe(qps=qps, met=met, run=run, single_ms=single)
        except RunFailed as exc:
            p = Probe(qps=qps, met=False, outcome="failed", reason=str(exc)[:500])
        n[0] += 1
        with open(record, "a", encoding="utf-8") as f:
            f.write(p.model_dump_json() + "\n")
        return p

    n = [0]
    first = start_qps or scenario.target_qps or 100.0
    if scenario.kind == "offline":
        probes = done[:1] or [probe(first)]
        run = probes[0].run
        return ScenarioResult(kind="offline", probes=probes,
                              metric_qps=(run.completed_qps or 0.0) if run else 0.0)
    met, missed, probes = highest_rate(probe, first, scenario.search_steps, done)
    return ScenarioResult(kind="server", metric_qps=met, lowest_missed_qps=missed, probes=probes,
                          target_met=None if scenario.target_qps is None
                          else met >= scenario.target_qps)


def _max_duration(scenario: ScenarioSection, qps: float) -> float:
    """How long LoadGen may issue queries: long enough for the minimum duration and, at a low
    rate, for the minimum query count (1.5 times the time it takes), within most of the run's
    time limit."""
    wanted = max(scenario.duration_s * 3, scenario.duration_s + 5,
                 1.5 * scenario.min_queries / qps)
    return max(scenario.duration_s, min(wanted, 0.8 * scenario.run_timeout_s))


def start_rate(single_ms: float, sessions: int, cores: int) -> float:
    """A first rate to probe: half of what ``sessions`` back-to-back sessions on ``cores``
    cores would serve at ``single_ms`` a query."""
    if single_ms <= 0:
        return 100.0
    return max(1.0, 0.5 * min(sessions, cores) * 1000.0 / single_ms)


def dump(result: ScenarioResult) -> str:
    """A result as the JSON a bundle keeps (sorted keys, indented)."""
    return json.dumps(result.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
