"""The decision rule: which route ships, and why.

0. **Calibration.** Trial 0 times the baseline against a second load of itself. It is judged
   like any candidate: when it reads a significant difference (p < alpha) of at least the
   minimum effect, the procedure is biased on this host by about that much and nothing ships.
   A smaller significant difference is below what the rule would ship; a gain must still clear
   the A/A interval's upper end.
1. **Screening.** Candidates are admissible search trials significantly faster than the
   baseline (signed-rank test over rounds, p < alpha) by at least 1 + min_effect, whose
   interval lies above 1.0 and its lower end above the upper end of the A/A interval (a gain must exceed what
   two loads of the same engine can read).
2. **Independent confirmation** (:mod:`dossier.replicate`). The best ``confirm_top`` candidates,
   the baseline and a second load of the baseline are re-measured, one fresh process per
   engine, in production load configuration, over ``confirm_rounds`` rounds. A significant
   confirmation A/A stops the release. A candidate is confirmed when its signed-rank p is below
   alpha / k (Bonferroni over the k candidates), its interval excludes 1.0, its speedup reaches
   1 + min_effect, and its interval's lower end lies above the confirmation A/A's upper end.
   In two or more process generations a candidate's interval also covers a new generation's
   reading (a re-measurement is one), while the A/A's covers the generations' mean: the A/A
   estimates the procedure's bias, and a gain must clear that bias with its own spread, not
   the spread of a second A/A reading on top (:func:`dossier.timing.log_interval`).
3. The confirmed candidate with the largest confirmed speedup ships; if none is, the baseline
   ships and the result is "no significant gain", with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from dossier.cache import DecisionRecord
from dossier.timing import TimingSettings, compare
from dossier.trial import Comparison, Reading, TrialRecord
from dossier.verdict import speed_verdict


def rule_text(settings: TimingSettings) -> str:
    """The decision rule in words, with the numbers in force."""
    return (f"the A/A trial (baseline against a second load of itself) must not differ "
            f"(signed-rank test over rounds, alpha={settings.alpha:g}) by "
            f"{settings.min_effect:.0%} or more; admissible routes "
            f"faster than the baseline (p < alpha) by at least {settings.min_effect:.0%}, with "
            f"their interval's lower end above the A/A interval's upper end, were re-measured "
            f"independently (top {settings.confirm_top}, one fresh process per engine"
            f"{_generations(settings)}, production load options, {settings.confirm_rounds} "
            f"rounds, with its own A/A) at "
            f"alpha/k (Bonferroni); a confirmed interval must exclude 1.0 and lie above the "
            f"confirmation A/A's; the largest confirmed speedup ships, else the baseline")


def _generations(settings: TimingSettings) -> str:
    n = settings.confirm_processes
    return (f" in each of {n} process generations, a candidate's interval also covering a new "
            f"generation's reading, the A/A's the generations' mean" if n > 1 else "")


def confirmation_comparison(baseline: Sequence[Sequence[float]],
                            candidate: Sequence[Sequence[float]], settings: TimingSettings, *,
                            aa: bool, candidates: int, baseline_warmup: int = 0) -> Comparison:
    """One reading of the independent confirmation (step 2), from its rounds: the
    confirmation's A/A (``aa``) at alpha with the interval of the procedure's bias, a candidate
    at alpha / ``candidates`` (Bonferroni) with the interval that covers a new generation."""
    return compare(baseline, candidate, settings,
                   alpha=settings.alpha if aa else settings.alpha / max(candidates, 1),
                   baseline_warmup=baseline_warmup, procedure="independent", bias=aa)


def calibration(trials: Sequence[TrialRecord], settings: TimingSettings) -> Reading | None:
    """The run's A/A reading (trial 0's comparison), judged at alpha like a candidate."""
    base = next((t for t in trials if t.role == "baseline"), None)
    return base.reading(settings.alpha, settings.min_effect) if base else None


def confirm_calibration(trials: Sequence[TrialRecord], settings: TimingSettings) -> Reading | None:
    """The independent confirmation's A/A reading (its last round), judged as
    :func:`calibration`."""
    base = next((t for t in trials if t.role == "baseline"), None)
    found = [t for t in trials if t.role == "confirm" and base and t.route == base.route]
    return found[-1].reading(settings.alpha, settings.min_effect) if found else None


def _clears(t: TrialRecord, aa: Reading | None) -> bool:
    return aa is None or t.comparison is None or t.comparison.speedup_ci_low > aa.speedup_ci_high


def candidates(trials: Sequence[TrialRecord], settings: TimingSettings) -> list[TrialRecord]:
    """Search trials that screened significantly faster than the baseline and above the A/A
    reading, best first."""
    aa = calibration(trials, settings)
    found = [t for t in trials if t.role == "search" and t.faster and t.comparison is not None
             and _clears(t, aa)]
    return sorted(found, key=lambda t: (-t.comparison.speedup, -t.comparison.speedup_ci_low))  # type: ignore[union-attr]


def best_admissible(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The admissible search trial with the largest screened speedup (significant or not)."""
    ok = [t for t in trials if t.role == "search" and t.admissible and t.comparison is not None]
    return max(ok, key=lambda t: t.comparison.speedup) if ok else None  # type: ignore[union-attr]


def _why_not(t: TrialRecord, settings: TimingSettings, alpha: float, aa: Reading | None,
             confirmed: bool = False) -> str:
    assert t.comparison is not None
    v = speed_verdict(t.comparison, alpha=alpha, min_effect=settings.min_effect)
    if v.label == "slower":
        return "slower than the baseline"
    parts = list(v.reasons)
    if aa is not None and not _clears(t, aa):
        parts.append(f"its interval does not clear the {'confirmation ' if confirmed else ''}"
                     f"A/A reading's upper end {aa.speedup_ci_high:.3f}")
    return ", ".join(parts) or v.label


def _aa_reason(aa: Reading, where: str) -> str:
    return (f"no significant gain: the {where}A/A check (the baseline against a second load of "
            f"itself) read {aa.text()}, a significant difference between two loads of the same "
            f"engine of at least the minimum effect: the timing procedure is biased on this "
            f"host by about that much, so no gain of that size can be trusted; the baseline "
            f"ships")


def decide(trials: Sequence[TrialRecord], settings: TimingSettings) -> DecisionRecord:
    """Apply the rule to a finished search (screening and confirmation trials)."""
    baseline = next(t for t in trials if t.role == "baseline")
    aa = calibration(trials, settings)
    caa = confirm_calibration(trials, settings)
    # the last measurement of each route: a round cut short by a kill was re-timed whole
    confirms = list({t.route: t for t in trials if t.role == "confirm"
                     and t.route != baseline.route and t.comparison is not None}.values())
    screened = candidates(trials, settings)
    k = max(len(confirms), 1)
    alpha = settings.alpha / k
    confirmed = sorted(
        (t for t in confirms if t.comparison.p_value < alpha  # type: ignore[union-attr]
         and t.comparison.speedup_ci_low > 1.0  # type: ignore[union-attr]
         and t.comparison.speedup >= 1 + settings.min_effect  # type: ignore[union-attr]
         and _clears(t, caa)),
        key=lambda t: -t.comparison.speedup)  # type: ignore[union-attr]
    if settings.confirm_top == 0:
        confirms, confirmed, alpha = [], screened, settings.alpha
    common = dict(rule=rule_text(settings), baseline_route=baseline.route,
                  candidates=[t.route for t in confirms], aa=aa, confirm_aa=caa)
    no_gain = dict(shipped_route=baseline.route, shipped_index=baseline.index, gain=False,
                   speedup=None, speedup_ci_low=None, speedup_ci_high=None, p_value=None)
    if aa is not None and aa.significant:
        return DecisionRecord(**common, **no_gain, reason=_aa_reason(aa, ""))
    if caa is not None and caa.significant and confirms:
        return DecisionRecord(**common, **no_gain, reason=_aa_reason(caa, "confirmation's "))
    if confirmed:
        win = confirmed[0]
        c = win.comparison
        assert c is not None
        runner = confirmed[1] if len(confirmed) > 1 else None
        where = ("confirmed independently (a fresh process per engine)" if confirms
                 else "screening measurement")
        index = next(t.index for t in trials if t.route == win.route and t.role == "search")
        cal = caa if confirms else aa
        return DecisionRecord(
            **common, shipped_route=win.route, shipped_index=index, gain=True, speedup=c.speedup,
            speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
            p_value=c.p_value,
            reason=(f"{win.route} was {c.speedup:.3f}x the baseline's speed "
                    f"[{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                    f"(p={c.p_value:.2g} < {alpha:.2g}, {c.rounds or '?'} rounds), {where}"
                    + (f"; the A/A read {cal.text()}" if cal else "")),
            runner_up_route=runner.route if runner else None,
            runner_up_speedup=runner.comparison.speedup if runner and runner.comparison else None)
    best: TrialRecord | None
    if confirms:
        best = max(confirms, key=lambda t: t.comparison.speedup if t.comparison else 0.0)
        c = best.comparison
        assert c is not None
        reason = (f"no significant gain: {len(screened)} route(s) screened faster, but none was "
                  f"confirmed independently; the best, {best.route}, measured "
                  f"{c.speedup:.3f}x [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                  f"({_why_not(best, settings, alpha, caa, confirmed=True)}); the baseline ships")
    else:
        best = best_admissible(trials)
        if best is None:
            reason = "no significant gain: no other route was admissible; the baseline ships"
        else:
            c = best.comparison
            assert c is not None
            reason = (f"no significant gain: the best admissible route, {best.route}, measured "
                      f"{c.speedup:.3f}x [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                      f"({_why_not(best, settings, settings.alpha, aa)}); the baseline ships")
    return DecisionRecord(**common, **no_gain, reason=reason,
                          runner_up_route=best.route if best else None,
                          runner_up_speedup=best.comparison.speedup if best and best.comparison else None)
