"""The decision under a server or offline scenario, with the single-stream decision's discipline:

- **the unit is the repetition**: in each repetition every configuration's metric (the highest
  rate meeting the bound, or the offline throughput) is measured once, each LoadGen run in a
  process of its own, in an order rotated from one repetition to the next; a candidate's
  observation is the log ratio of its metric over the baseline's *in the same repetition*;
- **the A/A**: the baseline is measured twice in every repetition (two loads of one
  configuration); a candidate's log ratio is taken against the A/A copy, so that what two
  loads of one configuration differ by is part of the noise the candidate must clear, and the
  A/A's own ratio is tested two-sided against 1 (a difference there says the procedure cannot
  tell configurations apart on this host);
- **the minimum effect and Holm's step-down**: a candidate ships only when the mean of its log
  ratios exceeds ``log(1 + min_effect)``, one-sided Student's t over repetitions
  (:func:`dossier.measure.timing.process_stats`), at ``alpha / (m - i)`` for the i-th smallest
  p-value of m candidates, stopping at the first that fails; of those that pass, the highest
  mean ships; none: the baseline ships. The p-value is the larger of Student's t's and the
  sign test's (``0.5 ** n`` when every ratio clears the bound): the search's rates lie on a
  grid and the metric is heavy-tailed on a busy host, where the t-test alone shipped an A/A
  (2 of 10, 2026-12-06).

Configurations are :class:`~dossier.scenarios.child.ScenarioRequest` values (an engine, a route,
sessions); the metric of one is :func:`~dossier.scenarios.search.serve_configuration`, which
this module takes as a parameter so that the rule is tested without a clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dossier.measure.reading import log_effect
from dossier.measure.timing import process_stats
from dossier.scenario import ScenarioSection
from dossier.scenarios.child import ScenarioRequest
from dossier.scenarios.models import AA, Reading, ScenarioDecision, ScenarioResult, Verdict
from dossier.scenarios.search import serve_configuration

Measure = Callable[[str, ScenarioRequest, Path, float | None], ScenarioResult]
"""How one configuration's metric is measured: (name, request, work folder, rate to start
from) -> result."""


def _logs(mine: Sequence[float], theirs: Sequence[float]) -> list[float]:
    return [math.log(a / b) for a, b in zip(mine, theirs) if a > 0 and b > 0]


def _verdict(name: str, logs: list[float], confidence: float, bound: float | None,
             repetitions: int) -> Verdict:
    if len(logs) < 2:
        return Verdict(name=name, ratio=None, low=None, high=None, p_value=None,
                       reason=f"a rate met in {len(logs)} of {repetitions} repetitions by both "
                              "(two are needed)")
    st = process_stats(logs, confidence, bound=bound)
    p = max(st.p_value, _sign_p(logs, bound))  # both: the t-test alone is not robust here
    return Verdict(name=name, ratio=math.exp(st.mean), low=math.exp(st.low),
                   high=math.exp(st.high), p_value=p)


def _sign_p(logs: Sequence[float], bound: float | None) -> float:
    """The sign test's p-value: one-sided ``0.5 ** n`` when every ratio is above ``bound``
    (two-sided against 0 without one: ``2 * 0.5 ** n`` when all have one sign); 1 otherwise.
    A search's rates lie on a grid (doubling, then bisecting the bracket), so ratios that agree
    to within its resolution are common, and Student's t reads their near-zero spread as
    certainty; and the metric's spread between repetitions is heavy-tailed on a busy host. The
    sign test's false-positive rate holds whatever the distribution (an A/A shipped 2 of 10
    with the t-test alone, 2026-12-06); it needs ``0.5 ** n`` below the level: 5 repetitions
    for one candidate at 0.05, 6 for two."""
    n = len(logs)
    if bound is None:
        same = all(x > 0 for x in logs) or all(x < 0 for x in logs)
        return min(1.0, 2 * 0.5 ** n) if same else 1.0
    return 0.5 ** n if all(x > bound for x in logs) else 1.0


def judge(scenario: ScenarioSection, baseline: str, readings: Mapping[str, Sequence[float]],
          *, min_effect: float, alpha: float, confidence: float) -> tuple[str, list[Verdict]]:
    """The configuration that ships and the verdicts, from the metrics per repetition
    (``readings`` holds the baseline, its A/A copy under :data:`AA`, and the candidates)."""
    reps = len(readings[baseline])
    against = readings.get(AA, readings[baseline])
    bound = log_effect(min_effect)
    candidates = [n for n in readings if n not in (baseline, AA)]
    verdicts = {n: _verdict(n, _logs(readings[n], against), confidence, bound, reps)
                for n in candidates}
    order = sorted((v.p_value, n) for n, v in verdicts.items() if v.p_value is not None)
    m = len(order)
    stopped = False
    for i, (p, n) in enumerate(order):
        level = alpha / (m - i)
        ok = not stopped and p < level
        stopped = stopped or not ok
        verdicts[n] = verdicts[n].model_copy(update={"level": level, "confirmed": ok})
    out = [verdicts[n] for n in candidates]
    if AA in readings:
        out.append(_verdict(AA, _logs(readings[AA], readings[baseline]), confidence, None, reps))
    confirmed = [v for v in out if v.confirmed]
    shipped = max(confirmed, key=lambda v: v.ratio or 0.0).name if confirmed else baseline
    return shipped, out


def decide(scenario: ScenarioSection, baseline: tuple[str, ScenarioRequest],
           candidates: Sequence[tuple[str, ScenarioRequest]], work: Path, *,
           min_effect: float, alpha: float, confidence: float, aa: bool = True,
           start_qps: float | None = None, measure: Measure | None = None,
           progress: Callable[[str], None] | None = None) -> ScenarioDecision:
    """Measure the baseline (twice with ``aa``) and every candidate in ``scenario.processes``
    repetitions, order rotated, and decide (:func:`judge`). Each search starts from the rate
    the configuration met in its previous repetition (the baseline's, or ``start_qps``, before
    it met one)."""
    configs = [(baseline[0], baseline[1])] + ([(AA, baseline[1])] if aa else []) \
        + list(candidates)
    run = measure or _measure(scenario)
    readings: dict[str, list[float]] = {n: [] for n, _ in configs}
    results: dict[str, list[ScenarioResult]] = {n: [] for n, _ in configs}
    for rep in range(scenario.processes):
        shift = rep % len(configs)
        for index, (name, req) in enumerate(configs[shift:] + configs[:shift]):
            known = [r for r in (readings[name] or readings[baseline[0]]) if r > 0]
            start = known[-1] if known else start_qps  # the last rate it (or the baseline) met
            if progress is not None:
                progress(f"repetition {rep + 1}/{scenario.processes}: {name}")
            res = run(name, req, work / f"rep-{rep:02d}" / f"{(index + shift) % len(configs):02d}",
                      start)
            readings[name].append(res.metric_qps)
            results[name].append(res)
    shipped, verdicts = judge(scenario, baseline[0], readings, min_effect=min_effect,
                              alpha=alpha, confidence=confidence)
    return ScenarioDecision(
        scenario=scenario, baseline=baseline[0], shipped=shipped,
        repetitions=scenario.processes,
        readings=[Reading(name=n, route=req.route, metric_qps=readings[n], results=results[n])
                  for n, req in configs],
        verdicts=verdicts, min_effect=min_effect, alpha=alpha)


def _measure(scenario: ScenarioSection) -> Measure:
    def run(name: str, req: ScenarioRequest, work: Path, start: float | None) -> ScenarioResult:
        return serve_configuration(req, scenario, work, start_qps=start)
    return run
