"""``dossier explain``: the facts of a decision (winner or "no significant gain" and why, every
rejected trial's reason, knob effects, A/A check, cost), ``--json`` against the model, the
payback arithmetic, and the HTML page's structure. The browser test is test_report_browser.py.

:func:`make_bundle` (a tiny search bundled once per session) is shared with test_diff.py and
test_report_browser.py."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import stat
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_TIMING
from pydantic import ValidationError
from typer.testing import CliRunner

from dossier.audit import Explanation, explain, fit_knob_model, payback
from dossier.audit import explain_search as explain_records
from dossier.audit.payback import saved_ms
from dossier.bundle import open_bundle, write_bundle
from dossier.cache import CacheHeader, DecisionRecord, FileIdentity, SessionRecord, resolve_levels
from dossier.decision import decide as decide_records
from dossier.errors import ExitCode
from dossier.measure.timing import TimingSettings
from dossier.schema import schema_of
from dossier.spec import (
    DeploymentSection,
    ModelSection,
    ReleaseSection,
    ReleaseSpec,
    TuneSection,
    ValidationSection,
    load_spec,
)
from dossier.trial import Comparison, Outcome, TimingSummary, TrialRecord
from dossier.tuner import tune
from dossier_cli.main import app

RUNS = {
    "faulty": dict(backend="faulty", strategy="fast",
                   selection="-fault=[none|nan|raise] -enable_mem_reuse=[on|off]"),
    "convnet": dict(strategy="full", selection="-graph_optimization_level=[all|disable_all]"),
}
"""Tiny searches of the conv-net sample: the faulty one gives a rejected (NaN) and a
build_failed trial and two one-knob-at-a-time trials."""

_MADE: dict[tuple, Path] = {}


def make_bundle(root: Path, samples_dir: Path, key: str, *, name: str | None = None,
                version: int = 1, selection: str | None = None,
                deployment: DeploymentSection | None = None) -> Path:
    """Tune the conv-net sample with RUNS[key] (tiny timing) and bundle it; made once per
    session for the same arguments. Returns the bundle folder; its run folder is beside it."""
    args = (key, name, version, selection, deployment)
    if args in _MADE:
        return _MADE[args]
    run_args = {**RUNS[key], **({"selection": selection} if selection else {})}
    where = root / f"{key}-{len(_MADE)}"
    src = where / "sample"
    shutil.copytree(samples_dir / "convnet", src)
    spec = load_spec(src / "release.toml", run_args)
    release = spec.release.model_copy(update={"name": name or f"convnet-{key}",
                                              "version": version})
    spec = spec.model_copy(update={"timing": TINY_TIMING, "release": release,
                                   "deployment": deployment or spec.deployment})
    tune(spec, where / "run")
    _MADE[args] = write_bundle(where / "run", where / "out").path
    return _MADE[args]


def cli(*args: object, columns: int = 250):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False,
                              env={"COLUMNS": str(columns)})


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    return make_bundle(tmp_path_factory.mktemp("explain"), samples_dir, "faulty")


@pytest.fixture(scope="module")
def convnet(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    return make_bundle(tmp_path_factory.mktemp("explain"), samples_dir, "convnet",
                       deployment=DeploymentSection(inferences_per_day=2e6, horizon_days=30,
                                                    hosts=3))


# ------------------------------------------------------------------------------- real bundles
def test_explain_lists_every_rejected_trial_with_its_reason(faulty: Path) -> None:
    res = cli("explain", faulty)
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    with open_bundle(faulty) as b:
        trials = {t.route: t for t in b.tuning_cache().trials if t.role != "confirm"}
    nan = next(t for r, t in trials.items() if "-fault=nan" in r)
    raised = next(t for r, t in trials.items() if "-fault=raise" in r)
    assert nan.outcome is Outcome.REJECTED and raised.outcome is Outcome.BUILD_FAILED
    assert "Rejected trials (2)" in text
    assert f"#{nan.index} rejected {nan.route}" in text
    for pair in sorted(nan.losses or {}):  # every pair's failing output, from per-pair losses
        assert f"accuracy: {pair}, output 'logits': NaN/Inf in the output" in text
    assert f"#{raised.index} build_failed {raised.route}" in text
    assert "error: injected build failure" in text
    # the structured facts say the same
    facts = Explanation.model_validate_json(cli("explain", faulty, "--json").stdout)
    by = {r.index: r for r in facts.rejected}
    assert set(by) == {nan.index, raised.index}
    assert [(f.pair, f.output, f.loss) for f in by[nan.index].failures] == [
        (p, "logits", None) for p in sorted(nan.losses or {})]
    assert by[nan.index].error is None and by[nan.index].speedup is not None  # timed too
    assert by[raised.index].error == "injected build failure" and not by[raised.index].failures
    assert facts.trial_counts == {"build_failed": 1, "ok": 2, "rejected": 1}


def test_explain_names_the_winner_or_no_gain_and_why(convnet: Path) -> None:
    res = cli("explain", convnet)
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    with open_bundle(convnet) as b:
        s = b.manifest.summary
        baseline = next(t for t in b.tuning_cache().trials if t.role == "baseline")
    if s.gain:
        assert f"ships {s.shipped_route} (trial {s.shipped_index}): {s.result}" in text
        assert "Winner against the baseline" in text
    else:
        assert f"no significant gain: the baseline {s.shipped_route} ships" in text
        assert "Best candidate against the baseline (did not win)" in text
        assert any(why in text for why in ("includes 1.0", "is not below alpha",
                                           "below the minimum effect", "slower",
                                           "not confirmed", "A/A"))
    assert f"why: {s.reason}" in text
    # the best candidate went to the confirmation, whose test is over measuring processes
    assert "Student's t over measuring processes (a candidate: one-sided, against the minimum " \
        "effect): p=" in text
    assert re.search(r"\(n=\d+\)", text)
    assert "Decision rule" in text and s.decision_rule in text
    # A/A check, environment, lineage, cost, payback from the spec's [deployment]
    c = baseline.comparison
    assert c is not None
    assert "A/A check" in text and f"{c.speedup:.3f}x [{c.speedup_ci_low:.3f}" in text
    assert "CPU" in text and "onnxruntime" in text and f"{os.cpu_count()} logical" in text
    assert "parent: none: first release" in text
    assert "search wall time" in text and "builds" in text and "measurement" in text
    assert ("volume: 2,000,000 inferences/day on 3 host(s), horizon 30 days (inferences/day "
            "from the spec; horizon and hosts from the spec's [deployment] or their defaults)"
            in text)


def test_explain_json_validates_against_the_model(faulty: Path) -> None:
    res = cli("explain", faulty, "--json", "--per-day", "1000", "--horizon-days", "7")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    facts = Explanation.model_validate(data)
    with open_bundle(faulty) as b:
        cache = b.tuning_cache()
        assert facts == explain(b, inferences_per_day=1000, horizon_days=7)
        assert facts.lineage.dossier_id == b.manifest.dossier_id
    assert [t.index for t in facts.trials] == [t.index for t in cache.trials]
    assert (facts.payback.source, facts.payback.inferences_per_day,
            facts.payback.horizon_days) == ("flags", 1000, 7)
    assert facts.aa_check is not None and facts.aa_check.trial_index == 0
    assert {(k.knob, k.value) for k in facts.knob_effects} == {("enable_mem_reuse", "off"),
                                                               ("fault", "nan")}
    assert not facts.knob_model.fitted and "admissible trial" in facts.knob_model.note
    assert facts.environment is not None and facts.environment.cores == os.cpu_count()
    # the model is strict: unknown fields are refused, and it is frozen
    with pytest.raises(ValidationError):
        Explanation.model_validate({**data, "surprise": 1})
    with pytest.raises(ValidationError):
        facts.decision.gain = True  # type: ignore[misc]
    schema = schema_of(Explanation)  # the published schema, fields described
    assert schema["properties"]["payback"] and "description" in \
        schema["$defs"]["HeadToHead"]["properties"]["p_value"]


def test_explain_refuses_what_is_not_a_bundle(tmp_path: Path) -> None:
    res = cli("explain", tmp_path / "nothing")
    assert res.exit_code == 6 and "not a bundle" in res.stderr


def test_html_report_is_one_self_contained_page(faulty: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    page = tmp_path / "report.html"
    res = cli("explain", faulty, "--html", page, "--json")
    assert res.exit_code == 0, res.stderr
    assert "wrote" in res.stderr and json.loads(res.stdout)["format"] == "dossier-explanation"
    text = page.read_text()
    found = _Tags()
    found.feed(text)
    with open_bundle(faulty) as b:
        trials = b.tuning_cache().trials
    assert found.rows == [str(t.index) for t in trials]
    assert found.script_src == [] and found.links == []  # nothing fetched from anywhere
    assert found.plot_divs == ["plot-latency", "plot-accuracy", "plot-search", "plot-knobs"]
    assert "Plotly.newPlot" in text and "injected build failure" in text
    # written again: replaced, not refused (make sample runs it on every run)
    assert cli("explain", faulty, "--html", page).exit_code == 0


HOSTILE = "<script>alert('x')</script>\" onmouseover=\"alert(1)"
"""A route, knob, release and host name that would run script if the page did not escape it."""


def test_html_report_escapes_every_fact(faulty: Path) -> None:
    """Names come from the spec, the model and the tuning host: the page shows them as text.
    The hostile page has exactly the tags of the clean one, and the raw string is nowhere in it
    (not in the markup, not in plotly's figure data)."""
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    from dossier.formats.report import render_report, samples_from_timings

    with open_bundle(faulty) as b:
        facts = explain(b)
        samples = samples_from_timings(b.timings())
    env = facts.environment
    assert env is not None and facts.rejected and facts.knob_effects
    hostile = facts.model_copy(update={
        "lineage": facts.lineage.model_copy(update={"release": HOSTILE}),
        "decision": facts.decision.model_copy(update={"reason": HOSTILE,
                                                      "shipped_route": HOSTILE}),
        "trials": [t.model_copy(update={"route": f"{t.route} {HOSTILE}",
                                        "knobs": {**t.knobs, HOSTILE: HOSTILE}})
                   for t in facts.trials],
        "rejected": [r.model_copy(update={"route": HOSTILE, "error": HOSTILE,
                                          "failures": []}) for r in facts.rejected],
        "knob_effects": [k.model_copy(update={"knob": HOSTILE}) for k in facts.knob_effects],
        "environment": env.model_copy(update={"hostname": HOSTILE,
                                              "packages": {HOSTILE: HOSTILE}}),
    })
    clean, page = render_report(facts, samples), render_report(hostile, samples)
    assert HOSTILE not in page and "<script>alert" not in page
    tags, clean_tags = _Tags(), _Tags()
    tags.feed(page)
    clean_tags.feed(clean)
    assert set(tags.all) == set(clean_tags.all)  # no new kind of element or attribute
    assert tags.all.count(("script", ())) == clean_tags.all.count(("script", ()))
    assert not [a for _, names in tags.all for a in names if a.startswith("on")]  # no handler
    text = _Text()
    text.feed(page)
    shown = text.text
    verdict = f"ships {HOSTILE}" if facts.decision.gain else f"the baseline {HOSTILE} ships"
    for where in (f"{HOSTILE} 1: why this route", verdict, f"{HOSTILE} {HOSTILE}"):
        assert where in shown, where  # title, verdict, the table's changed knob, shown as text
    assert shown.count(HOSTILE) >= len(facts.trials) + 2 * len(facts.rejected)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text = ""
        self._skip = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip = tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._skip = False

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text += data


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []
        self.script_src: list[str] = []
        self.links: list[str] = []
        self.plot_divs: list[str] = []
        self.all: list[tuple[str, tuple[str, ...]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.all.append((tag, tuple(sorted(a))))
        if tag == "tr" and "data-trial" in a:
            self.rows.append(a["data-trial"] or "")
        if tag == "script" and a.get("src"):
            self.script_src.append(a["src"] or "")
        if tag in ("link", "img", "iframe"):
            self.links.append(tag)
        if tag == "div" and (a.get("id") or "").startswith("plot-"):
            self.plot_divs.append(a["id"] or "")


# ---------------------------------------------------------------------- synthetic decisions
def _summary(median: float, n: int = 60) -> TimingSummary:
    return TimingSummary(n=n, median_ms=median, ci_low_ms=median * 0.98,
                         ci_high_ms=median * 1.02, mean_ms=median, p10_ms=median * 0.97,
                         p90_ms=median * 1.03, warmup_runs=5)


def explain_search(header: CacheHeader, trials: Sequence[TrialRecord], *args: Any,
                   **kwargs: Any) -> Explanation:
    """:func:`dossier.audit.explain_search` of ``trials`` as the tuning cache's reader gives them
    (the records built here keep no level, as older records did: the reader resolves it)."""
    return explain_records(header, resolve_levels(trials, header.timing.alpha), *args, **kwargs)


def decide(trials: Sequence[TrialRecord], settings: TimingSettings,
           **kwargs: Any) -> DecisionRecord:
    """:func:`dossier.decision.decide` of ``trials`` as the reader gives them."""
    return decide_records(resolve_levels(trials, settings.alpha), settings, **kwargs)


def _trial(index: int, route: str, speedup: float, lo: float, hi: float, p: float, *,
           role: str = "search", outcome: Outcome = Outcome.OK, base_ms: float = 10.0,
           settings: TimingSettings = TimingSettings()) -> TrialRecord:
    significant = p < settings.alpha
    return TrialRecord(
        index=index, route=route, role=role, outcome=outcome,  # type: ignore[arg-type]
        timing=_summary(base_ms / speedup),
        comparison=Comparison(baseline=_summary(base_ms), speedup=speedup, speedup_ci_low=lo,
                              speedup_ci_high=hi, p_value=p, significant=significant,
                              faster=significant and speedup >= 1 + settings.min_effect,
                              slower=significant and speedup <= 1 / (1 + settings.min_effect)),
        worst_loss=1e-6, build_s=2.0, trial_s=5.0, phases_s={"time": 1.5},
        started_at=f"2026-01-01T00:00:{index:02d}+00:00")


def _header(deployment: DeploymentSection | None = None) -> CacheHeader:
    spec = ReleaseSpec(
        release=ReleaseSection(name="synthetic", version=1), model=ModelSection(path="/m.onnx"),
        validation=ValidationSection(path="/v"),
        tune=TuneSection(backend="onnxruntime", selection="-a=[x|y] -b=[p|q]", strategy="fast",
                         metric="linf", threshold=1e-3, atol=0, rtol=0),
        timing=TimingSettings(), deployment=deployment or DeploymentSection())
    return CacheHeader(
        tool_version="0", created_at="2026-01-01T00:00:00+00:00", spec=spec, tuner_version="x",
        knob_db_digest="0" * 32, model=FileIdentity(path="/m.onnx", size=1, digest="0" * 32),
        validation_digest="0" * 32, validation_pairs=4, baseline_route="-a=x -b=p")


SESSION = [SessionRecord(started_at="2026-01-01T00:00:00+00:00", wall_s=600.0, trials_run=3,
                         interrupted=False)]


def test_no_significant_gain_is_explained_with_its_reason(capsys: pytest.CaptureFixture) -> None:
    """An A/A-like search: the one candidate's interval includes 1.0 and p is large."""
    trials = [_trial(0, "-a=x -b=p", 1.004, 0.99, 1.02, 0.61, role="baseline"),
              _trial(1, "-a=y -b=p", 1.01, 0.97, 1.05, 0.40),
              _trial(2, "-a=x -b=q", 0.999, 0.96, 1.03, 0.93)]
    decision = decide(trials, TimingSettings())
    assert not decision.gain
    e = explain_search(_header(), trials, SESSION, decision)
    assert e.decision.result == "no significant gain" and e.decision.shipped_index == 0
    h = e.head_to_head
    assert h is not None and not h.shipped and h.route == "-a=y -b=p"
    assert h.interval_includes_one and not h.significant and not h.reaches_min_effect
    why = " | ".join(e.decision.why_not)
    assert "[0.970, 1.050] includes 1.0" in why
    assert "p=0.4 is not below 0.05" in why and "below the minimum effect of 2%" in why
    assert e.payback.cases == [] and e.payback.verdict.startswith("never: there is no "
                                                                  "significant gain")
    assert e.runner_up is not None and e.runner_up.route == "-a=y -b=p"
    from dossier_cli.cmd_explain import render_explanation

    render_explanation(e)
    text = capsys.readouterr().out
    assert "no significant gain: the baseline -a=x -b=p ships" in text
    assert "includes 1.0" in text and "not significant" in text
    assert "never: there is no significant gain" in text


def test_the_spread_of_the_round_ratios_is_shown(capsys: pytest.CaptureFixture) -> None:
    """A gain whose rounds disagree (a launch-bound baseline on a host that switches state):
    explain gives the smallest and largest per-round ratio beside the estimate, in the text and
    on the HTML page; a record without round ratios shows no such line."""
    from dossier.formats.report import render_report
    from dossier_cli.cmd_explain import render_explanation

    trials = [_trial(0, "-a=x -b=p", 1.0, 0.98, 1.02, 0.9, role="baseline"),
              _trial(1, "-a=y -b=p", 3.0, 2.6, 3.5, 1e-4)]
    ratios = [2.42, 2.45, 3.84, 3.9, 2.5, 3.8, 3.85, 2.44, 3.83, 3.86]
    assert trials[1].comparison is not None
    trials[1] = trials[1].model_copy(update={"comparison": trials[1].comparison.model_copy(
        update={"round_ratios": ratios, "rounds": len(ratios),
                "generation_speedups": [2.45, 3.84, 2.5]})})
    e = explain_search(_header(), trials, SESSION, decide(trials, TimingSettings()))
    h = e.head_to_head
    assert h is not None and (h.round_ratio_low, h.round_ratio_high) == (2.42, 3.9)
    render_explanation(e)
    out = capsys.readouterr().out
    assert "each round's ratio between 2.420x and 3.900x" in out
    assert "3 process generations read 2.450x, 3.840x, 2.500x" in out
    page = render_report(e, {})
    assert "each round&#39;s ratio between 2.420x and 3.900x" in page \
        or "each round's ratio between 2.420x and 3.900x" in page
    assert "3 process generations read 2.450x, 3.840x, 2.500x" in page
    plain = explain_search(_header(), trials[:1] + [_trial(1, "-a=y -b=p", 3.0, 2.6, 3.5, 1e-4)],
                           SESSION, decide(trials, TimingSettings()))
    assert plain.head_to_head is not None and plain.head_to_head.round_ratio_low is None
    render_explanation(plain)
    out = capsys.readouterr().out
    assert "each round's ratio" not in out and "process generations" not in out


def test_a_confirmed_gain_is_explained_from_the_confirmation() -> None:
    s = TimingSettings()
    trials = [_trial(0, "-a=x -b=p", 1.0, 0.98, 1.02, 0.9, role="baseline"),
              _trial(1, "-a=y -b=p", 1.30, 1.22, 1.38, 1e-6),          # screened faster
              _trial(2, "-a=x -b=q", 1.10, 1.06, 1.15, 1e-4),          # screened faster
              _trial(3, "-a=y -b=p", 1.25, 1.20, 1.31, 1e-7, role="confirm"),
              _trial(4, "-a=x -b=q", 1.08, 1.04, 1.12, 1e-3, role="confirm")]
    round_start = {"started_at": trials[3].started_at}  # one confirmation round, one process
    trials[4] = trials[4].model_copy(update=round_start)
    decision = decide(trials, s)
    assert decision.gain and decision.shipped_route == "-a=y -b=p"
    e = explain_search(_header(deployment=DeploymentSection(inferences_per_day=1000,
                                                            horizon_days=90, hosts=2)),
                       trials, SESSION, decision)
    h = e.head_to_head
    assert h is not None and h.shipped and h.source == "confirmation" and h.measured_in == 3
    assert h.trial_index == 1 and h.alpha == pytest.approx(0.025)  # alpha / k, k = 2
    assert (h.speedup, h.speedup_ci_low, h.speedup_ci_high) == (1.25, 1.20, 1.31)
    assert h.candidate.median_ms == pytest.approx(8.0) and h.baseline.n == 60
    r = e.runner_up
    assert r is not None and r.route == "-a=x -b=q" and r.source == "confirmation"
    assert r.margin == pytest.approx(1.25 / 1.08 - 1)
    assert e.trial_counts == {"ok": 3} and e.confirm_trials == 2 and e.decision.why_not == []
    assert e.cost.build_s == 6.0 and e.cost.measure_s == pytest.approx(3 * 1.5 + 5.0)
    assert e.cost.search_wall_s == 600.0
    one = {(k.knob, k.value): k for k in e.knob_effects}
    assert set(one) == {("a", "y"), ("b", "q")} and one[("a", "y")].verdict == "faster"
    assert one[("a", "y")].baseline_value == "x" and one[("a", "y")].trial_index == 1
    # payback from the spec's volume: 1000/day on 2 hosts, baseline median 10 ms a pass over
    # the 4 validation pairs: 2.5 ms per inference, as every latency is printed
    p = e.payback
    assert p.source == "spec" and p.baseline_median_ms == pytest.approx(2.5)
    assert p.baseline_median_ms == pytest.approx(h.baseline.median_ms / 4)
    measured = next(c for c in p.cases if c.case == "measured")
    assert measured.saved_ms == pytest.approx(2.5 - 2.5 / 1.25)  # 0.5 ms
    assert measured.inferences == pytest.approx(600_000 / 0.5)  # 1,200,000 inferences
    assert measured.days == pytest.approx(600)  # 1,200,000 / 2,000 a day: beyond 90 days
    best = next(c for c in p.cases if c.case == "best")  # 1.31x: 0.592 ms
    assert best.inferences == pytest.approx(600_000 / (2.5 - 2.5 / 1.31))
    assert best.days == pytest.approx(best.inferences / 2000) and not best.within_horizon
    assert "does not pay back within the 90-day horizon, even in the best case" in p.verdict


def test_knob_model_recovers_known_effects() -> None:
    """Full 3 x 2 factorial with multiplicative effects a=y: 1.5x, a=z: 0.8x, b=q: 1.2x."""
    factor = {"x": 1.0, "y": 1.5, "z": 0.8, "p": 1.0, "q": 1.2}
    noise = [0.004, -0.003, 0.002, -0.001, 0.003, -0.005]
    trials, values = [], {}
    for i, (a, b) in enumerate([(a, b) for a in "xyz" for b in "pq"]):
        s = factor[a] * factor[b] * math.exp(noise[i])
        trials.append(_trial(i, f"-a={a} -b={b}", s, s * 0.95, s * 1.05, 1e-3,
                             role="baseline" if i == 0 else "search"))
        values[i] = {"a": a, "b": b}
    m = fit_knob_model(trials, values, trials[0])
    assert m.fitted and m.trials == 6 and m.parameters == 4
    got = {(x.knob, x.value): x for x in m.effects}
    assert set(got) == {("a", "y"), ("a", "z"), ("b", "q")}
    for key, want in ((("a", "y"), 1.5), (("a", "z"), 0.8), (("b", "q"), 1.2)):
        x = got[key]
        assert x.speed_factor == pytest.approx(want, rel=0.01)
        assert x.ci_low < want < x.ci_high and x.ci_high / x.ci_low < 1.1
        assert x.reference == {"a": "x", "b": "p"}[key[0]]
    assert m.r_squared is not None and m.r_squared > 0.99
    # too few trials: not fitted, and says why
    small = fit_knob_model(trials[:3], values, trials[0])
    assert not small.fitted and "at least" in small.note and small.effects == []
    # confounded: a and b always change together
    together = [trials[0], trials[3], _trial(6, "-a=x -b=p", 1.0, 0.9, 1.1, 0.5),
                _trial(7, "-a=y -b=q", 1.8, 1.7, 1.9, 1e-3),
                _trial(8, "-a=x -b=p", 1.01, 0.9, 1.1, 0.5)]
    vals = {0: {"a": "x", "b": "p"}, 3: {"a": "y", "b": "q"}, 6: {"a": "x", "b": "p"},
            7: {"a": "y", "b": "q"}, 8: {"a": "x", "b": "p"}}
    conf = fit_knob_model(together, vals, trials[0])
    assert not conf.fitted and "confounded" in conf.note


# ------------------------------------------------------------------------------------ payback
def test_payback_arithmetic_by_hand() -> None:
    # baseline 30 ms a pass over 3 pairs (10 ms per inference); speedup 1.25 [1.1, 1.5];
    # search 600 s; 1000 a day on 2 hosts; 90 days
    p = payback(tuning_s=600, gain=True, baseline_median_ms=30.0, speedup=1.25,
                speedup_ci_low=1.1, speedup_ci_high=1.5, inferences_per_day=1000,
                horizon_days=90, hosts=2, source="spec", inferences_per_sample=3)
    c = {x.case: x for x in p.cases}
    # best: 10 - 10/1.5 = 3.333 ms; 600,000 ms / 3.333 = 180,000 inferences; / 2,000 = 90 days
    assert c["best"].saved_ms == pytest.approx(10 / 3)
    assert c["best"].inferences == pytest.approx(180_000)
    assert c["best"].days == pytest.approx(90) and c["best"].within_horizon
    # measured: 2 ms; 300,000 inferences; 150 days: beyond the horizon
    assert c["measured"].saved_ms == pytest.approx(2.0)
    assert c["measured"].inferences == pytest.approx(300_000)
    assert c["measured"].days == pytest.approx(150) and not c["measured"].within_horizon
    # worst: 10 - 10/1.1 = 0.90909 ms; 660,000 inferences; 330 days
    assert c["worst"].saved_ms == pytest.approx(10 / 11)
    assert c["worst"].inferences == pytest.approx(660_000)
    assert c["worst"].days == pytest.approx(330)
    # net over the horizon: 2 ms * 2,000/day * 90 days = 360 s saved - 600 s spent
    assert c["measured"].net_saving_s == pytest.approx(360 - 600)
    assert p.baseline_median_ms == pytest.approx(10.0)
    assert "a timing sample (3 inference(s)) divided by 3" in p.unit
    assert "at the measured speedup it does not pay back within the 90-day horizon" in p.verdict
    assert saved_ms(8.0, 2.0) == 4.0


def test_payback_says_plainly_when_it_never_pays_back() -> None:
    kw = dict(tuning_s=100.0, baseline_median_ms=4.0, inferences_per_day=1e6, horizon_days=10)
    none = payback(gain=False, speedup=None, speedup_ci_low=None, speedup_ci_high=None, **kw)
    assert none.cases == [] and none.verdict.startswith("never: there is no significant gain")
    # lower end at 1: the worst case saves nothing
    p = payback(gain=True, speedup=1.05, speedup_ci_low=0.99, speedup_ci_high=1.12, **kw)
    worst = next(x for x in p.cases if x.case == "worst")
    assert worst.saved_ms < 0 and worst.inferences is None and worst.days is None
    assert not worst.within_horizon
    assert "never in the worst case" in p.verdict and "not above 1" in p.verdict
    # horizon too short even in the best case: 4 - 4/1.001 ms saved = 0.004 ms
    slow = payback(gain=True, speedup=1.001, speedup_ci_low=1.0005, speedup_ci_high=1.001,
                   tuning_s=100.0, baseline_median_ms=4.0, inferences_per_day=1000,
                   horizon_days=10)
    assert all(not x.within_horizon for x in slow.cases)
    assert "does not pay back within the 10-day horizon, even in the best case" in slow.verdict
    # no volume: inference counts, no days, and what to set
    nov = payback(gain=True, speedup=1.25, speedup_ci_low=1.1, speedup_ci_high=1.5,
                  tuning_s=600, baseline_median_ms=10.0)
    assert nov.source == "none" and all(x.days is None for x in nov.cases)
    assert "--per-day" in nov.verdict and "180,000 inferences" in nov.verdict


def test_nothing_admissible_is_said_so() -> None:
    trials = [_trial(0, "-a=x -b=p", 1.0, 0.98, 1.02, 0.8, role="baseline"),
              _trial(1, "-a=y -b=p", 1.4, 1.3, 1.5, 1e-6, outcome=Outcome.REJECTED)]
    trials[1] = trials[1].model_copy(update={
        "reason": "pair-001: output 'y' linf loss 0.02 >= threshold 0.001",
        "losses": {"pair-000": {"y": 1e-4}, "pair-001": {"y": 0.02}}, "worst_loss": 0.02})
    decision = decide(trials, TimingSettings())
    e = explain_search(_header(), trials, SESSION, decision)
    assert not e.decision.gain and e.decision.why_not == ["no other route was admissible"]
    assert e.head_to_head is None and e.runner_up is None
    (r,) = e.rejected
    assert [(f.pair, f.output, f.loss) for f in r.failures] == [("pair-001", "y", 0.02)]
    assert r.speedup == 1.4  # a rejected route is timed too, and its speed is shown
    assert not e.knob_model.fitted


# ------------------------------------------------------------ one story of the numbers
def test_one_baseline_figure_and_per_output_losses_everywhere(convnet: Path,
                                                               tmp_path: Path) -> None:
    """inspect, explain, explain --json and the HTML name the same baseline figure (per
    inference, the confirmation's reading where it ran) and show the passing routes' losses
    per output (worst pair)."""
    from dossier.measure.latency import of_route

    with open_bundle(convnet) as b:
        trials = b.tuning_cache().trials
        s = b.manifest.summary
    base = next(t for t in trials if t.role == "baseline")
    assert base.timing is not None and base.losses
    lat = of_route(trials, s.baseline_route, s.baseline_route, s.per_sample)
    assert lat is not None and "ms per inference" in lat.text()
    figure = lat.text()
    shipped = next(t for t in trials if t.index == s.shipped_index and t.role != "confirm")
    worst_pair = max(shipped.losses, key=lambda p: shipped.losses[p]["logits"])  # type: ignore[index,union-attr]
    worst = shipped.losses[worst_pair]["logits"]  # type: ignore[index]
    inspect = cli("inspect", convnet).stdout
    assert figure in inspect
    assert f"losses       logits: linf {worst:.3g} (worst pair {worst_pair})" in inspect
    text = cli("explain", convnet).stdout
    assert figure in text
    assert "per output, worst pair" in text and f"logits: {worst:.3g} ({worst_pair};" in text
    facts = Explanation.model_validate_json(cli("explain", convnet, "--json").stdout)
    row = next(t for t in facts.trials if t.index == shipped.index)
    assert [(x.output, x.loss, x.pair) for x in row.output_losses] == [
        ("logits", worst, worst_pair)]
    for t in facts.trials:  # each trial's own paired baseline beside its median
        rec = next(r for r in trials if r.index == t.index)
        if rec.comparison is not None:
            assert t.baseline_median_ms == rec.comparison.baseline.median_ms
            # the speedup is the paired estimate over rounds (not the ratio of the two medians),
            # the same figure the record and the verdict use, inside its own interval
            assert t.speedup == pytest.approx(rec.comparison.speedup)
            assert rec.comparison.speedup_ci_low <= t.speedup <= rec.comparison.speedup_ci_high
    if importlib.util.find_spec("plotly") is not None:
        page = tmp_path / "r.html"
        assert cli("explain", convnet, "--html", page).exit_code == 0
        html = page.read_text()
        assert "Accuracy of the passing routes" in html and worst_pair in html
        assert "median of the baseline timed alongside" in html
        assert figure in html and "ms per inference" in html


def test_verdict_follows_from_the_interval_printed(capsys: pytest.CaptureFixture) -> None:
    """The case from the field: a route whose median is below the summary baseline's, whose
    own paired baseline was faster still (0.759x), with an interval including 1.0 and a rank
    test p of 3.2e-05. Nothing may call it significantly slower next to that interval."""
    from dossier_cli.cmd_explain import render_explanation

    base = _trial(0, "-a=x -b=p", 1.0, 0.98, 1.02, 0.7, role="baseline", base_ms=0.555)
    odd = _trial(1, "-a=y -b=p", 0.759, 0.657, 1.157, 3.2e-05, base_ms=0.41)
    assert odd.comparison is not None and odd.comparison.slower  # as an older rule recorded it
    decision = decide([base, odd], TimingSettings())
    assert "slower" not in decision.reason and "includes 1.0" in decision.reason
    e = explain_search(_header(), [base, odd], SESSION, decision)
    assert e.head_to_head is not None
    assert e.head_to_head.verdict.startswith("no significant effect: its interval "
                                             "[0.657, 1.157] includes 1.0")
    assert e.decision.why_not == ["its interval [0.657, 1.157] includes 1.0"]
    row = e.trials[1]
    assert row.baseline_median_ms == pytest.approx(0.41) and row.verdict == "no significant effect"
    render_explanation(e)
    text = capsys.readouterr().out
    assert "slower" not in text.replace("slowdown", "")
    assert "verdict    no significant effect" in text
    # a clear slowdown is still called one, with the figures
    slow = _trial(1, "-a=y -b=p", 0.70, 0.66, 0.74, 1e-6)
    e = explain_search(_header(), [base, slow], SESSION, decide([base, slow], TimingSettings()))
    assert e.decision.why_not[0].startswith("it was slower than the baseline (0.700x "
                                            "[0.660, 0.740], p=1e-06")


def test_trial_line_shows_the_paired_baseline() -> None:
    from dossier_cli.progress import trial_line

    t = _trial(1, "-a=y -b=p", 0.70, 0.66, 0.74, 1e-6, base_ms=0.41)
    line = trial_line(t)
    assert f"{0.41 / 0.70:8.4g} ms/inference" in line and "vs 0.41 baseline alongside" in line
    per = trial_line(t, inferences=4)  # a sample is a pass over 4 inputs
    assert f"{0.41 / 0.70 / 4:8.4g} ms/inference" in per
    assert "0.700x [0.660, 0.740]" in line and "slower" in line


def test_the_aa_check_is_the_one_the_decision_recorded(capsys: pytest.CaptureFixture) -> None:
    """An older bundle: its A/A read 1.015x (p=0.001), significant but below today's minimum
    effect of 2%, and the rule it was decided by stopped the release at that. explain reports
    the reading the decision recorded (the A/A stopped it), in the text and on the HTML page,
    not a re-judgment by today's rule ("as expected"); a decision that recorded no A/A reading
    is judged by today's rule."""
    from dossier.formats.report import render_report
    from dossier_cli.cmd_explain import render_explanation

    s = TimingSettings()
    base = _trial(0, "-a=x -b=p", 1.015, 1.008, 1.022, 0.001, role="baseline")
    assert base.comparison is not None
    base = base.model_copy(update={"comparison": base.comparison.model_copy(
        update={"rounds": 16})})
    trials = [base, _trial(1, "-a=y -b=p", 1.05, 1.03, 1.07, 1e-4),
              _trial(2, "-a=x -b=q", 0.99, 0.96, 1.03, 0.7)]
    today = decide(trials, s)
    assert today.aa is not None and not today.aa.significant  # today's rule: below 2%
    then = resolve_levels([base], s.alpha)[0].reading()  # the older rule: any significant A/A
    assert then is not None and then.significant
    reason = (f"no significant gain: the A/A check (the baseline against a second load of "
              f"itself) read {then.text()}, a significant difference between two loads of the "
              f"same engine: the timing procedure is biased on this host by about that much, "
              f"so no gain of that size can be trusted; the baseline ships")
    old = today.model_copy(update={
        "aa": then, "reason": reason, "gain": False, "shipped_route": base.route,
        "shipped_index": 0, "speedup": None, "speedup_ci_low": None, "speedup_ci_high": None,
        "p_value": None, "candidates": [], "aa_stops": True})
    e = explain_search(_header(), trials, SESSION, old)
    a = e.aa_check
    assert a is not None and a.significant and a.trial_index == 0 and a.rounds == 16
    assert (a.speedup, a.speedup_ci_low, a.speedup_ci_high, a.p_value) == (
        1.015, 1.008, 1.022, 0.001)
    assert a.verdict.startswith("significant") and "nothing ships" in a.verdict
    assert "as expected" not in a.verdict and "minimum effect of 2%" in a.verdict
    render_explanation(e)
    text = capsys.readouterr().out
    assert "A/A check" in text and "1.015x [1.008, 1.022] p=0.001, 16 rounds: significant" in text
    assert "as expected: no significant difference" not in text
    page = render_report(e, {})
    assert "1.015x [1.008, 1.022], p=0.001, 16 rounds: significant" in page
    assert "as expected: no significant difference" not in page
    # the same A/A under today's decision: recorded as not significant, and never a veto
    now = explain_search(_header(), trials, SESSION, today).aa_check
    assert now is not None and not now.significant
    assert now.verdict.startswith("as expected") and "the confirmation decides" in now.verdict
    # a reading recorded for another trial or round set is not this check's; nor is none
    for other in (then.model_copy(update={"rounds": 8}), None):
        check = explain_search(_header(), trials, SESSION,
                               old.model_copy(update={"aa": other})).aa_check
        assert check is not None and not check.significant and "as expected" in check.verdict


def _confirmed(route: tuple[float, float, float, float],
               aa: tuple[float, float, float, float]) -> list[TrialRecord]:
    """A baseline, a route that screened 1.30x faster, then the confirmation's readings of the
    route and of the A/A (speedup, interval, p)."""
    return [_trial(0, "-a=x -b=p", 1.0, 0.98, 1.02, 0.9, role="baseline"),
            _trial(1, "-a=y -b=p", 1.30, 1.22, 1.38, 1e-6),
            _trial(2, "-a=y -b=p", *route, role="confirm"),
            _trial(3, "-a=x -b=p", *aa, role="confirm")]


def test_the_cache_reader_resolves_the_level_of_older_records_once(tmp_path: Path) -> None:
    """Records written before the level was kept get theirs when the tuning cache is read:
    screening readings and the confirmation's A/A alpha, each of the confirmation's k
    candidates alpha / k (the A/A not among them); a reading that keeps its level keeps it."""
    from dossier.cache import TuningCache

    header = _header()
    alpha = header.timing.alpha
    trials = [*_confirmed((1.25, 1.20, 1.31, 1e-7), (0.985, 0.978, 0.992, 0.002)),
              _trial(4, "-a=x -b=q", 1.1, 1.0, 1.2, 0.01, role="confirm")]
    kept = trials[4].comparison
    assert kept is not None
    trials[4] = trials[4].model_copy(update={"comparison": kept.model_copy(
        update={"level": 0.0123})})
    cache = TuningCache.create(tmp_path / "cache.jsonl", header)
    for t in trials:
        cache.append(t)
    assert '"level":null' in (tmp_path / "cache.jsonl").read_text().splitlines()[2]
    read = TuningCache.open(tmp_path / "cache.jsonl").trials
    assert [t.comparison.level for t in read if t.comparison] == [
        alpha, alpha, alpha / 2, alpha, 0.0123]


def test_the_confirmation_aa_check_is_the_one_the_decision_recorded() -> None:
    """The same for the confirmation's A/A: 0.985x (p=0.002) stopped an older release."""
    s = TimingSettings()
    trials = _confirmed((1.25, 1.20, 1.31, 1e-7), (0.985, 0.978, 0.992, 0.002))
    today = decide(trials, s)
    assert today.gain and today.confirm_aa is not None and not today.confirm_aa.significant
    then = resolve_levels(trials, s.alpha)[3].reading()
    assert then is not None and then.significant
    old = today.model_copy(update={"confirm_aa": then, "gain": False, "aa_stops": True})
    e = explain_search(_header(), trials, SESSION, old)
    c = e.confirm_aa_check
    assert c is not None and c.trial_index == 3 and c.significant
    assert c.verdict.startswith("significant") and "nothing ships" in c.verdict
    # the route read faster and did not ship: the why-not names what stopped it
    assert e.decision.why_not == [f"the confirmation's A/A read {then.text()}, which stops the "
                                  "release"]
    now = explain_search(_header(), trials, SESSION, today).confirm_aa_check
    assert now is not None and not now.significant and now.verdict.startswith("as expected")
    assert "the confirmation decides" in now.verdict


def test_why_not_names_the_aa_reading_a_faster_route_did_not_clear(
        capsys: pytest.CaptureFixture) -> None:
    """An older bundle: a route confirmed 1.25x [1.10, 1.40] faster, but the confirmation's A/A
    reached 1.15 at its upper end, and the rule it was decided by shipped nothing for that.
    explain's why-not says so, not merely "not confirmed"."""
    s = TimingSettings()
    trials = _confirmed((1.25, 1.10, 1.40, 1e-4), (1.02, 0.90, 1.15, 0.6))
    d = decide(trials, s).model_copy(update={
        "gain": False, "shipped_route": "-a=x -b=p", "shipped_index": 0, "speedup": None,
        "speedup_ci_low": None, "speedup_ci_high": None, "p_value": None, "aa_stops": True,
        "runner_up_route": "-a=y -b=p",
        "reason": "no significant gain: its interval does not clear the confirmation A/A "
                  "reading's upper end 1.150; the baseline ships"})
    e = explain_search(_header(), trials, SESSION, d)
    assert e.decision.why_not == ["its interval's lower end 1.100 does not clear the "
                                  "confirmation A/A reading's upper end 1.150"]
    from dossier.formats.report import render_report
    from dossier_cli.cmd_explain import render_explanation

    render_explanation(e)  # the runner-up's margin is the baseline's, which ships, against
    # the confirmation's reading of it (1.25x), not the screening one
    text = capsys.readouterr().out
    assert "does not clear the confirmation A/A reading's upper end 1.150" in text
    assert "the baseline, which ships, is -20.0% against it (1.000x vs 1.250x)" in text
    assert "the baseline, which ships, is -20.0%" in render_report(e, {})
    # today's rule: the same readings ship the route (no A/A interval to clear)
    assert decide(trials, s).gain


def test_the_shipped_routes_confirmation_row_is_judged_at_its_own_level() -> None:
    """explain counted the A/A route in Bonferroni's k, so the shipped route's confirmation row
    read "no significant effect" in explain --json and the HTML table. Built through the
    production judge: the row's verdict is the decision's."""
    from _records import confirmed, screened

    s = TimingSettings()
    trials = [screened(0, "-a=x -b=p", 1.0, s, role="baseline"),
              screened(1, "-a=y -b=p", 1.3, s)]
    full, _ = confirmed(trials, s, {"-a=y -b=p": 1.3})
    d = decide(full, s)
    assert d.gain
    # p of the shipped route's reading between level/2 (what k=2 would judge at) and level
    full = [t if not (t.role == "confirm" and t.route == "-a=y -b=p") or t.comparison is None
            else t.model_copy(update={"comparison": t.comparison.model_copy(
                update={"p_value": 0.75 * (t.comparison.level or 0)})}) for t in full]
    e = explain_search(_header(), full, SESSION, decide(full, s))
    row = next(t for t in e.trials if t.role == "confirm" and t.route == "-a=y -b=p")
    assert row.verdict == "faster"
    assert e.head_to_head is not None and e.head_to_head.alpha == pytest.approx(
        s.look_level(1)) and e.head_to_head.processes == s.confirm_processes


def test_explain_html_into_a_folder_and_file_mode(convnet_bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    folder = tmp_path / "reports"
    folder.mkdir()
    r = cli("explain", convnet_bundle, "--html", folder)
    assert r.exit_code == ExitCode.OUTPUT and "is a folder" in r.output
    assert list(folder.iterdir()) == [] and list(tmp_path.iterdir()) == [folder]
    old = os.umask(0o022)
    try:
        assert cli("explain", convnet_bundle, "--html", folder / "r.html").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((folder / "r.html").stat().st_mode) == 0o644
    assert [p.name for p in folder.iterdir()] == ["r.html"]


def test_explain_payback_says_where_each_figure_came_from(convnet_bundle: Path) -> None:
    text = " ".join(cli("explain", convnet_bundle, "--per-day", "1000",
                        columns=300).output.split())
    assert ("(inferences/day from --per-day; horizon and hosts from the spec's [deployment] or "
            "their defaults)") in text
    text = " ".join(cli("explain", convnet_bundle, "--per-day", "1000", "--hosts", "2",
                        columns=300).output.split())
    assert ("(inferences/day from --per-day; hosts from --hosts; horizon from the spec's "
            "[deployment] or its default)") in text


def test_a_killed_run_is_recovered_from_its_finished_trials_times(tmp_path: Path) -> None:
    """The trials after the last session record belong to a run killed before it wrote its
    own: its record spans the header's time (no session before it) or its first trial's
    start, to its last trial's end, never past now; crafted times move only that span."""
    import datetime as dt

    from dossier.cache import TuningCache, lost_session
    from dossier.formats.figures import cost_text

    now = dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.timezone.utc)
    trials = [_trial(i, "-a=x -b=p" if i == 0 else "-a=y -b=p", 1.0, 0.99, 1.01, 0.5,
                     role="baseline" if i == 0 else "search") for i in range(3)]
    first = TuningCache(tmp_path / "c", _header(), list(trials))
    lost = lost_session(first, now)  # the header at 00:00:00, the last trial 00:00:02 + 5 s
    assert lost is not None and lost.recovered and lost.interrupted
    assert (lost.started_at, lost.wall_s, lost.trials_run) == ("2026-01-01T00:00:00+00:00", 7.0, 3)
    assert lost_session(TuningCache(tmp_path / "c", _header(), [*trials, lost]), now) is None
    later = [t.model_copy(update={"index": 3 + i, "started_at": f"2026-01-01T00:05:0{i}+00:00"})
             for i, t in enumerate(trials[1:])]
    second = lost_session(TuningCache(tmp_path / "c", _header(), [*trials, lost, *later]), now)
    assert second is not None and (second.started_at, second.wall_s, second.trials_run) == \
        ("2026-01-01T00:05:00+00:00", 6.0, 2)
    crafted = [later[0].model_copy(update={"started_at": "9999-01-01T00:00:00+00:00"}),
               later[1].model_copy(update={"started_at": "not a time"})]
    for bad in (float("nan"), float("inf"), -5.0, 1e300):  # durations no timedelta takes
        odd = [t.model_copy(update={"trial_s": bad}) for t in later]
        got = lost_session(TuningCache(tmp_path / "c", _header(), [*trials, lost, *odd]), now)
        assert got is not None and 0.0 <= got.wall_s <= 600.0
    far = lost_session(TuningCache(tmp_path / "c", _header(), [*trials, lost, *crafted]), now)
    assert far is not None and far.wall_s == 0.0  # capped at now, never negative
    sessions = [*SESSION, lost]
    cost = explain_search(_header(), trials, sessions, decide(trials, TimingSettings())).cost
    assert (cost.sessions, cost.recovered_sessions) == (2, 1)
    assert "over 2 session(s) (1 killed, its time counted to its last trial)" in \
        cost_text(explain_search(_header(), trials, sessions, decide(trials, TimingSettings())))
    twice = [*sessions, lost.model_copy(update={"started_at": "2026-01-01T00:06:00+00:00"})]
    assert "over 3 session(s) (2 killed, each one's time counted to its last trial)" in \
        cost_text(explain_search(_header(), trials, twice, decide(trials, TimingSettings())))
