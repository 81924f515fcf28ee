"""Why this route: the facts behind a bundle's decision, as one model (:class:`Explanation`).

Everything comes from what the search recorded (the tuning cache, the bundle's tables, the
tuning host's fingerprint and the manifest); nothing is re-measured::

    from dossier.audit import explain
    from dossier.bundle import open_bundle

    with open_bundle(Path("releases/convnet-1.dossier")) as bundle:
        facts = explain(bundle, inferences_per_day=2e6)
    print(facts.decision.reason)
    print(facts.model_dump_json(indent=2))   # what ``dossier explain --json`` prints

Knob effects are given two ways. **One knob at a time**: a trial whose route differs from the
baseline in exactly one knob was timed interleaved with the baseline, so its comparison is that
knob value's effect (speedup with its bootstrap interval). **A model over all admissible
trials**, when there are enough of them: ordinary least squares of log(speedup against the
baseline timed alongside) on one-hot knob values (the baseline's value is the reference), with
analytic standard errors and t-distribution intervals; the effect of a value is exp(coefficient),
a speed factor against the baseline's value of that knob with the other knobs held fixed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from dossier.audit.budget import SearchBudget, search_budget
from dossier.audit.payback import Payback, payback
from dossier.audit.trade import Trade, informative, trade
from dossier.backends.tensorrt.trtexec import SOURCE as TRTEXEC
from dossier.cache import CacheHeader, DecisionRecord, HoldoutRecord, SessionRecord
from dossier.fingerprint import Fingerprint
from dossier.knobs import KnobDatabase
from dossier.measure.conditions import Summary as ConditionsSummary
from dossier.measure.latency import RouteLatency, of_record, of_route, per_inference
from dossier.measure.reading import PROCESS_TEST, within_effect
from dossier.measure.timing import TimingSettings
from dossier.routes import Route
from dossier.run_folder import RUNS
from dossier.scenarios.curve import ScenarioFacts, facts
from dossier.trial import Comparison, Outcome, Reading, TrialRecord
from dossier.validation import worst_by_output

if TYPE_CHECKING:
    from dossier.bundle import Bundle, Manifest

EXPLANATION_FORMAT: Literal["dossier-explanation"] = "dossier-explanation"
"""Value of an explanation's ``format`` field."""
EXPLANATION_VERSION = 1
"""Version of the :class:`Explanation` model (raised when a field changes meaning or goes)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Latency(_Model):
    """One engine's latency in one measurement, per timed sample (``per_inference`` divides it)."""

    median_ms: float
    """Median of the samples (one sample = ``inferences_per_sample`` inferences: one per input
    shape, or one per validation pair)."""
    ci_low_ms: float
    """Lower end of the median's confidence interval (order statistics)."""
    ci_high_ms: float
    """Upper end of the median's confidence interval."""
    n: int
    """Number of samples."""
    per_inference: RouteLatency | None = None
    """The same samples per inference: median, p90, p99, throughput."""


class HeadToHead(_Model):
    """The shipped route (or, without a gain, the best candidate) against the baseline."""

    route: str
    """The candidate route."""
    trial_index: int
    """Index of the candidate's search trial."""
    measured_in: int
    """Index of the trial record the numbers come from (a confirmation record, or the search
    trial itself)."""
    source: Literal["confirmation", "screening"]
    """confirmation: the re-measurement that decides (measuring processes of their own, each
    with the baseline, its A/A load and the candidates); screening: the search trial."""
    shipped: bool
    """True when this route ships (a significant gain); False: the best candidate, which did not."""
    candidate: Latency
    """The candidate's latency."""
    baseline: Latency
    """The baseline's latency, timed interleaved with the candidate."""
    speedup: float
    """Baseline median / candidate median (> 1: the candidate is faster)."""
    speedup_ci_low: float
    """Lower end of the speedup's interval."""
    speedup_ci_high: float
    """Upper end of the speedup's interval."""
    confidence: float
    """Confidence level of the intervals."""
    test: str
    """The significance test (see :func:`test_name`)."""
    p_value: float
    """Its p-value."""
    alpha: float
    """The level it was judged at, as the reading recorded it (the confirmation: alpha /
    (m x looks), Bonferroni over the looks of its sequential design and Holm's step-down over
    the m candidates not confirmed yet)."""
    rounds: int | None = None
    """Rounds the speedup, interval and test were computed over (None in older records)."""
    round_ratio_low: float | None = None
    """The smallest of the per-round ratios (baseline block median / candidate block median)
    the speedup summarises (None in older records). A wide spread between the two ends says
    the gain depends on the state of the host (e.g. a launch-bound baseline)."""
    round_ratio_high: float | None = None
    """The largest of the per-round ratios."""
    generation_speedups: list[float] | None = None
    """Older records: an independent measurement in process generations, each generation's own
    speedup."""
    processes: int | None = None
    """The confirmation: measuring processes the figures are over (the unit of replication)."""
    process_speedups: list[float] | None = None
    """Each measuring process's reading (against the A/A load in that process)."""
    prediction_low: float | None = None
    """Lower end of the prediction interval for one new process (what ``verify --rebench``
    is expected to read)."""
    prediction_high: float | None = None
    """Its upper end."""
    against: Literal["baseline", "aa"] = "baseline"
    """What the speedup is over: the baseline, or the A/A's second load of it in the same
    processes (the confirmation tests the candidate's difference from the A/A)."""
    significant: bool
    """p_value < alpha."""
    min_effect: float
    """The minimum effect a gain must reach (0.02 = 2%)."""
    reaches_min_effect: bool
    """speedup >= 1 + min_effect."""
    interval_includes_one: bool
    """The speedup's interval includes 1.0 (no difference is plausible)."""
    verdict: str = ""
    """What these figures show, in words (:meth:`dossier.measure.reading.Comparison.verdict`)."""


class RunnerUp(_Model):
    """The next-best admissible route and how far behind it is."""

    route: str
    """The runner-up route."""
    trial_index: int
    """Its search trial."""
    speedup: float
    """Its speedup over the baseline, from the same kind of measurement as the winner's."""
    speedup_ci_low: float
    """Lower end of its interval."""
    speedup_ci_high: float
    """Upper end of its interval."""
    source: Literal["confirmation", "screening"]
    """Which measurement both speedups come from."""
    winner_speedup: float
    """The shipped route's speedup in that same kind of measurement (1.0 for the baseline)."""
    margin: float
    """winner_speedup / speedup - 1: how much faster the shipped route is (negative: the
    runner-up measured faster, but not significantly so)."""


class LossFailure(_Model):
    """One loss that failed the accuracy check."""

    pair: str
    """Validation pair."""
    output: str
    """Output tensor."""
    loss: float | None
    """The loss (None: the output held NaN or Inf)."""
    threshold: float
    """The threshold it reached (a loss fails at loss >= threshold)."""


class RejectedTrial(_Model):
    """A trial that did not end ``ok``, and why."""

    index: int
    """Trial index."""
    route: str
    """Its route."""
    outcome: Outcome
    """How it ended."""
    reason: str
    """The recorded reason (the first failing loss, the error, the signal)."""
    failures: list[LossFailure]
    """For accuracy rejections: every failing loss of every pair, from the per-pair losses."""
    error: str | None
    """For build failures, crashes, timeouts and runtime errors: the error."""
    speedup: float | None
    """Its speedup over the baseline, when it was timed (rejected routes are timed too)."""
    log: str | None = None
    """Its worker log (``RUN/.work/trial-NNNN.log``: everything the trial's process printed),
    when the run folder that made the bundle is at hand (given, or beside the bundle in
    release's layout ``OUT/.runs/NAME-VERSION`` with the same tuning cache) and still holds it."""


class OneKnobEffect(_Model):
    """A knob's effect from the trial that differs from the baseline in that knob alone."""

    knob: str
    """The knob."""
    value: str
    """Its value in the trial."""
    baseline_value: str
    """Its value in the baseline."""
    trial_index: int
    """The trial."""
    outcome: Outcome
    """How the trial ended (a rejected route's speed is still measured)."""
    speedup: float
    """Baseline median / trial median, timed interleaved in the trial's process."""
    speedup_ci_low: float
    """Lower end of the bootstrap interval."""
    speedup_ci_high: float
    """Upper end."""
    p_value: float
    """Two-sided Mann-Whitney U p-value."""
    verdict: Literal["faster", "slower", "no significant effect"]
    """faster/slower: significant, beyond the minimum effect and the interval clear of 1.0
    (:meth:`dossier.measure.reading.Comparison.verdict`)."""
    source: Literal["confirmation", "screening"] = "screening"
    """Where the figures come from: the confirmation, where it measured this route (its
    reading replaces the screening one), else the screening trial only."""
    screened_speedup: float | None = None
    """With ``source`` confirmation: what screening read, for comparison."""
    contention_sensitive: bool = False
    """The knob's effect depends on what else runs on the host (threads, spinning, execution
    mode): a reading on a busy host may not hold on a quiet one, nor the reverse."""


class ModelEffect(_Model):
    """A knob value's effect estimated over all admissible trials."""

    knob: str
    """The knob."""
    value: str
    """The value."""
    reference: str
    """The baseline's value, against which the effect is measured."""
    speed_factor: float
    """exp(coefficient): > 1 means this value makes the engine faster, other knobs fixed."""
    ci_low: float
    """Lower end of its confidence interval."""
    ci_high: float
    """Upper end."""
    std_error: float
    """Standard error of the coefficient (log scale)."""
    trials: int
    """Admissible trials with this value."""


class KnobModel(_Model):
    """Knob effects from a linear model over every admissible trial."""

    fitted: bool
    """False when there are too few admissible trials (or confounded knob values)."""
    method: str
    """How the model is fitted and its uncertainty computed."""
    note: str
    """Why it was not fitted, or what to keep in mind."""
    trials: int
    """Admissible trials used."""
    parameters: int
    """Coefficients including the intercept."""
    residual_std: float | None
    """Residual standard deviation (log scale)."""
    r_squared: float | None
    """Share of the variance of log(speedup) the knobs explain."""
    effects: list[ModelEffect]
    """One per non-reference knob value seen in an admissible trial."""


class GpuFacts(_Model):
    """One GPU of the tuning host."""

    name: str | None
    """Product name."""
    compute_capability: str | None
    """CUDA compute capability."""
    memory_total_mib: int | None
    """Device memory."""
    driver_version: str | None
    """Driver version."""


class Environment(_Model):
    """Where the numbers were measured: the tuning host."""

    hostname: str | None
    """Host name."""
    cpu: str | None
    """CPU model."""
    cpu_vendor: str | None
    """CPU vendor."""
    cores: int | None
    """Logical CPUs."""
    physical_cores: int | None
    """Physical cores."""
    isa_flags: list[str]
    """Instruction-set extensions that decide kernels."""
    os: str | None
    """Distribution (or system) name."""
    kernel: str | None
    """Kernel release."""
    machine: str | None
    """Architecture."""
    glibc: str | None
    """glibc version."""
    python: str
    """Python version."""
    packages: dict[str, str]
    """Relevant package versions."""
    gpus: list[GpuFacts]
    """GPUs (none on a CPU host)."""
    cuda_runtime: str | None
    """CUDA runtime version."""
    collected_at: str
    """When the fingerprint was taken."""


class Lineage(_Model):
    """Which release this is and what it replaces."""

    release: str
    """Release name."""
    version: int
    """Release version."""
    description: str
    """Release description."""
    dossier_id: str | None
    """The bundle's id (None when explaining a run folder)."""
    parent: str | None
    """Dossier id of the bundle this one replaces."""
    first_release: bool
    """True when the bundle names no parent."""
    created_at: str
    """When the search finished (or started, for a run folder)."""
    tool_version: str
    """dossier version that wrote it."""
    backend: str
    """Compiler backend."""
    tuner_version: str
    """Version of the knob source."""


class AACheck(_Model):
    """The baseline against a second load of itself: the run's calibration. It should show no
    difference; a significant one means nothing can ship."""

    trial_index: int
    """The baseline trial (or the confirmation's A/A record)."""
    procedure: str = "screening"
    """``screening`` (trial 0) or ``independent`` (the confirmation's A/A)."""
    rounds: int | None = None
    """Rounds it was computed over."""
    processes: int | None = None
    """Measuring processes it was computed over (the confirmation's A/A)."""
    significant: bool = False
    """p below alpha and the reading at least the minimum effect away from 1.0: the decision
    rule ships nothing."""
    speedup: float
    """Load 2 / load 1 latency (the same statistic as a candidate's speedup)."""
    speedup_ci_low: float
    """Lower end of the interval."""
    speedup_ci_high: float
    """Upper end."""
    p_value: float
    """p-value of the trial's test (signed-rank over rounds; Mann-Whitney U in older records)."""
    includes_one: bool
    """The interval includes 1.0 (as it should)."""
    verdict: str
    """What it says about the timing."""


class SearchCost(_Model):
    """What the search cost."""

    search_wall_s: float
    """Wall time of the search: every tune session added up."""
    build_s: float
    """Engine build time, every trial added up."""
    cached_builds: int = 0
    """Trials whose engine came from the build cache (``tune --build-cache``): their build time,
    in ``build_s``, was spent by the earlier search that built the engine."""
    measure_s: float
    """Timing (warm-up and samples) of every trial, plus the confirmation round."""
    confirm_s: float
    """Wall time of the confirmation round (included in measure_s)."""
    trials: int
    """Baseline and search trials."""
    confirm_trials: int
    """Confirmation re-measurements."""
    sessions: int
    """Runs of tune the search took."""
    recovered_sessions: int = 0
    """Of them, runs killed before they recorded their time, recovered by the next --continue
    from their trials' times (their time after their last trial is not in search_wall_s)."""
    raced: int = 0
    """Screening trials stopped before their last round (``race_rounds``)."""


class SearchSetup(_Model):
    """What was searched and how it was judged."""

    backend: str
    """Compiler backend."""
    strategy: str
    """Search strategy."""
    selection: str
    """The selection, trtexec syntax."""
    metric: str
    """Loss metric."""
    threshold: float
    """A route is admissible when every loss of every pair is below this."""
    validation_pairs: int
    """Validation pairs."""
    inferences_per_sample: int = 1
    """Inferences in one timed sample (``[timing] inputs``): every latency is a sample divided
    by them."""
    samples: int
    """Timed samples per engine per trial."""
    alpha: float
    """Significance level of the rank test."""
    min_effect: float
    """Minimum effect of a gain."""
    confidence: float
    """Confidence level of every interval."""
    confirm_top: int
    """Candidates re-timed in the confirmation round."""


class DecisionFacts(_Model):
    """Which route ships and why."""

    rule: str
    """The decision rule applied, in words."""
    gain: bool
    """True when a route other than the baseline ships: it beat the baseline significantly and
    by the minimum effect; or, in a search dossier did not run (a trtexec import, result "not
    statistically checked"), the other tool's rule chose it and nothing was shown."""
    baseline_route: str
    """The baseline route."""
    shipped_route: str
    """The route whose engine ships."""
    shipped_index: int
    """Its trial index."""
    result: str
    """``1.234x [1.200, 1.270] (p=0.001)`` or ``no significant gain``."""
    reason: str
    """The decision's reason, as the search recorded it."""
    why_not: list[str]
    """Without a gain: why the best candidate (``head_to_head``) did not win: its interval
    includes 1.0, p not below alpha, below the minimum effect, slower; or that no other route
    was admissible. Empty for a search dossier did not measure (``statistically_checked``
    false)."""
    statistically_checked: bool = True
    """False when the choice was made by another tool's rule that no statistics back (a trtexec
    import: the lowest of one mean per route, warm-up included, no repeats, no significance
    test); ``gain`` then only says that a route other than the baseline ships."""


class OutputLoss(_Model):
    """The worst loss of one output tensor over every validation pair."""

    output: str
    """Output tensor."""
    loss: float | None
    """The largest loss of that output over the pairs (None: it held NaN or Inf)."""
    pair: str
    """The pair it came from."""


class TrialFact(_Model):
    """One row of the trial table."""

    index: int
    """Trial index."""
    role: str
    """baseline, search or confirm."""
    route: str
    """Route."""
    knobs: dict[str, str]
    """Value of every knob of the selection."""
    outcome: Outcome
    """How it ended."""
    reason: str | None
    """Why it did not end ok."""
    worst_loss: float | None
    """Largest loss over all pairs and outputs."""
    output_losses: list[OutputLoss] = []
    """Per output tensor, its worst loss over the pairs and which pair (empty when the trial
    was not validated)."""
    median_ms: float | None
    """Median latency."""
    baseline_median_ms: float | None = None
    """Median of the baseline timed interleaved with this trial (its own paired baseline: the
    speedup is this over ``median_ms``)."""
    verdict: str | None = None
    """faster, slower or no significant effect against that paired baseline (None when not
    timed); the A/A reading for the baseline trial."""
    raced: str | None = None
    """Why the screening stopped this trial before its last round (racing); None: it timed
    every round."""
    ci_low_ms: float | None
    """Lower end of the median's interval."""
    ci_high_ms: float | None
    """Upper end."""
    n: int | None
    """Samples."""
    speedup: float | None
    """Speedup over the baseline timed alongside."""
    speedup_ci_low: float | None
    """Lower end of its interval."""
    speedup_ci_high: float | None
    """Upper end."""
    p_value: float | None
    """Rank-test p-value."""
    build_s: float | None
    """Build time."""
    trial_s: float
    """Wall time of the trial."""
    shipped: bool
    """This trial's engine ships."""
    latency: RouteLatency | None = None
    """Its own samples per inference (median, p90, p99, throughput; None when not timed)."""
    confirmed_speedup: float | None = None
    """A search trial the confirmation measured: the confirmation's speedup (what charts
    show in place of the screening one)."""
    confirmed_ci_low: float | None = None
    """Lower end of that reading's interval."""
    confirmed_ci_high: float | None = None
    """Upper end."""
    confirmed_in: int | None = None
    """The confirmation record it comes from."""
    busy: bool | None = None
    """It was measured while other processes kept the host busy (None: not recorded)."""
    log: str | None = None
    """Its worker log (``RUN/.work/trial-NNNN.log``: everything the trial's process printed),
    when the run folder that made the bundle is at hand (given, or beside the bundle in
    release's layout ``OUT/.runs/NAME-VERSION`` with the same tuning cache) and still holds it."""


class Explanation(_Model):
    """Why a bundle ships the route it ships: ``dossier explain --json``."""

    format: Literal["dossier-explanation"] = EXPLANATION_FORMAT
    """Always "dossier-explanation"."""
    format_version: int = EXPLANATION_VERSION
    """Version of this model."""
    lineage: Lineage
    """Release identity and lineage."""
    search: SearchSetup
    """What was searched, how it was judged."""
    decision: DecisionFacts
    """The decision and the rule."""
    head_to_head: HeadToHead | None
    """Winner (or best candidate) against the baseline; None when only the baseline ran ok."""
    runner_up: RunnerUp | None
    """The next-best admissible route."""
    trial_counts: dict[str, int]
    """Baseline and search trials per outcome."""
    confirm_trials: int
    """Confirmation re-measurements."""
    rejected: list[RejectedTrial]
    """Every trial that did not end ok, with its reason."""
    knob_effects: list[OneKnobEffect]
    """Effects from one-knob-at-a-time trials."""
    knob_model: KnobModel
    """Effects from a model over all admissible trials."""
    aa_check: AACheck | None
    """The baseline's A/A check (trial 0)."""
    confirm_aa_check: AACheck | None = None
    """The independent confirmation's A/A check, when the confirmation ran."""
    environment: Environment | None
    """The tuning host."""
    cost: SearchCost
    """What the search cost."""
    payback: Payback
    """When the search pays back."""
    trials: list[TrialFact]
    """Every trial record, confirmation re-measurements included."""
    imported_from: str | None = None
    """Where the search record came from when dossier did not run the search ("trtexec tuning
    cache"); None for a dossier search. Such a record has no timing statistics, wall times or
    tuning host."""
    shipped_latency: RouteLatency | None = None
    """The shipped route's latency per inference: the confirmation's reading where it measured
    the route, else its screening trial's (``source`` says which)."""
    baseline_latency: RouteLatency | None = None
    """The baseline's, the same way."""
    conditions: ConditionsSummary | None = None
    """What the host was doing while the decision was measured (None: not recorded)."""
    conditions_of: str | None = None
    """``confirmation`` or ``search``: whose measurements ``conditions`` summarises."""
    target: str | None = None
    """The conditions the spec declares the engine will serve under, in words."""
    target_note: str | None = None
    """Why the figures are not comparable with that target (None: they are), as ``inspect``
    and ``release`` say it."""
    contention_knobs: list[str] = []
    """Knobs of the selection whose effect depends on what else runs on the host."""
    trade: Trade | None = None
    """The accuracy-speed trade: per route its worst loss per output and its speed, the
    frontier, the routes rejected for accuracy, the hold-out readings (None: no trade to show,
    :func:`dossier.audit.trade.informative`)."""
    warnings: list[str] = []
    """What the release is warned about: its manifest's warnings and, for a shipped route that
    changes the numbers with no hold-out set to check it, that (bundles written before it
    was recorded get it too)."""
    search_budget: SearchBudget | None = None
    """How a budgeted search (strategy budget or random) spent its budget; None for others."""
    scenario: ScenarioFacts | None = None
    """The server or offline scenario's decision: the latency-throughput curve of the
    configurations measured, the bound, the shipped point (None: released for single-stream)."""


# ----------------------------------------------------------------------------------- compute
def explain(bundle: Bundle, *, inferences_per_day: float | None = None,
            horizon_days: float | None = None, hosts: int | None = None,
            run_dir: Path | None = None) -> Explanation:
    """The explanation of an opened bundle. The expected volume comes from the spec's
    [deployment] section unless given here. ``run_dir``: the run folder that made it, for the
    trials' worker logs (None: the one beside the bundle, :func:`run_folder`, if any)."""
    from dossier.bundle.tables import KNOB_PREFIX

    cache = bundle.tuning_cache()
    decision = cache.decision
    if decision is None:  # the writer refuses unfinished searches; a hand-made bundle may not
        from dossier.errors import BundleFormatError

        raise BundleFormatError(f"{bundle.source}: its tuning cache has no decision record",
                                hint="dossier verify --integrity-only BUNDLE")
    routes = bundle.routes()
    knob_cols = [c for c in routes.column_names if c.startswith(KNOB_PREFIX)]
    rows = routes.select(["index", *knob_cols]).to_pylist()
    knobs = {r["index"]: {c[len(KNOB_PREFIX):]: r[c] for c in knob_cols if r[c] is not None}
             for r in rows}
    from dossier.bundle.overview import precision_warnings

    recorded_warnings = list(bundle.manifest.warnings)
    warnings = [*recorded_warnings,
                *(w for w in precision_warnings(bundle) if w not in recorded_warnings)]
    e = explain_search(cache.header, cache.trials, cache.sessions, decision, knobs=knobs,
                       holdouts=cache.holdouts, warnings=warnings,
                       fingerprint=bundle.fingerprint(), manifest=bundle.manifest,
                       inferences_per_day=inferences_per_day, horizon_days=horizon_days,
                       hosts=hosts, run_dir=run_dir if run_dir is not None
                       else run_folder(bundle))
    from dossier.scenarios.evidence import recorded  # a server or offline release's curve

    scenario = recorded(bundle)
    return e if scenario is None else e.model_copy(update={"scenario": facts(scenario)})


def run_folder(bundle: Bundle) -> Path | None:
    """The run folder that made ``bundle`` when it is still beside it in release's layout
    (``OUT/.runs/NAME-VERSION`` next to ``OUT/NAME-VERSION.dossier``) and its tuning cache
    starts with the bundle's header line (the same search); None otherwise."""
    from dossier.errors import BundleError
    from dossier.run_folder import CACHE_NAME

    folder = Path(bundle.source).parent / RUNS / bundle.manifest.name
    try:
        with open(bundle.file(CACHE_NAME), "rb") as ours:
            first = ours.readline(_HEADER_MAX)
        with open(folder / CACHE_NAME, "rb") as theirs:
            return folder if first and theirs.readline(_HEADER_MAX) == first else None
    except (OSError, BundleError):
        return None


_HEADER_MAX = 1 << 22
"""The most of a tuning cache's first line read to compare it (a header is a few KiB)."""


def worker_log(run_dir: Path | None, t: TrialRecord) -> str | None:
    """Trial ``t``'s worker log in ``run_dir`` when it is there (confirmation trials share
    their measuring processes' logs: none of their own)."""
    if run_dir is None or t.role == "confirm":
        return None
    log = Path(run_dir) / ".work" / f"trial-{t.index:04d}.log"
    return str(log) if log.is_file() else None


def explain_search(header: CacheHeader, trials: Sequence[TrialRecord],
                   sessions: Sequence[SessionRecord], decision: DecisionRecord, *,
                   knobs: Mapping[int, Mapping[str, str]] | None = None,
                   fingerprint: Fingerprint | None = None, manifest: Manifest | None = None,
                   inferences_per_day: float | None = None, horizon_days: float | None = None,
                   hosts: int | None = None, run_dir: Path | None = None,
                   holdouts: Sequence[HoldoutRecord] = (),
                   warnings: Sequence[str] | None = None,
                   db: KnobDatabase | None = None) -> Explanation:
    """The explanation of a finished search (a tuning cache's records).

    ``knobs`` gives each trial's effective knob values (routes.parquet's ``knob:`` columns);
    without it they are read from the route texts. ``manifest`` adds the bundle's identity and
    lineage; ``fingerprint`` the tuning host; ``run_dir`` (the run folder) the trials' worker
    logs. ``warnings``: the release's (None: worked out here, with the knob database ``db``
    saying which routes change the numbers).
    """
    settings = header.timing
    trials = list(trials)
    values = _knob_values(trials, knobs)
    main = [t for t in trials if t.role != "confirm"]
    # a trtexec ``full`` search need not have built the default route: no baseline trial
    baseline = next((t for t in trials if t.role == "baseline"), None)
    imported = next((t.extra["source"] for t in trials if t.extra.get("source") == TRTEXEC), None)
    pairs = header.per_sample
    h2h = _head_to_head(trials, decision, settings, pairs)
    contention = _contention_knobs(header.backend)
    from dossier.bundle.overview import decision_conditions, target_facts

    cond, cond_of = decision_conditions(trials)
    target, target_note = target_facts(header.spec.target, decision, list(trials))
    counts: dict[str, int] = {}
    for t in main:
        counts[t.outcome.value] = counts.get(t.outcome.value, 0) + 1
    cost = _cost(trials, sessions)
    dep = header.deployment
    per_day = dep.inferences_per_day if inferences_per_day is None else inferences_per_day
    source: Literal["spec", "flags", "none"] = (
        "flags" if inferences_per_day is not None
        else "spec" if dep.inferences_per_day > 0 else "none")
    pay = payback(
        tuning_s=cost.search_wall_s, gain=decision.gain,
        baseline_median_ms=h2h.baseline.median_ms if h2h and h2h.shipped else None,
        speedup=h2h.speedup if h2h and h2h.shipped else None,
        speedup_ci_low=h2h.speedup_ci_low if h2h and h2h.shipped else None,
        speedup_ci_high=h2h.speedup_ci_high if h2h and h2h.shipped else None,
        inferences_per_day=per_day,
        horizon_days=dep.horizon_days if horizon_days is None else horizon_days,
        hosts=dep.hosts if hosts is None else hosts, source=source,
        inferences_per_sample=pairs)
    if imported:
        pay = pay.model_copy(update={"verdict": f"unknown: the {imported} records neither the "
                                     "search's wall time nor a statistically checked speedup"})
    if imported or baseline is None:
        note = (f"the {imported} has one mean per route (warm-up included), no samples and no "
                "baseline timed alongside, so knob effects cannot be estimated" if imported
                else "no baseline trial to measure effects against")
        knob_model = KnobModel(fitted=False, method=MODEL_METHOD, note=note, trials=0,
                               parameters=0, residual_std=None, r_squared=None, effects=[])
    else:
        knob_model = fit_knob_model(main, values, baseline, settings.confidence)
    return Explanation(
        lineage=_lineage(header, manifest),
        search=SearchSetup(backend=header.backend, strategy=header.strategy,
                           selection=header.selection, metric=header.metric,
                           threshold=header.threshold, validation_pairs=header.validation_pairs,
                           inferences_per_sample=pairs, samples=settings.samples, alpha=settings.alpha,
                           min_effect=settings.min_effect, confidence=settings.confidence,
                           confirm_top=settings.confirm_top),
        decision=DecisionFacts(rule=decision.rule, gain=decision.gain,
                               baseline_route=decision.baseline_route,
                               shipped_route=decision.shipped_route,
                               shipped_index=decision.shipped_index,
                               result="not statistically checked" if imported
                               else _result(decision), reason=decision.reason,
                               why_not=[] if decision.gain or imported
                               else _why_not(h2h, main, trials, settings, decision),
                               statistically_checked=not imported),
        head_to_head=h2h,
        runner_up=_runner_up(trials, decision, h2h),
        trial_counts=dict(sorted(counts.items())),
        confirm_trials=sum(t.role == "confirm" for t in trials),
        rejected=[_rejected(t, header.threshold, worker_log(run_dir, t)) for t in main
                  if t.outcome is not Outcome.OK],
        knob_effects=_one_knob_effects(main, values, baseline, settings, trials,
                                       contention) if baseline else [],
        knob_model=knob_model,
        aa_check=_aa(baseline, settings, decision.aa, vetoes=decision.aa_stops)
        if baseline else None,
        confirm_aa_check=next((_aa(t, settings, decision.confirm_aa, vetoes=decision.aa_stops)
                               for t in reversed(trials)
                               if baseline and t.role == "confirm"
                               and t.route == baseline.route), None),
        # an imported record's fingerprint is the "unknown host" placeholder, not a host
        environment=_environment(fingerprint) if fingerprint is not None and not imported
        else None,
        cost=cost,
        payback=pay,
        trials=[_with_confirmed(_trial_fact(t, values.get(t.index, {}), decision.shipped_index,
                                            settings, pairs), t, trials)
                .model_copy(update={"log": worker_log(run_dir, t)}) for t in trials],
        imported_from=imported,
        shipped_latency=of_route(trials, decision.shipped_route, decision.baseline_route, pairs),
        baseline_latency=of_route(trials, decision.baseline_route, decision.baseline_route,
                                  pairs),
        conditions=cond, conditions_of=cond_of, target=target, target_note=target_note,
        contention_knobs=sorted(k for k in {k for v in values.values() for k in v}
                                if k in contention),
        trade=_trade(header, trials, decision, holdouts),
        search_budget=search_budget(header, trials, run_dir),
        warnings=list(warnings) if warnings is not None
        else _precision_warnings(header, decision, db),
    )


def _precision_warnings(header: CacheHeader, decision: DecisionRecord,
                        db: KnobDatabase | None) -> list[str]:
    """The warning of a shipped route that changes the numbers with no hold-out set."""
    from dossier.datasets import no_holdout_warning, numeric_changes

    if db is None or header.holdout is not None:
        return []
    changes = numeric_changes(decision.shipped_route, decision.baseline_route, db)
    return [no_holdout_warning(changes)] if changes else []


def _trade(header: CacheHeader, trials: Sequence[TrialRecord], decision: DecisionRecord,
           holdouts: Sequence[HoldoutRecord]) -> Trade | None:
    t = trade(trials, decision, header.threshold, header.metric, holdouts,
              header.holdout.size if header.holdout else None)
    return t if informative(t) else None


def _knob_values(trials: Sequence[TrialRecord],
                 knobs: Mapping[int, Mapping[str, str]] | None) -> dict[int, dict[str, str]]:
    """Each trial's knob values; a knob a route does not name takes the baseline's value (the
    default, as the baseline pins only what the selection pins)."""
    if knobs is not None:
        out = {i: dict(v) for i, v in knobs.items()}
        by_route = {t.route: out[t.index] for t in trials if t.index in out}
        for t in trials:  # confirmation records are not rows of routes.parquet in every version
            if t.index not in out and t.route in by_route:
                out[t.index] = by_route[t.route]
        if all(t.index in out for t in trials):
            return out
    parsed = {t.index: Route.parse(t.route).as_dict() for t in trials}
    base = next((parsed[t.index] for t in trials if t.role == "baseline"), {})
    names = sorted({k for v in parsed.values() for k in v})
    return {i: {k: v.get(k, base.get(k, "")) for k in names} for i, v in parsed.items()}


def _latency(median: float, lo: float, hi: float, n: int,
             per: RouteLatency | None = None) -> Latency:
    return Latency(median_ms=median, ci_low_ms=lo, ci_high_ms=hi, n=n, per_inference=per)


def _contention_knobs(backend: str) -> frozenset[str]:
    """The backend's contention-sensitive knobs (none when it is not installed here)."""
    from dossier.backends import get_backend
    from dossier.errors import DossierError

    try:
        return get_backend(backend).contention_knobs
    except DossierError:
        return frozenset()


def _confirmation_of(trials: Sequence[TrialRecord], route: str) -> TrialRecord | None:
    """The last confirmation record of ``route`` with a reading (a candidate's, not the A/A)."""
    base = next((t.route for t in trials if t.role == "baseline"), None)
    return next((t for t in reversed(trials) if t.role == "confirm" and t.route == route
                 and t.route != base and t.comparison is not None), None)


def _with_confirmed(f: TrialFact, t: TrialRecord, trials: Sequence[TrialRecord]) -> TrialFact:
    """A search trial's fact with the confirmation's reading of its route, if any."""
    from dossier.measure.conditions import BUSY_SHARE

    busy = None if not t.conditions else any(c.busy(BUSY_SHARE) for c in t.conditions)
    c = _confirmation_of(trials, t.route) if t.role == "search" else None
    if c is None or c.comparison is None:
        return f.model_copy(update={"busy": busy})
    r = c.comparison
    return f.model_copy(update={"busy": busy, "confirmed_speedup": r.speedup,
                                "confirmed_ci_low": r.speedup_ci_low,
                                "confirmed_ci_high": r.speedup_ci_high, "confirmed_in": c.index})


def _head_to_head(trials: Sequence[TrialRecord], decision: DecisionRecord,
                  settings: TimingSettings, pairs: int = 1) -> HeadToHead | None:
    confirms = {t.route: t for t in trials if t.role == "confirm" and t.comparison is not None
                and t.route != decision.baseline_route}
    search = {t.route: t for t in trials if t.role == "search"}
    if decision.gain:
        route = decision.shipped_route
        record = confirms.get(route) or search.get(route)
    elif confirms:
        record = max(confirms.values(), key=lambda t: _cmp(t).speedup)
    else:
        ok = [t for t in search.values() if t.admissible and t.comparison is not None]
        record = max(ok, key=lambda t: _cmp(t).speedup) if ok else None
    if record is None or record.comparison is None or record.timing is None:
        return None
    c, tm = record.comparison, record.timing
    confirmed = record.role == "confirm"
    origin = search.get(record.route)
    spread: tuple[float | None, float | None] = c.round_range() or (None, None)
    return HeadToHead(
        route=record.route, trial_index=origin.index if origin else record.index,
        measured_in=record.index, source="confirmation" if confirmed else "screening",
        shipped=decision.gain and record.route == decision.shipped_route,
        candidate=_latency(tm.median_ms, tm.ci_low_ms, tm.ci_high_ms, tm.n,
                           of_record(record, pairs)),
        baseline=_latency(c.baseline.median_ms, c.baseline.ci_low_ms, c.baseline.ci_high_ms,
                          c.baseline.n, per_inference(
                              record.baseline_samples_ms or [], pairs, route=decision.baseline_route,
                              source="confirmation" if confirmed else "screening",
                              trial_index=record.index)),
        speedup=c.speedup, speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
        confidence=settings.confidence, test=c.test, p_value=c.p_value, alpha=c.judged_level,
        rounds=c.rounds,
        round_ratio_low=spread[0], round_ratio_high=spread[1],
        generation_speedups=c.generation_speedups, processes=c.processes,
        process_speedups=c.process_speedups, prediction_low=c.prediction_low,
        prediction_high=c.prediction_high, against=c.against or "baseline",
        significant=c.clears_level, min_effect=settings.min_effect,
        reaches_min_effect=c.reaches(settings.min_effect), interval_includes_one=c.includes_one,
        verdict=c.verdict(settings.min_effect).text)


def shown_verdict(label: str | None, role: str) -> str | None:
    """A verdict as printed beside a reading: a screening (search) trial's is only ever
    *screened* faster or slower (the confirmation decides what ships); others as they are."""
    if label in ("faster", "slower") and role == "search":
        return f"screened {label}"
    return label


def _cmp(t: TrialRecord) -> Comparison:
    assert t.comparison is not None
    return t.comparison


def _result(d: DecisionRecord) -> str:
    from dossier.datasets import decision_result

    return decision_result(d)


def _why_not(h2h: HeadToHead | None, main: Sequence[TrialRecord],
             trials: Sequence[TrialRecord], settings: TimingSettings,
             decision: DecisionRecord) -> list[str]:
    if h2h is None:
        if not any(t.role == "search" for t in main):
            return ["only the baseline was measured"]
        return ["no other route was admissible"]
    record = next(t for t in trials if t.index == h2h.measured_in)
    v = _cmp(record).verdict(settings.min_effect)
    if v.label == "slower":
        return [f"it was slower than the baseline ({v.figures} < alpha={h2h.alpha:.2g})"]
    if v.label == "faster":  # faster, yet not shipped: say which part of the rule stopped it
        return [_stopped_by(record, decision)]
    return list(v.reasons)


def _stopped_by(record: TrialRecord, decision: DecisionRecord) -> str:
    """Why a route that read faster did not ship, from the readings the decision recorded
    (in older records an A/A reading could stop a release, or a gain had to clear its upper
    end; today the confirmation alone decides)."""
    c = _cmp(record)
    if c.test == PROCESS_TEST:
        return "it was not confirmed"
    if record.role == "search" and decision.candidates:
        return "the confirmation, which decides, did not confirm it"
    for aa, where in ((decision.aa, "A/A check"), (decision.confirm_aa, "confirmation's A/A")):
        if aa is not None and aa.significant:
            return f"the {where} read {aa.text()}, which stops the release"
    aa = decision.confirm_aa if record.role == "confirm" else decision.aa
    if aa is not None and c.speedup_ci_low <= aa.speedup_ci_high:
        return (f"its interval's lower end {c.speedup_ci_low:.3f} does not clear the "
                f"{'confirmation ' if record.role == 'confirm' else ''}A/A reading's upper end "
                f"{aa.speedup_ci_high:.3f}")
    return "it was not confirmed"


def _runner_up(trials: Sequence[TrialRecord], decision: DecisionRecord,
               h2h: HeadToHead | None) -> RunnerUp | None:
    shipped = decision.shipped_route
    search = {t.route: t for t in trials if t.role == "search"}
    confirms = {t.route: t for t in trials if t.role == "confirm" and t.comparison is not None
                and t.route != decision.baseline_route}
    ok = [t for t in search.values() if t.admissible and t.comparison is not None
          and t.route != shipped]
    if not ok:
        return None
    route = decision.runner_up_route if decision.runner_up_route in {t.route for t in ok} \
        else max(ok, key=lambda t: _cmp(t).speedup).route
    other = search[route]
    if route in confirms and (shipped in confirms or not decision.gain):
        source: Literal["confirmation", "screening"] = "confirmation"
        r = _cmp(confirms[route])
        w = _cmp(confirms[shipped]).speedup if decision.gain else 1.0
    else:
        source = "screening"
        r = _cmp(other)
        w = _cmp(search[shipped]).speedup if decision.gain and shipped in search \
            and search[shipped].comparison is not None else 1.0
    return RunnerUp(route=route, trial_index=other.index, speedup=r.speedup,
                    speedup_ci_low=r.speedup_ci_low, speedup_ci_high=r.speedup_ci_high,
                    source=source, winner_speedup=w, margin=w / r.speedup - 1)


def _rejected(t: TrialRecord, threshold: float, log: str | None = None) -> RejectedTrial:
    failures = []
    if t.outcome is Outcome.REJECTED:
        for pair, per in sorted((t.losses or {}).items()):
            for output, loss in sorted(per.items()):
                if loss is None or not math.isfinite(loss) or loss >= threshold:
                    failures.append(LossFailure(pair=pair, output=output,
                                                loss=loss if loss is None or math.isfinite(loss)
                                                else None, threshold=threshold))
    return RejectedTrial(
        index=t.index, route=t.route, outcome=t.outcome,
        reason=t.reason or t.outcome.value, failures=failures,
        error=None if t.outcome is Outcome.REJECTED else (t.reason or t.outcome.value),
        speedup=t.comparison.speedup if t.comparison else None, log=log)


def _one_knob_effects(main: Sequence[TrialRecord], values: Mapping[int, Mapping[str, str]],
                      baseline: TrialRecord, settings: TimingSettings,
                      trials: Sequence[TrialRecord] = (),
                      contention: frozenset[str] = frozenset()) -> list[OneKnobEffect]:
    base = values.get(baseline.index, {})
    out = []
    for t in main:
        if t.role != "search" or t.comparison is None:
            continue
        mine = values.get(t.index, {})
        diff = [k for k in sorted(set(base) | set(mine)) if base.get(k) != mine.get(k)]
        if len(diff) != 1:
            continue
        c = t.comparison
        confirmed = _confirmation_of(trials, t.route)
        if confirmed is not None and confirmed.comparison is not None:  # it decides
            c = confirmed.comparison
        verdict = c.verdict(settings.min_effect).label
        out.append(OneKnobEffect(
            knob=diff[0], value=mine.get(diff[0], ""), baseline_value=base.get(diff[0], ""),
            trial_index=t.index, outcome=t.outcome, speedup=c.speedup,
            speedup_ci_low=c.speedup_ci_low, speedup_ci_high=c.speedup_ci_high,
            p_value=c.p_value, verdict=verdict,
            source="confirmation" if confirmed is not None else "screening",
            screened_speedup=t.comparison.speedup if confirmed is not None else None,
            contention_sensitive=diff[0] in contention))
    return sorted(out, key=lambda e: (e.knob, e.value))


MODEL_METHOD = ("ordinary least squares (numpy lstsq) of log(speedup against the baseline timed "
                "interleaved in the same trial) on one-hot knob values, the baseline's value "
                "as reference, with an intercept; analytic standard errors, t-distribution "
                "intervals; effect = exp(coefficient), a speed factor with the other knobs "
                "fixed")


def fit_knob_model(main: Sequence[TrialRecord], values: Mapping[int, Mapping[str, str]],
                   baseline: TrialRecord, confidence: float = 0.95) -> KnobModel:
    """Fit the knob model over the admissible baseline and search trials (see module doc).

    Fitted only when there are at least two residual degrees of freedom and the knob values
    are not confounded; otherwise ``fitted`` is False and ``note`` says why.
    """
    rows = [t for t in main if t.admissible and t.comparison is not None
            and t.comparison.speedup > 0]
    base = values.get(baseline.index, {})
    varied = sorted(k for k in base if len({values.get(t.index, {}).get(k) for t in main}) > 1)
    columns = [(k, v) for k in varied
               for v in sorted({values.get(t.index, {}).get(k, "") for t in rows})
               if v != base.get(k)]
    n, p = len(rows), len(columns) + 1

    def _unfitted(note: str) -> KnobModel:
        return KnobModel(fitted=False, method=MODEL_METHOD, note=note, trials=n, parameters=p,
                         residual_std=None, r_squared=None, effects=[])

    if not columns:
        return _unfitted("no knob value other than the baseline's was admissible; only the "
                        "one-knob-at-a-time effects (if any) are measured")
    if n - p < 2:
        return _unfitted(f"{n} admissible trial(s) for {p} coefficients: at least {p + 2} are "
                        "needed (two residual degrees of freedom); see the one-knob-at-a-time "
                        "effects")
    x = np.ones((n, p))
    for j, (k, v) in enumerate(columns, start=1):
        x[:, j] = [1.0 if values.get(t.index, {}).get(k) == v else 0.0 for t in rows]
    y = np.log([_cmp(t).speedup for t in rows])
    if np.linalg.matrix_rank(x) < p:
        return _unfitted("the knob values seen in admissible trials are confounded (some "
                        "always change together), so their effects cannot be told apart")
    from scipy import stats

    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    dof = n - p
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv(x.T @ x)
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    tq = float(stats.t.ppf((1 + confidence) / 2, dof))
    total = float(((y - y.mean()) ** 2).sum())
    effects = [ModelEffect(knob=k, value=v, reference=base.get(k, ""),
                           speed_factor=math.exp(beta[j]),
                           ci_low=math.exp(beta[j] - tq * se[j]),
                           ci_high=math.exp(beta[j] + tq * se[j]), std_error=float(se[j]),
                           trials=int(x[:, j].sum()))
               for j, (k, v) in enumerate(columns, start=1)]
    return KnobModel(fitted=True, method=MODEL_METHOD,
                     note=f"{n} admissible trials, {p} coefficients, {dof} residual degrees of "
                     "freedom; assumes knob effects multiply (no interactions)",
                     trials=n, parameters=p, residual_std=math.sqrt(sigma2),
                     r_squared=1 - float(resid @ resid) / total if total > 0 else None,
                     effects=effects)


def _aa(baseline: TrialRecord, settings: TimingSettings, recorded: Reading | None = None, *,
        vetoes: bool = True) -> AACheck | None:
    """The A/A check of ``baseline`` (trial 0, or the confirmation's A/A record). Whether it
    was significant is what the decision recorded for this record (``recorded``, the decision
    record's ``aa`` or ``confirm_aa``: the reading the release was decided on, under the rule in
    force then); only a decision that recorded no reading of it is judged by today's rule.
    ``vetoes``: the decision was taken by an older rule, under which a significant A/A stopped
    the release (today's confirmation tests each candidate against the A/A instead)."""
    c = baseline.comparison
    reading = baseline.reading(settings.min_effect)
    if c is None or reading is None:
        return None
    if recorded is not None and recorded.trial_index == baseline.index \
            and recorded.rounds == c.rounds:
        reading = recorded
    if not vetoes:
        inside = reading.speedup_ci_low <= 1.0 <= reading.speedup_ci_high
        where = ("in the same measuring processes: the confirmation tests each candidate "
                 "against this second load, so a difference between loads cancels"
                 if c.test == PROCESS_TEST else
                 "in screening, which only ranks: the confirmation decides")
        verdict = (f"two loads of the same engine read apart ({reading.text()}), {where}"
                   if reading.significant else
                   f"as expected: no significant difference between two loads of the same "
                   f"engine ({where})")
        return AACheck(trial_index=baseline.index, procedure=reading.procedure,
                       rounds=reading.rounds, processes=reading.processes,
                       significant=reading.significant,
                       speedup=reading.speedup, speedup_ci_low=reading.speedup_ci_low,
                       speedup_ci_high=reading.speedup_ci_high, p_value=reading.p_value,
                       includes_one=inside, verdict=verdict)
    m = settings.min_effect
    inside = reading.speedup_ci_low <= 1.0 <= reading.speedup_ci_high
    significant = reading.significant
    below = within_effect(reading.speedup, m)
    low_p = reading.p_value < settings.alpha
    if significant and below:  # decided by a rule that stopped at any significant A/A
        verdict = ("significant: two loads of the same engine timed differently (p < alpha), "
                   "and the rule this search was decided by stopped the release at that, so "
                   f"nothing ships (today's rule stops it only at the minimum effect of {m:.0%} "
                   "or more)")
    elif significant:
        verdict = ("significant: two loads of the same engine timed differently, by at least "
                   "the minimum effect, so the procedure is biased on this host by about that "
                   "much and nothing ships")
    else:
        verdict = "as expected: no significant difference between two loads of the same engine"
        if low_p and below:
            verdict += f" (p < alpha, but below the minimum effect of {m:.0%}"
        elif low_p:
            verdict += " (p < alpha, but not significant as decided"
        elif not inside:
            verdict += " (the interval excludes 1.0 narrowly"
        if low_p or not inside:
            verdict += ": a gain must clear its upper end)"
    return AACheck(trial_index=baseline.index, procedure=reading.procedure,
                   rounds=reading.rounds, significant=significant, speedup=reading.speedup,
                   speedup_ci_low=reading.speedup_ci_low,
                   speedup_ci_high=reading.speedup_ci_high, p_value=reading.p_value,
                   includes_one=inside, verdict=verdict)


def _cost(trials: Sequence[TrialRecord], sessions: Sequence[SessionRecord]) -> SearchCost:
    main = [t for t in trials if t.role != "confirm"]
    confirm_rounds = {t.started_at: t.trial_s for t in trials if t.role == "confirm"}
    confirm_s = sum(confirm_rounds.values())
    return SearchCost(
        search_wall_s=sum(s.wall_s for s in sessions),
        build_s=sum(t.build_s or 0.0 for t in trials if t.role != "confirm"),
        cached_builds=sum(1 for t in main
                          if t.build_s is not None and t.extra.get("build_cache") == "hit"),
        measure_s=sum(t.phases_s.get("time", 0.0) for t in main) + confirm_s,
        confirm_s=confirm_s, trials=len(main), confirm_trials=len(trials) - len(main),
        sessions=len(sessions), recovered_sessions=sum(1 for s in sessions if s.recovered),
        raced=sum(1 for t in main if t.raced))


def _lineage(h: CacheHeader, m: Manifest | None) -> Lineage:
    if m is None:
        return Lineage(release=h.release, version=h.release_version, description=h.description,
                       dossier_id=None, parent=None, first_release=True, created_at=h.created_at,
                       tool_version=h.tool_version, backend=h.backend,
                       tuner_version=h.tuner_version)
    return Lineage(release=m.release, version=m.release_version, description=m.description,
                   dossier_id=m.dossier_id, parent=m.parent, first_release=m.parent is None,
                   created_at=m.created_at, tool_version=m.tool_version, backend=m.backend,
                   tuner_version=m.tuner_version)


def _environment(fp: Fingerprint) -> Environment:
    return Environment(
        hostname=fp.hostname, cpu=fp.cpu.model, cpu_vendor=fp.cpu.vendor, cores=fp.cpu.cores,
        physical_cores=fp.cpu.physical_cores, isa_flags=list(fp.cpu.isa_flags),
        os=fp.os.distribution or fp.os.system, kernel=fp.os.release, machine=fp.os.machine,
        glibc=fp.os.glibc, python=f"{fp.python.implementation} {fp.python.version}",
        packages=dict(sorted(fp.packages.items())),
        gpus=[GpuFacts(name=g.name, compute_capability=g.compute_capability,
                       memory_total_mib=g.memory_total_mib, driver_version=g.driver_version)
              for g in fp.gpus],
        cuda_runtime=fp.cuda_runtime, collected_at=fp.collected_at)


def output_losses(losses: Mapping[str, Mapping[str, float | None]] | None) -> list[OutputLoss]:
    """Per output, the worst loss over the pairs and its pair."""
    return [OutputLoss(output=o, loss=v if v is None or math.isfinite(v) else None, pair=p)
            for o, (p, v) in worst_by_output(losses).items()]


def _trial_fact(t: TrialRecord, knobs: Mapping[str, str], shipped_index: int,
                settings: TimingSettings, pairs: int = 1) -> TrialFact:
    tm, c = t.timing, t.comparison
    return TrialFact(
        index=t.index, role=t.role, route=t.route, knobs=dict(knobs), outcome=t.outcome,
        reason=t.reason, worst_loss=t.worst_loss, output_losses=output_losses(t.losses),
        baseline_median_ms=c.baseline.median_ms if c else None,
        verdict=None if c is None else c.verdict(settings.min_effect).label, raced=t.raced,
        median_ms=tm.median_ms if tm else None, ci_low_ms=tm.ci_low_ms if tm else None,
        ci_high_ms=tm.ci_high_ms if tm else None, n=tm.n if tm else None,
        speedup=c.speedup if c else None, speedup_ci_low=c.speedup_ci_low if c else None,
        speedup_ci_high=c.speedup_ci_high if c else None, p_value=c.p_value if c else None,
        build_s=t.build_s, trial_s=t.trial_s,
        shipped=t.index == shipped_index and t.role != "confirm", latency=of_record(t, pairs))
