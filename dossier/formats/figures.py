"""The figures that more than one output format shows, each written once: a figure reads the
same, under the same name, in the text, the Markdown and (for ``explain``) the HTML.

Everything here returns plain, unescaped text; a format escapes it for its medium.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dossier.audit.explain import Explanation, HeadToHead, Latency, OneKnobEffect, TrialFact
    from dossier.audit.trade import Trade, TradePoint
    from dossier.bundle.overview import Overview
    from dossier.host.policy import Finding
    from dossier.measure.conditions import Summary as ConditionsSummary
    from dossier.trial import Reading
    from dossier.verify import Rebench, Recheck, VerifyReport

Rows = list[tuple[str, str]]
"""(label, value) pairs; a label "" continues the row above."""


def ci(value: float, lo: float | None, hi: float | None, unit: str = "x", digits: int = 3) -> str:
    """``1.234x [1.200, 1.270]``."""
    if lo is None or hi is None:
        return f"{value:.{digits}f}{unit}"
    return f"{value:.{digits}f}{unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


def route(r: str | None) -> str:
    """A route, or ``(default route)`` for the backend's default."""
    return r or "(default route)"


def loss_text(loss: float | None) -> str:
    """A loss, or ``NaN/Inf`` for an output that held one."""
    return "NaN/Inf" if loss is None else f"{loss:.3g}"


def loss_cause(metric: str, loss: float | None) -> str:
    """What a loss says beyond its value: a ``cos`` loss of exactly 1 is an all-zero output
    (or reference), which has no direction; "" otherwise."""
    if metric == "cos" and loss == 1.0:
        return " (an all-zero output or reference: a zero vector has no direction)"
    return ""


# ------------------------------------------------------------------------------------ overview
def overview_title(o: Overview) -> str:
    """``NAME version N``."""
    return f"{o.release} version {o.version}"


def aa_text(a: Reading) -> str:
    """An A/A reading as the overview shows it."""
    return (f"{ci(a.speedup, a.speedup_ci_low, a.speedup_ci_high)} (p={a.p_value:.2g}, "
            + (f"{a.processes} processes" if a.processes else f"{a.rounds or '?'} rounds")
            + f", {a.procedure}): "
            + ("two loads of one engine read apart" if a.significant
               else "no difference, as it should" if a.includes_one
               else "apart by less than the minimum effect (the interval excludes 1.0), "
                    "below what the rule acts on"))


def overview_rows(o: Overview) -> Rows:
    """The overview, row by row: what ``inspect`` shows, in every format."""
    m, b, w = o.model, o.baseline, o.winner
    rows: Rows = [
        ("dossier id", o.dossier_id),
        ("parent", o.parent or "none"),
        ("created", f"{o.created_at} (dossier {o.tool_version}, format {o.format_version})"),
        ("backend", o.backend + (f" {o.engine_version} (the plan's TensorRT; tuner "
                                 f"{o.tuner_version})" if o.engine_version
                                 else f" ({o.tuner_version})")),
        ("model", f"{m.file_name}, {m.size} bytes, {m.algorithm} {m.digest}"
         + (f", {m.external_data} external data file(s)" if m.external_data else "")
         + ("" if m.included else " (not included)")),
        ("search", f"{o.strategy} over {o.selection}"),
        ("accuracy", f"{o.metric} < {o.threshold:g} on every output of {o.validation_pairs} "
         "pair(s)" + (f" (atol {o.atol:g}, rtol {o.rtol:g})" if o.metric == "l0" else "")),
        ("baseline", route(b.route)
         + (f"  median {o.baseline_latency.text()}{loaded(o.target_note)}"
            if o.baseline_latency is not None else "")),
        ("shipped", route(w.route) + ("  (the baseline)" if w.is_baseline else "")
         + (f"  median {o.shipped_latency.text()}{loaded(o.target_note)}"
            if o.shipped_latency is not None and not w.is_baseline else "")),
    ]
    rows += data_set_rows(o)
    sp = o.speedup
    if sp is not None:
        p = f", p={sp.p_value:.2g}" if sp.p_value is not None else ""
        rows.append(("speedup", f"{ci(sp.value, sp.ci_low, sp.ci_high)} "
                                f"({sp.confidence:.0%} CI){p}{of_blocks(o.target_note)}"))
    else:  # "no significant gain", or "not statistically checked" (a trtexec import)
        rows.append(("speedup", o.result))
    rows.append(("why", o.reason))
    for label, a in (("A/A check", o.aa), ("A/A confirm", o.confirm_aa)):
        if a is not None:
            rows.append((label, aa_text(a)))
    rows.append(("load with", f"dossier.load({o.bundle!r}) (verifies, then loads the engine as "
                              "it was timed; dossier run BUNDLE -i inputs.npz tries it)"))
    if o.load is not None:
        ld = o.load
        rows.append(("raw loader", ld.call.replace("ENGINE", repr(w.engine))
                     + (f" ({', '.join(f'{k}={v}' for k, v in ld.options.items())})"
                        if ld.options else "") + " (no verification)"))
    if o.runner_up is not None:
        ru = o.runner_up
        rows.append(("runner-up", ru.route + (f"  {ru.speedup:.3f}x" if ru.speedup is not None
                                              else "")))
    for i, x in enumerate(o.accuracy_by_output or []):
        rows.append(("losses" if i == 0 else "",
                     f"{x.output}: {o.metric} {loss_text(x.loss)} (worst pair {x.pair})"))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(o.trials.items()))
    cost = ("search unknown (the search record has no wall or build times)"
            if o.search_wall_s is None or o.build_s_total is None else
            f"search {o.search_wall_s:.1f} s, builds {o.build_s_total:.1f} s")
    rows.append(("trials", f"{counts} (+{o.confirm_trials} confirmation); {cost}"))
    rows.append(("tuning host", ", ".join(f"{k} {v}" for k, v in sorted(o.tuning_host.items()))
                 or "unknown"))
    rows += conditions_rows(o.conditions, o.conditions_of, o.target, o.target_note)
    rows += [("warning", x) for x in o.warnings]
    return rows


def data_set_rows(o: Overview) -> Rows:
    """The release's data sets, each with its size and digest, and the shipped route's check
    on the hold-out set with its loss."""
    rows: Rows = []
    for i, d in enumerate(o.data_sets):
        unit = "sample(s)" if d.role == "calibration" else "pair(s)"
        name = "hold-out" if d.role == "holdout" else d.role
        rows.append(("data sets" if i == 0 else "",
                     f"{name} {d.size} {unit}, xxh3-128 {d.digest or 'not recorded'}"
                     + (f" (in {d.in_bundle}/)" if d.in_bundle else " (not in the bundle)")))
    c = o.holdout_check
    if c is not None:
        loss = (f"worst {o.metric} loss {loss_text(c.worst_loss)}"
                + (" < " if c.passed else " >= ") + f"{o.threshold:g}"
                if c.worst_loss is not None else "no finite loss")
        rows.append(("hold-out", f"{'passed' if c.passed else 'FAILED'}: {route(c.route)}, "
                                 f"{loss} on {c.pairs} pair(s)"
                                 + (f" ({c.reason})" if c.reason and not c.passed else "")))
        if c.rejected:
            rows.append(("", "failed it, and so did not ship: " + ", ".join(c.rejected)))
    elif o.data_sets and not any(d.role == "holdout" for d in o.data_sets):
        rows.append(("hold-out", "none: no hold-out set checked the shipped route"))
    return rows


def loaded(note: str | None) -> str:
    """What a latency measured busier than the target declares is labelled with."""
    return " (under the measured load)" if note else ""


def of_blocks(note: str | None) -> str:
    """What a speedup read of 10th percentiles (busier than declared) is labelled with."""
    return (" (of each block's 10th percentile: the host was busier than the target declares)"
            if note and "10th percentile" in note else "")


def conditions_rows(c: ConditionsSummary | None, of: str | None, target: str | None = None,
                    note: str | None = None) -> Rows:
    """The declared target beside the host's measured conditions while the decision was
    measured, and one line when they differ (the target's) or the host was busy (older
    bundles)."""
    rows: Rows = [("target", f"declared: {target}")] if target else []
    if c is None:
        return [*rows, ("conditions", "not recorded in this bundle")]
    rows.append(("conditions", f"measured, {of or 'search'}: {c.text()}" if target
                 else f"{of or 'search'}: {c.text()}"))
    if note:
        rows.append(("not comparable", note.split(": ", 1)[1]))
    elif c.busy and target is None:
        rows.append(("busy host", busy_line(c, of)))
    return rows


def busy_line(c: ConditionsSummary, of: str | None) -> str:
    """The one line a decision measured on a busy host gets."""
    return (f"{c.busy} of {c.measurements} measurement(s) of the {of or 'search'} ran while "
            "other processes kept the host busy: a contention-sensitive route (threads, "
            "spinning, execution mode) may win or lose because of it; re-measure with "
            "verify --rebench, or release with timing.quiet_host = \"wait\"")


# ------------------------------------------------------------------------------------- explain
def min_effect_text(h: HeadToHead) -> str:
    """Whether the minimum effect of a gain was reached; a slowdown says so instead."""
    if h.speedup < 1:
        return f"minimum effect {h.min_effect:.0%}: a slowdown ({h.speedup:.3f}x), not a gain"
    return f"minimum effect {h.min_effect:.0%} {'reached' if h.reaches_min_effect else 'not reached'}"


def baseline_line(base: TrialFact) -> str:
    """The summary's baseline figure, named the same in inspect, explain and the HTML."""
    assert base.median_ms is not None
    fig = base.latency.text() if base.latency is not None else f"{base.median_ms:.4g} ms a sample"
    return (f"baseline (trial {base.index}, screening) {fig}; each speedup compares a trial "
            "with the baseline timed alongside it")


def latency_rows(e: Explanation) -> Rows:
    """The shipped route's and the baseline's latency per inference (the confirmation's where
    it measured them), as inspect shows them."""
    rows: Rows = []
    if e.shipped_latency is not None and e.decision.gain:
        rows.append(("shipped", f"{route(e.decision.shipped_route)}  {e.shipped_latency.text()}"
                                f"{loaded(e.target_note)}"))
    if e.baseline_latency is not None:
        rows.append(("baseline", f"{route(e.decision.baseline_route)}  "
                                 f"{e.baseline_latency.text()}{loaded(e.target_note)}"))
    return rows


def effect_verdict(k: OneKnobEffect) -> str:
    """What a one-knob effect's reading says: ``rejected (accuracy)`` for a route the accuracy
    filter rejected (timed all the same, it could never ship, whatever its speed), else the
    verdict (a screening trial's only ever *screened* faster or slower)."""
    from dossier.audit.explain import shown_verdict
    from dossier.trial import Outcome

    if k.outcome is Outcome.REJECTED:
        return "rejected (accuracy)"
    return (k.verdict if k.source == "confirmation"
            else shown_verdict(k.verdict, "search")) or "-"


def knob_effect_source(k: OneKnobEffect) -> str:
    """Where a knob effect's figures come from, as printed beside it."""
    if k.source == "confirmation":
        return ("confirmation" + (f"; screening read {k.screened_speedup:.3f}x"
                                  if k.screened_speedup is not None else ""))
    return "screening only"


def volume_origin(source: str, given: Sequence[str] = ()) -> str:
    """Where the payback's volume came from: inferences/day from --per-day or the spec, and
    horizon and hosts each from its flag or else the spec's [deployment] (or its default)."""
    parts = [f"inferences/day from {'--per-day' if source == 'flags' else 'the spec'}"]
    flagged = [(flag, what) for flag, what in (("--horizon-days", "horizon"), ("--hosts", "hosts"))
               if flag in given]
    parts += [f"{what} from {flag}" for flag, what in flagged]
    rest = [what for flag, what in (("--horizon-days", "horizon"), ("--hosts", "hosts"))
            if flag not in given]
    if rest:
        parts.append(f"{' and '.join(rest)} from the spec's [deployment] or "
                     f"{'their defaults' if len(rest) > 1 else 'its default'}")
    return "; ".join(parts)


def cached_note(n: int) -> str:
    """The build-cache note beside the build time."""
    return (f" ({n} engine(s) from the build cache: built by an earlier search, whose build "
            "time this counts)") if n else ""


def head_to_head_rows(h: HeadToHead) -> Rows:
    """The winner (or best candidate) against the baseline, row by row."""
    from dossier.measure.reading import test_name

    src = (("confirmation: measuring processes of their own, each with the baseline and "
            "its A/A load" if h.processes else
            "independent confirmation: one fresh process per engine")
           if h.source == "confirmation" else "screening: its search trial")
    unit = f"{h.processes} measuring processes" if h.processes else f"{h.rounds or '?'} rounds"
    over = "the A/A load" if h.against == "aa" else "the baseline"
    c, b = h.candidate, h.baseline

    def lat(x: Latency) -> str:
        if x.per_inference is not None:
            return f"{x.per_inference.text()} (n={x.n})"
        return f"median {ci(x.median_ms, x.ci_low_ms, x.ci_high_ms, ' ms', 4)} a sample (n={x.n})"

    rows: Rows = [
        ("candidate", f"{route(h.route)} (trial {h.trial_index})"),
        ("measured", f"{src} (record {h.measured_in})"),
        ("candidate", lat(c)),
        ("baseline", f"{lat(b)}, timed alongside it in record {h.measured_in}"),
        ("speedup", f"{ci(h.speedup, h.speedup_ci_low, h.speedup_ci_high)} over {over} "
                    f"({h.confidence:.0%} interval over {unit}"
                    + (", includes 1.0)" if h.interval_includes_one else ")")),
    ]
    if h.round_ratio_low is not None and h.round_ratio_high is not None:
        rows.append(("rounds", f"each round's ratio between {h.round_ratio_low:.3f}x and "
                               f"{h.round_ratio_high:.3f}x"))
    if h.generation_speedups:
        rows.append(("processes", f"{len(h.generation_speedups)} process generations read "
                     + ", ".join(f"{g:.3f}x" for g in h.generation_speedups)
                     + "; the interval also covers a new generation's reading"))
    if h.process_speedups:
        rows.append(("processes", "each process read "
                     + ", ".join(f"{g:.3f}x" for g in h.process_speedups)
                     + (f"; a new process is expected to read {h.prediction_low:.3f}x to "
                        f"{h.prediction_high:.3f}x ({h.confidence:.0%} prediction interval)"
                        if h.prediction_low is not None and h.prediction_high is not None
                        else "")))
    rows.append(("test", f"{test_name(h.test)}: p={h.p_value:.3g} against alpha={h.alpha:.3g} "
                         f"({'significant' if h.significant else 'not significant'}); "
                         f"{min_effect_text(h)}"))
    if h.verdict:
        rows.append(("verdict", h.verdict))
    return rows


def environment_rows(e: Explanation) -> Rows:
    """The tuning host, row by row (empty when unknown)."""
    env = e.environment
    if env is None:
        return []
    gpus = "; ".join(f"{g.name} (cc {g.compute_capability}, {g.memory_total_mib} MiB, "
                     f"driver {g.driver_version})" for g in env.gpus) or "none"
    return [("host", f"{env.hostname}"),
            ("CPU", f"{env.cpu} ({env.cpu_vendor}), {env.cores} logical / "
                    f"{env.physical_cores} physical cores; {' '.join(env.isa_flags)}"),
            ("OS", f"{env.os}, kernel {env.kernel}, {env.machine}, glibc {env.glibc}"),
            ("Python", env.python),
            ("packages", ", ".join(f"{k} {v}" for k, v in env.packages.items())),
            ("GPU", gpus + (f"; CUDA runtime {env.cuda_runtime}" if env.cuda_runtime else ""))]


def cost_text(e: Explanation) -> str:
    """What the search cost, in one line."""
    c = e.cost
    if e.imported_from:
        return f"unknown: the {e.imported_from} records no wall or build times; {c.trials} trials"
    n = c.recovered_sessions
    recovered = ("" if not n else " (1 killed, its time counted to its last trial)" if n == 1
                 else f" ({n} killed, each one's time counted to its last trial)")
    return (f"search wall time {c.search_wall_s:.1f} s over {c.sessions} session(s){recovered}; "
            f"builds {c.build_s:.1f} s{cached_note(c.cached_builds)}; "
            f"measurement {c.measure_s:.1f} s (confirmation round {c.confirm_s:.1f} s); "
            f"{c.trials} trials + {c.confirm_trials} confirmation{raced_note(c.raced)}")


def raced_note(raced: int) -> str:
    """``; 3 screening trial(s) stopped before their last round (...)`` (empty when none
    did)."""
    return (f"; {raced} screening trial(s) stopped before their last round (raced out below "
            "the confirmation's bar or rejected for accuracy, or ahead: wholly above the bar "
            "and the minimum effect)") if raced else ""


def volume_text(e: Explanation, given: Sequence[str]) -> str:
    """The payback's volume and where it came from."""
    pb = e.payback
    return (f"volume: {pb.inferences_per_day:,.0f} inferences/day on {pb.hosts} host(s), "
            f"horizon {pb.horizon_days:g} days ({volume_origin(pb.source, given)})")


def accuracy_trials(e: Explanation) -> list[TrialFact]:
    """The passing trials whose per-output accuracy is shown: the shipped one, the baseline and
    the best candidate."""
    return [t for t in e.trials if t.role != "confirm" and t.output_losses
            and t.outcome.value == "ok" and (t.shipped or t.role == "baseline"
                                             or (e.head_to_head is not None
                                                 and t.index == e.head_to_head.trial_index))]


def trial_part(e: Explanation, t: TrialFact) -> str:
    """shipped, baseline or candidate."""
    return "shipped" if t.shipped else "baseline" if t.role == "baseline" else "candidate"


# -------------------------------------------------------------------------------------- verify
def finding_groups(r: VerifyReport, show_all: bool) -> list[tuple[list[Finding], Finding]]:
    """The environment's rows: every finding with ``show_all``; otherwise one row for many
    fields with the same verdict and reason ("cannot be compared"), and each changed field
    that stays VALID."""
    from dossier.host.policy import collapse

    if show_all:
        return [([f], f) for f in r.findings]
    return collapse(r.findings) + [([f], f) for f in r.findings
                                   if f.changed and f.verdict.value == "VALID"]


def group_field(group: Sequence[Finding], f: Finding) -> str:
    """The field column of a row: the field, or ``N fields: a, b, ...``."""
    if len(group) > 1:
        return f"{len(group)} fields: " + ", ".join(x.field for x in group)
    return f.field


def environment_title(r: VerifyReport, where: str) -> str:
    """The environment table's title."""
    return f"environment: {r.release} ({r.backend}) on {where}"


def unchanged_line(r: VerifyReport, where: str) -> str:
    """``N of M fields unchanged on HOST``."""
    unchanged = sum(1 for f in r.findings if not f.changed)
    return f"{unchanged} of {len(r.findings)} fields unchanged on {where}"


def recheck_line(rc: Recheck) -> str:
    """The accuracy re-check's result."""
    state = "passed" if rc.passed else "FAILED"
    worst = f"{rc.worst_loss:.3g}" if rc.worst_loss is not None else "-"
    where = " on the hold-out set" if rc.data_set == "holdout" else ""
    return (f"accuracy re-check{where} {state}: worst {rc.metric} loss {worst} "
            f"(threshold {rc.threshold:.3g}, recorded {rc.recorded_worst_loss})"
            + (f": {rc.failure}" if rc.failure else ""))


def rebench_line(rb: Rebench) -> str:
    """The re-timing's result."""
    c = rb.comparison
    spread = c.round_range() if c else None
    n = rb.latency.inferences_per_sample if rb.latency is not None else None
    head = (f"re-timing: shipped {rb.latency.text()}, baseline "
            f"{rb.baseline.median_ms / (n or 1):.4g} ms per inference"
            if rb.latency is not None and n else
            f"re-timing: shipped {rb.shipped.median_ms:.3f} ms a sample, baseline "
            f"{rb.baseline.median_ms:.3f} ms a sample")
    busy = ((f"; target declared: {rb.target}" if rb.target else "")
            + ("" if rb.conditions is None else f"; conditions here: {rb.conditions.text()}"
               + ("" if rb.recorded_conditions is None else
                  f"; when tuned: {rb.recorded_conditions.text()}")))
    return (head
            + (f", {ci(c.speedup, c.speedup_ci_low, c.speedup_ci_high)}" if c else "")
            + (f" (each round's ratio between {spread[0]:.3f}x and {spread[1]:.3f}x)"
               if spread else "")
            + f"; {rb.reason}{busy}")


# ------------------------------------------------------------------------------------- trade
def trade_head(t: Trade) -> list[str]:
    """The trade section's first lines: what the filter rejected, what the hold-out said."""
    lines = [f"{t.rejected_for_accuracy} route(s) rejected by the accuracy filter; the frontier: "
             "admissible routes no other beats on both speed and loss"]
    if t.holdout_pairs is not None:
        lines.append(f"hold-out set: {t.holdout_pairs} pair(s) the search never saw"
                     + (f"; failed there, not shipped: {', '.join(t.holdout_rejected)}"
                        if t.holdout_rejected else ""))
    return lines


def reading_text(p: TradePoint) -> str:
    """Which reading a trade point's speed is, and what the confirmation concluded of it."""
    if p.reading != "confirmed" or p.confirmation in (None, "confirmed"):
        return p.reading
    return f"in the confirmation, not confirmed ({p.confirmation})"


def point_line(t: Trade, p: TradePoint) -> str:
    """One route of the trade as a line of plain text (text and Markdown show the same)."""
    speed = ("not timed" if p.speedup is None else "1.000x (the baseline)"
             if p.reading == "baseline" else
             f"{ci(p.speedup, p.speedup_ci_low, p.speedup_ci_high)} {reading_text(p)}")
    flags = [f for f, on in (("ships", p.shipped), ("frontier", p.frontier),
                             ("rejected: loss >= threshold", p.outcome == "rejected")) if on]
    hold = ""
    if p.holdout_passed is not None:
        hold = (f"; hold-out {loss_text(p.holdout_worst_loss)} "
                f"{'passed' if p.holdout_passed else 'FAILED'}")
    return (f"{route(p.route)}: {speed}; worst {t.metric} loss {loss_text(p.worst_loss)} "
            f"against {t.threshold:g}{hold}" + (f" [{', '.join(flags)}]" if flags else ""))
