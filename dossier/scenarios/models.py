"""The scenario's records: what a LoadGen run is asked (:class:`RunSettings`), one run of a
search (:class:`Probe`), a configuration's metric (:class:`ScenarioResult`) and the decision
(:class:`ScenarioDecision`), as the run folder and the bundle keep them (``scenario/decision.json``).
A leaf: it imports no engine, no bundle, no backend."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dossier.scenario import ScenarioSection
from dossier.scenarios.logs import LoadGenRun

AA = "baseline (A/A)"
"""The name of the baseline's second measurement in each repetition."""


class RunSettings(BaseModel):
    """What one LoadGen run is asked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["server", "offline", "single-stream"]
    """LoadGen's Server, Offline or SingleStream scenario."""
    qps: float = Field(gt=0, le=1e9, allow_inf_nan=False)
    """server: the target rate; offline: the expected rate (how many queries LoadGen
    prepares); single-stream: unused but positive."""
    bound_ns: int = Field(0, ge=0, le=10**15)
    """server: the latency bound."""
    percentile: float = Field(99.0, gt=0, lt=100, allow_inf_nan=False)
    """server: the bound's percentile, in percent."""
    duration_s: float = Field(gt=0, le=86400, allow_inf_nan=False)
    """Minimum duration."""
    min_queries: int = Field(1, ge=1, le=10**9)
    """Minimum number of queries."""
    max_duration_s: float = Field(gt=0, le=86400, allow_inf_nan=False)
    """LoadGen stops issuing queries after this long."""
    seed: int = Field(0, ge=0, le=2**63 - 1)
    """LoadGen's schedule seed (the arrival times)."""


class Probe(BaseModel):
    """One LoadGen run of a search: the rate asked, what LoadGen reported, dossier's reading."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    qps: float = Field(gt=0, le=1e9, allow_inf_nan=False)
    """The rate asked for (server) or expected (offline)."""
    met: bool
    """dossier's reading: the bound held at this rate (server), or the run gave a result
    (offline)."""
    outcome: Literal["ok", "failed"] = "ok"
    """failed: the run gave no result (overran its time limit, its process died)."""
    reason: str = Field("", max_length=500)
    """Why it failed."""
    run: LoadGenRun | None = None
    """LoadGen's own report of the run (None when it failed)."""
    single_ms: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    """The single-inference time the run's process measured before LoadGen started."""


class ScenarioResult(BaseModel):
    """A configuration under a scenario: the metric and the probes it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["server", "offline"]
    """The scenario."""
    metric_qps: float = Field(ge=0, le=1e12, allow_inf_nan=False)
    """server: the highest rate met (0: none was); offline: samples completed per second."""
    lowest_missed_qps: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    """server: the lowest rate missed (None: none was; the search ran out of steps first)."""
    target_met: bool | None = None
    """server with a target rate: whether the highest rate met reaches it."""
    probes: list[Probe]
    """Every LoadGen run, in order."""

    def at_metric(self) -> Probe | None:
        """The probe the metric comes from."""
        met = [p for p in self.probes if p.met and p.run is not None]
        return max(met, key=lambda p: p.qps) if met else None


class Reading(BaseModel):
    """A configuration's metric in each repetition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The configuration's name."""
    route: str = ""
    """Its route (sessions and threads included)."""
    metric_qps: list[float]
    """The metric per repetition (server: highest rate meeting the bound; 0: none met)."""
    results: list[ScenarioResult] = Field(default_factory=list, repr=False)
    """The search of each repetition, its LoadGen runs included."""


class Verdict(BaseModel):
    """A candidate against the baseline (or the A/A against the baseline)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The candidate."""
    ratio: float | None
    """Geometric mean of its metric over the A/A copy's, per repetition (None: not enough
    repetitions where both met a rate)."""
    low: float | None
    """Lower end of the ratio's interval."""
    high: float | None
    """Upper end."""
    p_value: float | None
    """One-sided (candidate) or two-sided (the A/A) p-value."""
    level: float | None = None
    """The level it was judged at (Holm's step-down); None for the A/A."""
    confirmed: bool = False
    """Faster than the minimum effect at its level."""
    reason: str = ""
    """Why it was not judged, when it was not."""


class ScenarioDecision(BaseModel):
    """What the scenario decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: ScenarioSection
    """The scenario."""
    baseline: str
    """The configuration every candidate is compared with."""
    shipped: str
    """The configuration that ships."""
    repetitions: int
    """Repetitions measured."""
    readings: list[Reading]
    """Every configuration's metric per repetition (the A/A copy included)."""
    verdicts: list[Verdict]
    """Each candidate, then the A/A."""
    min_effect: float
    """The minimum effect a candidate must clear."""
    alpha: float
    """The family's false-positive rate (split by Holm's step-down)."""

    def reading(self, name: str) -> Reading:
        """The reading of configuration ``name``."""
        return next(r for r in self.readings if r.name == name)
