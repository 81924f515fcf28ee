"""The decision rule: which route ships, and why.

1. Candidates are admissible search trials whose interleaved comparison with the baseline was
   significant (Mann-Whitney U, p < alpha) with a speedup of at least 1 + min_effect and a
   speedup interval above 1.0 (so the verdict never contradicts the interval printed with it).
2. The best ``confirm_top`` candidates (by speedup) are re-timed together with the baseline in a
   fresh process; each must again be significant at alpha / k (Bonferroni) and reach the minimum
   effect. This removes the winner's curse of picking the maximum of many noisy estimates.
3. The confirmed candidate with the largest confirmed speedup ships; if none is confirmed, the
   baseline ships and the result is "no significant gain", with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from dossier.cache import DecisionRecord
from dossier.timing import TimingSettings
from dossier.trial import TrialRecord
from dossier.verdict import speed_verdict


def rule_text(settings: TimingSettings) -> str:
    """The decision rule in words, with the numbers in force."""
    return (f"admissible routes faster than the baseline by a two-sided Mann-Whitney U test "
            f"(alpha={settings.alpha:g}), by at least {settings.min_effect:.0%} and with a speedup "
            f"interval above 1.0 were re-timed "
            f"(top {settings.confirm_top}) against the baseline in a fresh process at "
            f"alpha/k (Bonferroni); the largest confirmed speedup ships, else the baseline")


def candidates(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Search trials that screened significantly faster than the baseline, best first."""
    found = [t for t in trials if t.role == "search" and t.faster and t.comparison is not None]
    return sorted(found, key=lambda t: (-t.comparison.speedup, -t.comparison.speedup_ci_low))  # type: ignore[union-attr]


def best_admissible(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The admissible search trial with the largest screened speedup (significant or not)."""
    ok = [t for t in trials if t.role == "search" and t.admissible and t.comparison is not None]
    return max(ok, key=lambda t: t.comparison.speedup) if ok else None  # type: ignore[union-attr]


def _why_not(t: TrialRecord, settings: TimingSettings, alpha: float) -> str:
    assert t.comparison is not None
    v = speed_verdict(t.comparison, alpha=alpha, min_effect=settings.min_effect)
    return "slower than the baseline" if v.label == "slower" else ", ".join(v.reasons) or v.label


def decide(trials: Sequence[TrialRecord], settings: TimingSettings) -> DecisionRecord:
    """Apply the rule to a finished search (screening and confirmation trials)."""
    baseline = next(t for t in trials if t.role == "baseline")
    # the last measurement of each route: a round cut short by a kill was re-timed whole
    confirms = list({t.route: t for t in trials
                     if t.role == "confirm" and t.comparison is not None}.values())
    screened = candidates(trials)
    k = max(len(confirms), 1)
    alpha = settings.alpha / k
    confirmed = sorted(
        (t for t in confirms if t.comparison.p_value < alpha  # type: ignore[union-attr]
         and t.comparison.speedup >= 1 + settings.min_effect
         and t.comparison.speedup_ci_low > 1.0),  # type: ignore[union-attr]
        key=lambda t: -t.comparison.speedup)  # type: ignore[union-attr]
    if settings.confirm_top == 0:
        confirms, confirmed, alpha = [], screened, settings.alpha
    common = dict(rule=rule_text(settings), baseline_route=baseline.route,
                  candidates=[t.route for t in confirms])
    if confirmed:
        win = confirmed[0]
        c = win.comparison
        assert c is not None
        runner = confirmed[1] if len(confirmed) > 1 else None
        where = "confirmed in a fresh process" if confirms else "screening measurement"
        index = next(t.index for t in trials if t.route == win.route and t.role == "search")
        return DecisionRecord(
            **common, shipped_route=win.route, shipped_index=index, gain=True, speedup=c.speedup,
            speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
            p_value=c.p_value,
            reason=(f"{win.route} was {c.speedup:.3f}x the baseline's speed "
                    f"[{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                    f"(p={c.p_value:.2g} < {alpha:.2g}, n={c.baseline.n}+{win.timing.n if win.timing else 0}), "
                    f"{where}"),
            runner_up_route=runner.route if runner else None,
            runner_up_speedup=runner.comparison.speedup if runner and runner.comparison else None)
    if confirms:
        best = max(confirms, key=lambda t: t.comparison.speedup)  # type: ignore[union-attr]
        c = best.comparison
        assert c is not None
        reason = (f"no significant gain: {len(screened)} route(s) screened faster, but none was "
                  f"confirmed in a fresh process; the best, {best.route}, measured "
                  f"{c.speedup:.3f}x [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                  f"({_why_not(best, settings, alpha)}); the baseline ships")
    else:
        best = best_admissible(trials)
        if best is None:
            reason = "no significant gain: no other route was admissible; the baseline ships"
        else:
            c = best.comparison
            assert c is not None
            reason = (f"no significant gain: the best admissible route, {best.route}, measured "
                      f"{c.speedup:.3f}x [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                      f"({_why_not(best, settings, settings.alpha)}); the baseline ships")
    return DecisionRecord(**common, shipped_route=baseline.route, shipped_index=baseline.index,
                          gain=False, speedup=None, speedup_ci_low=None, speedup_ci_high=None,
                          p_value=None, reason=reason,
                          runner_up_route=best.route if best else None,
                          runner_up_speedup=best.comparison.speedup if best and best.comparison else None)
