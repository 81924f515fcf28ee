"""The facts of ``dossier explain`` as one model (:class:`Explanation`) and its parts: what
:func:`dossier.audit.explain.explain` builds from a bundle's records and every output format
renders (:mod:`dossier.formats`). Models only: the facts are worked out in
:mod:`dossier.audit.explain`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from dossier.audit.budget import SearchBudget
from dossier.audit.payback import Payback
from dossier.audit.trade import Trade
from dossier.measure.conditions import Summary as ConditionsSummary
from dossier.measure.latency import RouteLatency
from dossier.scenarios.curve import ScenarioFacts
from dossier.trial import Outcome

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
