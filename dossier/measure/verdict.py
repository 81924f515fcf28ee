"""Speed verdicts in words, from the figures printed beside them.

Every place that calls a route faster or slower than the baseline (trial lines, the decision's
reason, ``explain`` and its HTML page, the knob effects) asks :func:`speed_verdict`, so a
verdict never contradicts the speedup and interval printed next to it: a route is called
faster or slower only when its interval excludes 1.0, the rank test is significant and the
minimum effect is reached; otherwise "no significant effect", with the reasons. The level is
the one the reading records (``Comparison.level``), so no caller re-derives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dossier.measure.reading import Comparison
from dossier.measure.timing import PROCESS_TEST

Label = Literal["faster", "slower", "no significant effect"]


@dataclass(frozen=True)
class SpeedVerdict:
    """What a comparison shows, in a word and in a clause."""

    label: Label
    reasons: tuple[str, ...]
    """Why not faster or slower (empty for faster and slower)."""
    figures: str
    """``0.759x [0.657, 1.157], p=3.2e-05``: the figures the verdict follows from."""

    @property
    def text(self) -> str:
        """``slower (0.759x [0.700, 0.800], p=1e-05)`` or ``no significant effect: its
        interval [0.657, 1.157] includes 1.0``."""
        if self.reasons:
            return f"{self.label}: {', '.join(self.reasons)}"
        return f"{self.label} ({self.figures})"


def judge(c: Comparison, *, min_effect: float, alpha: float = 0.05) -> SpeedVerdict:
    """The verdict on a reading, at the level it records (``alpha`` for older records that do
    not): the one judge of every place that calls a route faster, slower or neither.

    A confirmation candidate's test (``t-test-processes`` against the A/A) is one-sided
    against the minimum effect, so its p already says whether the gain reaches it: faster when
    p is below the level and the interval excludes 1.0. Every other reading (screening rounds,
    an A/A) is two-sided against 1.0: faster or slower when p is below the level, the interval
    excludes 1.0 on that side and the speedup is at least the minimum effect away from 1.0."""
    level = c.judged_at(alpha)
    figures = f"{c.text()}, p={c.p_value:.2g}"
    includes_one = c.speedup_ci_low <= 1.0 <= c.speedup_ci_high
    significant = c.p_value < level
    if c.test == PROCESS_TEST and c.against == "aa":
        if significant and c.speedup_ci_low > 1.0:
            return SpeedVerdict("faster", (), figures)
        reasons = []
        if c.speedup_ci_high < 1 + min_effect:
            reasons.append(f"its interval [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                           f"lies below the minimum effect of {min_effect:.0%}")
        elif includes_one:
            reasons.append(f"its interval [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                           "includes 1.0")
        if not significant:
            reasons.append(f"p={c.p_value:.2g} (against a gain of {min_effect:.0%}) is not below "
                           f"{level:.2g}")
        return SpeedVerdict("no significant effect", tuple(reasons) or ("not confirmed",), figures)
    if not includes_one and significant:
        if c.speedup >= 1 + min_effect and c.speedup_ci_low > 1.0:
            return SpeedVerdict("faster", (), figures)
        if c.speedup <= 1 / (1 + min_effect) and c.speedup_ci_high < 1.0:
            return SpeedVerdict("slower", (), figures)
    reasons = []
    if includes_one:
        reasons.append(f"its interval [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] "
                       "includes 1.0")
    if not significant:
        reasons.append(f"p={c.p_value:.2g} is not below {level:.2g}")
    if 1 <= c.speedup < 1 + min_effect:
        reasons.append(f"{c.speedup:.3f}x is below the minimum effect of {min_effect:.0%}")
    elif 1 / (1 + min_effect) < c.speedup < 1:
        reasons.append(f"{c.speedup:.3f}x is a slowdown smaller than the minimum effect of "
                       f"{min_effect:.0%}")
    if not reasons:  # significant and large, but the interval lies on the other side of 1.0
        reasons.append(f"its interval [{c.speedup_ci_low:.3f}, {c.speedup_ci_high:.3f}] does "
                       f"not support the median's {c.speedup:.3f}x")
    return SpeedVerdict("no significant effect", tuple(reasons), figures)


def speed_verdict(c: Comparison, *, alpha: float, min_effect: float) -> SpeedVerdict:
    """:func:`judge` at ``alpha`` for a reading that records no level of its own."""
    return judge(c, min_effect=min_effect, alpha=alpha)
