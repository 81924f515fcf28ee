"""The verify report: what each step of a verification found, as one document (the CLI's
``--json``, the library's :class:`VerifyReport`)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from dossier.host.policy import (
    Finding,
    Verdict,
)
from dossier.measure.conditions import Summary as ConditionsSummary
from dossier.measure.latency import RouteLatency
from dossier.trial import Comparison, TimingSummary

if TYPE_CHECKING:

    pass


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Recheck(_Model):
    """The bundle's validation set run through the shipped engine on this host."""

    passed: bool
    """Every loss of every pair below the threshold, no NaN/Inf."""
    metric: str
    """Loss metric."""
    threshold: float
    """Threshold applied (the bundle's, or a stricter one given to verify)."""
    failure: str | None
    """Which pair, which output, which loss, when it failed."""
    losses: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    """Per pair, per output."""
    worst_loss: float | None = None
    """Largest loss."""
    recorded_worst_loss: float | None = None
    """The shipped route's largest loss on the tuning host."""
    data_set: Literal["validation", "holdout"] = "validation"
    """The set run: the validation set, or the hold-out set the search never saw (a bundle
    that carries one is re-checked on both)."""


class Rebench(_Model):
    """The shipped engine and the baseline engine re-measured here with the confirmation's
    procedure (measuring processes of their own, each with the baseline, a second load of it
    and the shipped engine, production load options), judged by the speedup."""

    shipped: TimingSummary
    """The shipped engine's latency here."""
    baseline: TimingSummary
    """The baseline engine's latency here."""
    comparison: Comparison | None
    """Shipped against baseline here (None when the baseline itself ships)."""
    recorded_shipped: TimingSummary | None
    """The shipped engine's latency on the tuning host."""
    predicted_low: float | None = None
    """Lower end of the recorded prediction interval for a new process's reading (None in
    older bundles, which recorded none)."""
    predicted_high: float | None = None
    """Its upper end."""
    inside: bool | None = None
    """The speedup read here lies inside the recorded prediction interval (None without one,
    or when the baseline ships)."""
    regression: bool
    """The speedup here lies below the recorded prediction interval (older bundles: below the
    recorded interval), or its interval includes 1.0."""
    latency: RouteLatency | None = None
    """The shipped engine's latency per inference here (median, p90, p99, throughput)."""
    recorded_latency: RouteLatency | None = None
    """The same on the tuning host, as ``inspect`` shows it (the confirmation's reading)."""
    baseline_latency: RouteLatency | None = None
    """The baseline engine's latency per inference here."""
    recorded_baseline_latency: RouteLatency | None = None
    """The same on the tuning host (the confirmation's reading of the baseline)."""
    moved: str | None = None
    """Which engine's own latency moved against its record, when the speedup did: a speedup is
    a ratio, and a host whose baseline runs at another speed than it did when tuned (a CPU
    engine's thread placement, another regime) moves it with no change in the shipped engine
    (:func:`dossier.verify.host.moved_engine`). None when neither moved by more than 10%."""
    conditions: ConditionsSummary | None = None
    """What this host was doing during the re-measurement."""
    recorded_conditions: ConditionsSummary | None = None
    """What the tuning host was doing while the decision was measured (None: not recorded)."""
    overstated: bool = False
    """The interval read here lies wholly below the recorded interval: the recorded figure is
    not reproduced (a regression: not VALID)."""
    unverifiable: bool = False
    """The record's prediction interval for a new process reaches down to half its speedup,
    so an overstatement of 2x could not be flagged: a finding (not VALID), with how to
    re-establish it."""
    target: str | None = None
    """The conditions the bundle's spec declares, which the re-measurement was taken under
    (its cores, its priority, its co-tenant load)."""
    reason: str
    """What was compared and what it showed."""


class StepName(str, enum.Enum):
    """The steps of a verification, in the order they run."""

    FETCH = "fetch"
    """A registry reference pulled into the cache (verified on arrival)."""
    SIGNATURE = "signature"
    """The DSSE envelope: signed by a trusted key, every file matching the signed statement."""
    INTEGRITY = "integrity"
    """Every file against the manifest's size and xxh3-128."""
    ENVIRONMENT = "environment"
    """This host's fingerprint against the tuning host's, a verdict per field."""
    RECHECK = "recheck"
    """The validation set through the shipped engine here."""
    REBENCH = "rebench"
    """The shipped and the baseline engines re-timed here."""


class StepOutcome(str, enum.Enum):
    """How a step ended."""

    PASSED = "passed"
    """Checked, and fit (VALID for a judged step)."""
    WARNED = "warned"
    """Checked: usable, but the tuning may no longer be the fastest (SUBOPTIMAL)."""
    FAILED = "failed"
    """Checked, and refused (INVALID, or an error that stops the verification)."""
    SKIPPED = "skipped"
    """Not run: not asked for, nothing to check, or an earlier step failed."""


class Step(_Model):
    """One step of a verification and what it found."""

    name: StepName
    """Which step."""
    outcome: StepOutcome
    """How it ended."""
    detail: str
    """One line: what was checked and what it showed (or why it was skipped)."""
    problems: list[str] = Field(default_factory=list)
    """Each problem found (e.g. every missing, extra or altered file), when it failed."""
    verdict: Verdict | None = None
    """For the environment, re-check and re-timing steps: their verdict."""


class VerifyReport(_Model):
    """Everything ``dossier verify`` found."""

    bundle: str
    """Bundle path (for a registry reference: its copy in the cache)."""
    dossier_id: str | None
    """Its id; None when the bundle could not be read."""
    release: str | None
    """NAME-VERSION; None when the bundle could not be read."""
    backend: str | None
    """Compiler backend; None when the bundle could not be read."""
    integrity: str | None
    """Integrity check result; None when it did not run."""
    signature: str | None = None
    """Signature check result; None when the bundle is unsigned and no signature was required."""
    findings: list[Finding] = Field(default_factory=list)
    """One per compared fingerprint field, worst first (empty with ``integrity_only``)."""
    recheck: Recheck | None = None
    """Accuracy re-check, when asked for."""
    recheck_holdout: Recheck | None = None
    """With ``--recheck``, for a bundle that carries a hold-out set: the re-check on it."""
    rebench: Rebench | None = None
    """Re-timing, when asked for."""
    verdict: Verdict | None
    """The worst of every finding, the re-check and the re-timing; None when the environment
    was not judged (``integrity_only``, or a refusal before it)."""
    reasons: list[str] = Field(default_factory=list)
    """Why the verdict is what it is, worst first."""
    source: str = ""
    """What was asked for: a folder, an archive or a registry reference."""
    reference: str | None = None
    """For a registry reference: REGISTRY/REPO@sha256:... that was verified."""
    steps: list[Step] = Field(default_factory=list)
    """Every step in the order it ran, with its outcome."""
    exit_code: int = 0
    """The ``dossier verify`` exit code of this outcome (0 VALID or integrity only, 10, 11, or
    the refusal's code: 6, 13, 20...)."""
    error: str | None = None
    """The refusal, one line, when a step refused the bundle."""
