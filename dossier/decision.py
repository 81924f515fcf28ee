"""The decision rule: which route ships, and why.

1. **Screening** ranks. Every admissible search trial is timed against the baseline in its own
   process (rounds, :func:`dossier.measure.timing.compare`); trial 0 times the baseline against a second
   load of itself (the screening A/A, shown, never a veto). The ``confirm_top`` admissible routes
   with the largest screened speedups go on to the confirmation, whatever they read.
2. **The confirmation decides** (:mod:`dossier.measure.confirmation`): measuring processes of their
   own, each with the baseline, its A/A load and the candidates; a candidate's observation per
   process is its log speedup minus the A/A's; Student's t over processes, one-sided against
   the minimum effect, at alpha / (m x L) (m candidates not confirmed yet, Holm's step-down
   from k; L looks of a sequential design that
   stops early when the answer is clear). Nothing the screening read can veto what the
   confirmation shows.
3. The confirmed candidate with the largest speedup ships; if none is, the baseline ships and
   the result is "no significant gain", with the reason (from the figures printed beside it).

With ``confirm_top = 0`` the screening decides alone: a route ships when its signed-rank test
over rounds is significant at alpha, its speedup reaches 1 + min_effect and its interval
excludes 1.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dossier.cache import DecisionRecord
from dossier.measure import confirmation
from dossier.measure.timing import TimingSettings
from dossier.trial import Reading, TrialRecord


def rule_text(settings: TimingSettings) -> str:
    """The decision rule in words, with the numbers in force."""
    if settings.confirm_top == 0:
        return (f"screening alone: a route ships when it is faster than the baseline by at "
                f"least {settings.min_effect:.0%} (signed-rank test over rounds, "
                f"alpha={settings.alpha:g}, interval above 1.0); the largest such speedup "
                f"ships, else the baseline")
    return (f"the {settings.confirm_top} admissible routes screened fastest were confirmed in "
            f"{confirmation.rule_text(settings)} "
            f"(alpha={settings.alpha:g}); the largest confirmed speedup ships, else the baseline")


def calibration(trials: Sequence[TrialRecord], settings: TimingSettings) -> Reading | None:
    """The screening's A/A reading (trial 0's comparison), judged at its level (alpha) like a
    candidate."""
    base = next((t for t in trials if t.role == "baseline"), None)
    return base.reading(settings.min_effect) if base else None


def confirm_calibration(trials: Sequence[TrialRecord], settings: TimingSettings) -> Reading | None:
    """The confirmation's A/A reading (its last measurement), judged at its recorded level."""
    base = next((t for t in trials if t.role == "baseline"), None)
    found = [t for t in trials if t.role == "confirm" and base and t.route == base.route]
    return found[-1].reading(settings.min_effect) if found else None


def candidates(trials: Sequence[TrialRecord], settings: TimingSettings) -> list[TrialRecord]:
    """Search trials the confirmation may re-measure, best first: every admissible one, ranked
    by its screened speedup (screening ranks, it does not judge: on a loaded host a real 1.25x
    gain once screened 0.985x, and a threshold there would have kept it from the
    confirmation), except those whose whole screened interval lies below
    ``confirm_floor``; the tuner takes the first ``confirm_top``. With ``confirm_top = 0``
    the screening judges: those it found significantly faster."""
    if settings.confirm_top == 0:
        found = [t for t in trials if t.role == "search" and t.faster]
    else:
        found = [t for t in trials if t.role == "search" and t.admissible
                 and t.comparison is not None
                 and t.comparison.speedup_ci_high >= settings.confirm_floor]
    return sorted(found, key=lambda t: (-t.comparison.speedup, -t.comparison.speedup_ci_low))  # type: ignore[union-attr]


def race_bar(trials: Sequence[TrialRecord], settings: TimingSettings) -> tuple[float, str] | None:
    """The bar a new screening trial races against (:class:`dossier.measure.timing.Race`), and
    what it is: ``confirm_floor`` (:func:`candidates` leaves out a route whose interval lies
    wholly below it), or, once ``confirm_top`` admissible routes are screened, the lowest lower
    end of their intervals (a route wholly below every one of them cannot rank among the
    first ``confirm_top``), whichever is higher. None: nothing to race against (no
    confirmation, or racing off)."""
    if not settings.race_rounds or settings.confirm_top == 0:
        return None
    bars = [(settings.confirm_floor, f"the confirmation's floor, {settings.confirm_floor:.2f}x")]
    top = candidates(trials, settings)[:settings.confirm_top]
    if len(top) == settings.confirm_top:
        low = min(t.comparison.speedup_ci_low for t in top)  # type: ignore[union-attr]
        bars.append((low, f"the lowest lower end of the {len(top)} route(s) screened fastest"))
    bar = max(bars, key=lambda b: b[0])
    return bar if bar[0] > 0 else None


def best_admissible(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The admissible search trial with the largest screened speedup (significant or not)."""
    ok = [t for t in trials if t.role == "search" and t.admissible and t.comparison is not None]
    return max(ok, key=lambda t: t.comparison.speedup) if ok else None  # type: ignore[union-attr]


def _why_not(t: TrialRecord, settings: TimingSettings) -> str:
    assert t.comparison is not None
    v = t.comparison.verdict(settings.min_effect)
    return "slower than the baseline" if v.label == "slower" else ", ".join(v.reasons) or v.label


def decide(trials: Sequence[TrialRecord], settings: TimingSettings, *,
           stopped: str | None = None, excluded: Mapping[str, str] | None = None
           ) -> DecisionRecord:
    """Apply the rule to a finished search (screening and confirmation trials). ``excluded``:
    routes that may not ship whatever they measured, each with what stopped it, as a clause
    ("failed the hold-out set (...)", or held as conditional on the load); the next confirmed
    route ships, or the baseline."""
    excluded = dict(excluded or {})
    baseline = next(t for t in trials if t.role == "baseline")
    aa = calibration(trials, settings)
    caa = confirm_calibration(trials, settings)
    # the last measurement of each route: a confirmation cut short by a kill was re-run whole
    confirms = list({t.route: t for t in trials if t.role == "confirm"
                     and t.route != baseline.route and t.comparison is not None}.values())
    screened = candidates(trials, settings)
    if settings.confirm_top == 0:
        confirms, confirmed = [], [t for t in screened if t.route not in excluded]
    else:
        confirmed = sorted((t for t in confirms if t.comparison is not None
                            and t.comparison.verdict(settings.min_effect).label == "faster"
                            and t.route not in excluded),
                           key=lambda t: -t.comparison.speedup)  # type: ignore[union-attr]
    level = (confirms[0].comparison.judged_level if confirms and confirms[0].comparison
             else settings.alpha)
    common: dict[str, Any] = dict(
        rule=rule_text(settings), baseline_route=baseline.route,
        candidates=[t.route for t in confirms], aa=aa, confirm_aa=caa,
        k=len(confirms) or None, level=level if confirms else None,
        looks=settings.looks() if confirms else None,
        processes=max((t.comparison.processes or 0 for t in confirms if t.comparison),
                      default=None) or None,
        stopped=stopped, aa_stops=False)
    no_gain = dict(shipped_route=baseline.route, shipped_index=baseline.index, gain=False,
                   speedup=None, speedup_ci_low=None, speedup_ci_high=None, p_value=None)
    if confirmed:
        win = confirmed[0]
        c = win.comparison
        assert c is not None
        runner = confirmed[1] if len(confirmed) > 1 else None
        where = (f"confirmed over {c.processes} measuring processes against the A/A load in "
                 f"each" if confirms else f"screening measurement, {c.rounds or '?'} rounds")
        index = next(t.index for t in trials if t.route == win.route and t.role == "search")
        cal = caa if confirms else aa
        return DecisionRecord(
            **common, shipped_route=win.route, shipped_index=index, gain=True, speedup=c.speedup,
            speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
            p_value=c.p_value,
            reason=(f"{win.route} was {c.speedup:.3f}x the baseline's speed "
                    f"[{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                    f"(p={c.p_value:.2g} < {c.judged_level:.2g}), {where}"
                    + (f"; the A/A read {cal.text()}" if cal else "")),
            runner_up_route=runner.route if runner else None,
            runner_up_speedup=runner.comparison.speedup if runner and runner.comparison else None)
    best: TrialRecord | None
    if excluded:
        first = next(iter(excluded))
        reason = (f"no route ships but the baseline: {', '.join(excluded)} "
                  f"{'was' if len(excluded) == 1 else 'were'} confirmed faster, then "
                  f"{excluded[first]}, and no other route was confirmed")
        best = next((t for t in confirms if t.route == first), None) or best_admissible(trials)
        return DecisionRecord(**common, **no_gain, reason=reason,
                              runner_up_route=best.route if best else None,
                              runner_up_speedup=best.comparison.speedup
                              if best and best.comparison else None)
    if confirms:
        best = max(confirms, key=lambda t: t.comparison.speedup if t.comparison else 0.0)
        c = best.comparison
        assert c is not None
        reason = (f"no significant gain: {len(confirms)} route(s) screened fastest went to the "
                  f"confirmation, and none was confirmed; the best, {best.route}, measured "
                  f"{c.text()} over "
                  f"{c.processes} measuring processes ({_why_not(best, settings)})"
                  + (f"; {stopped}" if stopped else "") + "; the baseline ships")
    else:
        best = best_admissible(trials)
        if best is None:
            reason = "no significant gain: no other route was admissible; the baseline ships"
        else:
            c = best.comparison
            assert c is not None
            floor = (settings.confirm_top > 0
                     and c.speedup_ci_high < settings.confirm_floor)
            reason = (f"no significant gain: the best admissible route, {best.route}, screened "
                      f"{c.text()} "
                      + f"({_why_not(best, settings)})"
                      + (f"; no route screened above the confirmation floor "
                         f"{settings.confirm_floor:.2f}x, so none was confirmed" if floor else "")
                      + "; the baseline ships")
    return DecisionRecord(**common, **no_gain, reason=reason,
                          runner_up_route=best.route if best else None,
                          runner_up_speedup=best.comparison.speedup if best and best.comparison else None)
