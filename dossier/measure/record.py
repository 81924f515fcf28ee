"""The record a trial leaves: how it ended (:class:`Outcome`) and its line in the tuning
cache (:class:`TrialRecord`), built of the readings of :mod:`dossier.measure.reading`.
:mod:`dossier.trial` is the name the rest of the library imports them by."""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dossier.load_config import LoadConfig
from dossier.measure.conditions import Conditions
from dossier.measure.reading import Comparison, Reading, TimingSummary


class Outcome(str, enum.Enum):
    """How a trial ended."""

    OK = "ok"
    """Built, ran, passed the accuracy check, timed."""
    REJECTED = "rejected"
    """Ran, but a loss reached the threshold or an output held NaN/Inf."""
    BUILD_FAILED = "build_failed"
    """The compiler refused or failed to build the route."""
    CRASHED = "crashed"
    """The trial's process died (a signal, or it exited without a result)."""
    TIMEOUT = "timeout"
    """The trial ran past its wall-clock limit and was killed."""
    RUNTIME_ERROR = "runtime_error"
    """The engine built but failed to load or to run."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Shipped(_Model):
    """What a search's decision ships: the fields its record in the tuning cache
    (:class:`dossier.cache.DecisionRecord`) and a bundle's summary
    (:class:`dossier.bundle.manifest.Summary`) share, declared once."""

    baseline_route: str
    """The baseline route."""
    shipped_route: str
    """The route whose engine ships (the baseline when there is no significant gain)."""
    shipped_index: int
    """Trial index of the shipped engine."""
    gain: bool
    """True when a route other than the baseline ships: it beat the baseline significantly and
    by the minimum effect; or, in a search dossier did not run (a trtexec import, result "not
    statistically checked"), the other tool's rule chose it and nothing was shown."""


class TrialRecord(_Model):
    """One line of the tuning cache per finished trial."""

    kind: Literal["trial"] = "trial"
    """Record type tag."""
    index: int
    """Position of the trial in the search (0 is the baseline)."""
    route: str
    """Canonical route text."""
    role: Literal["baseline", "search", "confirm"] = "search"
    """Why the trial ran."""
    outcome: Outcome
    """How it ended."""
    reason: str | None = None
    """Why it did not end ``ok``: the error, the signal, or the loss that failed."""
    losses: dict[str, dict[str, float | None]] | None = None
    """Per validation pair, per output tensor: the loss (None where the output held NaN/Inf)."""
    worst_loss: float | None = None
    """The largest loss over all pairs and outputs."""
    timing: TimingSummary | None = None
    """The candidate's latency."""
    comparison: Comparison | None = None
    """The candidate against the baseline timed alongside it (the A/A check for the baseline)."""
    samples_ms: list[float] | None = None
    """The candidate's raw timed samples, in the order taken."""
    baseline_samples_ms: list[float] | None = None
    """The baseline's raw samples taken interleaved with the candidate's."""
    sample_rounds: list[int] | None = None
    """Round index of each of ``samples_ms``."""
    baseline_sample_rounds: list[int] | None = None
    """Round index of each of ``baseline_samples_ms``."""
    raced: str | None = Field(None, max_length=400)
    """Why the screening timed this trial fewer rounds than ``rounds`` (racing, ``race_rounds``):
    its interval lay wholly below the bar, or the accuracy filter had rejected it; None: it
    timed every round."""
    build_s: float | None = None
    """Compile time of the engine (kept apart from inference latency)."""
    trial_s: float
    """Wall time of the whole trial, child process start to result."""
    phases_s: dict[str, float] = Field(default_factory=dict)
    """Wall time of each phase of the trial: startup (process start and imports), build, load,
    validate, time; the rest of trial_s is orchestration (request, result, record)."""
    engine: str | None = None
    """Engine file, relative to the run folder, kept for admissible routes."""
    engine_digest: str | None = None
    """xxh3-128 of the engine file."""
    started_at: str
    """UTC start time, ISO 8601."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Backend facts about the built engine (e.g. plan header fields)."""
    load: LoadConfig | None = None
    """How production should load the kept engine: the backend's production load configuration
    for this route, taken from the backend the search ran (its builder options included) when
    the trial was recorded. None when no engine was kept, and in records written before it was
    recorded (bundling such a run asks the backend installed then)."""
    engine_flags: dict[str, bool] | None = None
    """Boolean facts about the kept engine that the verify policy uses (e.g. TensorRT's
    ``version_compatible``), recorded like ``load``; None when no engine was kept, and in
    records written before they were recorded."""
    conditions: list[Conditions] | None = None
    """What the host was doing while the trial ran (:mod:`dossier.measure.conditions`): one entry for
    a search trial, one per measuring process for a confirmation record; None in records
    written before they were recorded."""

    @property
    def admissible(self) -> bool:
        """Built, ran and passed the accuracy check."""
        return self.outcome is Outcome.OK

    @property
    def faster(self) -> bool:
        """Admissible and significantly faster than the baseline."""
        return self.admissible and self.comparison is not None and self.comparison.faster

    def reading(self, min_effect: float = 0.0) -> Reading | None:
        """Its comparison as a :class:`Reading` judged like a candidate, at the level it
        records (:meth:`Comparison.reading`; None when untimed)."""
        return self.comparison.reading(self.index, min_effect) if self.comparison else None
