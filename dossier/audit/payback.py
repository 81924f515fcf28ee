"""Search cost against benefit: after how many inferences (and days) the tuning pays back.

The tuning cost is the search's wall time (every ``tune`` session added up). The benefit of one
inference is the time the shipped route saves against the baseline::

    saved_ms = baseline_median_ms - baseline_median_ms / speedup

per inference, as every latency dossier prints (:mod:`dossier.measure.latency`): a timing
sample runs ``inferences_per_sample`` inferences (``[timing] inputs``: one per input shape, or a
pass over every validation pair), so the baseline's median per inference is the sample's median
divided by them, and the inference counts below are inferences,
the unit of ``[deployment] inferences_per_day``. The answer is given three times, from the
speedup's confidence interval: the best case (its upper end), the measured speedup, and the worst case (its lower end). A case
whose speedup is at most 1 saves nothing and never pays back. Savings accrue on every host
(``hosts`` x ``inferences_per_day`` a day); the search is paid once.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PaybackCase(_Model):
    """One reading of the speedup (best, measured or worst) and what it pays back."""

    case: Literal["best", "measured", "worst"]
    """Which end of the speedup's interval: best = upper end, worst = lower end."""
    speedup: float
    """The speedup this case assumes (baseline median / shipped median)."""
    saved_ms: float
    """Time saved per inference (a timing sample's saving over its inferences), in ms;
    <= 0 saves nothing."""
    inferences: float | None
    """Inferences (over all hosts) after which the tuning time is paid back; None: never."""
    days: float | None
    """Days until then at the expected volume; None: never, or no volume given."""
    within_horizon: bool
    """Paid back within the horizon (False when never, or when no volume is given)."""
    net_saving_s: float | None
    """Time saved over the whole horizon on every host, minus the tuning time (s); None
    without a volume."""


class Payback(_Model):
    """When the search pays for itself."""

    source: Literal["spec", "flags", "none"]
    """Where the expected volume came from: the spec's [deployment], command-line flags, or
    nowhere (the inference counts still hold; days cannot be given)."""
    inferences_per_day: float
    """Expected inferences per day on one host (0: unknown)."""
    horizon_days: float
    """How long the release is expected to serve."""
    hosts: int
    """Hosts it serves on; savings accrue on each."""
    tuning_s: float
    """The cost: wall time of the search, every session added up."""
    baseline_median_ms: float | None
    """The baseline's median per inference in the measurement the speedup comes from (None: no
    gain)."""
    unit: str
    """What one inference means here."""
    cases: list[PaybackCase]
    """Best, measured and worst case (empty when nothing ships but the baseline)."""
    verdict: str
    """The answer in one or two sentences."""


def saved_ms(baseline_median_ms: float, speedup: float) -> float:
    """Time saved per inference at ``speedup``: baseline median minus candidate median."""
    return baseline_median_ms - baseline_median_ms / speedup


def payback(*, tuning_s: float, gain: bool, baseline_median_ms: float | None,
            speedup: float | None, speedup_ci_low: float | None,
            speedup_ci_high: float | None, inferences_per_day: float = 0.0,
            horizon_days: float = 90.0, hosts: int = 1,
            source: Literal["spec", "flags", "none"] = "none",
            inferences_per_sample: int = 1) -> Payback:
    """The payback of a search that cost ``tuning_s`` seconds (see the module docstring);
    ``baseline_median_ms``: the baseline's median timing sample, ``inferences_per_sample``
    inferences."""
    pairs = max(inferences_per_sample, 1)
    unit = (f"per inference: a timing sample ({pairs} inference(s)) divided by {pairs}, as "
            "every latency dossier prints")
    per_inference = None if baseline_median_ms is None else baseline_median_ms / pairs
    def _answer(baseline: float | None, cases: list[PaybackCase], verdict: str) -> Payback:
        return Payback(source=source, inferences_per_day=inferences_per_day,
                       horizon_days=horizon_days, hosts=hosts, tuning_s=tuning_s,
                       baseline_median_ms=baseline, unit=unit, cases=cases, verdict=verdict)

    if not gain or per_inference is None or speedup is None:
        return _answer(None, [], f"never: there is no significant gain, the baseline ships, so "
                      f"nothing is saved to pay back the {tuning_s:.1f} s of tuning")
    per_day = inferences_per_day * hosts
    cases = []
    readings: tuple[tuple[Literal["best", "measured", "worst"], float | None], ...] = (
        ("best", speedup_ci_high), ("measured", speedup), ("worst", speedup_ci_low))
    for name, s in readings:
        if s is None or not math.isfinite(s):
            continue
        gain_ms = saved_ms(per_inference, s)
        n = tuning_s * 1000.0 / gain_ms if gain_ms > 0 else None
        days = n / per_day if n is not None and per_day > 0 else None
        net = (gain_ms * per_day * horizon_days / 1000.0 - tuning_s) if per_day > 0 else None
        cases.append(PaybackCase(case=name, speedup=s, saved_ms=gain_ms, inferences=n, days=days,
                                 within_horizon=days is not None
                                 and days <= horizon_days * (1 + 1e-9),  # not rounding
                                 net_saving_s=net))
    return _answer(per_inference, cases, _verdict(cases, tuning_s, per_day, horizon_days))


def _verdict(cases: list[PaybackCase], tuning_s: float, per_day: float,
             horizon_days: float) -> str:
    by = {c.case: c for c in cases}
    best, measured, worst = by.get("best"), by.get("measured"), by.get("worst")

    def when(c: PaybackCase) -> str:
        if c.inferences is None:
            return "never"
        text = f"after {c.inferences:,.0f} inferences"
        return text + (f" ({c.days:,.1f} days)" if c.days is not None else "")

    parts = [f"the {tuning_s:.1f} s of tuning"]
    if measured is not None:
        parts.append(f"pays back {when(measured)} at the measured speedup "
                     f"({measured.speedup:.3f}x, {measured.saved_ms:.4f} ms saved per inference)")
    if best is not None:
        parts.append(f"{when(best)} in the best case ({best.speedup:.3f}x)")
    if worst is not None:
        if worst.inferences is None:
            parts.append(f"and never in the worst case: the interval's lower end "
                         f"({worst.speedup:.3f}x) is not above 1, so the gain may be nothing")
        else:
            parts.append(f"{when(worst)} in the worst case ({worst.speedup:.3f}x)")
    text = parts[0] + " " + ", ".join(parts[1:])
    if per_day <= 0:
        return text + ("; no expected volume was given, so no days (set [deployment] "
                       "inferences_per_day in the spec, or pass --per-day)")
    if best is not None and not best.within_horizon:
        return text + (f"; it does not pay back within the {horizon_days:g}-day horizon, even "
                       "in the best case")
    if measured is not None and not measured.within_horizon:
        return text + (f"; at the measured speedup it does not pay back within the "
                       f"{horizon_days:g}-day horizon (only in the best case)")
    if worst is not None and not worst.within_horizon:
        return text + (f"; within the {horizon_days:g}-day horizon at the measured speedup, "
                       "but not in the worst case")
    return text + f"; within the {horizon_days:g}-day horizon in every case"
