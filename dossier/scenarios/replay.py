"""The scenario replayed on a bundle: ``dossier run --scenario`` (a smoke test after a rollout:
one LoadGen run at the lowest rate the release met in its repetitions; :mod:`dossier.scenarios.smoke`) and
``verify --rebench`` (the bounded search
again, the highest rate met here judged against what the release recorded).

The engine is served the production way: a child process loads the bundle with
:func:`dossier.serve.opened` (verified again there), once per session its shipped route names.
The recorded figures come from the bundle's ``scenario/decision.json``, validated when read
(:func:`dossier.scenarios.evidence.read_decision`).

Judging the replayed metric (``verify --rebench``): the recorded repetitions of the shipped
configuration give a prediction interval for one new repetition (Student's t over their logs,
:func:`dossier.measure.timing.process_stats`); a rate met here below its lower end is a
regression. With one recorded repetition, a rate more than :data:`MOVED` below it is.
LoadGen's own VALID/INVALID is reported as LoadGen's.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from dossier.scenarios.child import ScenarioRequest
from dossier.scenarios.evidence import recorded
from dossier.scenarios.models import RunSettings, ScenarioDecision, ScenarioResult
from dossier.scenarios.search import serve_configuration

MOVED = 0.10
"""With a single recorded repetition: a rate met here more than this share below it is a
regression."""


class Replay(BaseModel):
    """The scenario replayed here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: str
    """The scenario, in one line."""
    recorded_qps: list[float]
    """The shipped configuration's metric in each recorded repetition."""
    here: ScenarioResult
    """What LoadGen measured here."""
    predict_low: float | None
    """The lowest rate a new repetition is expected to meet (None: nothing recorded)."""
    regression: bool
    """The rate met here is below what the release recorded (see the module's rule)."""
    text: str
    """One line for people."""


def _shipped(decision: ScenarioDecision) -> list[float]:
    return list(decision.reading(decision.shipped).metric_qps)


def predict_low(recorded: list[float], confidence: float = 0.95) -> float | None:
    """The lower end of the prediction interval for one new repetition's metric."""
    met = [q for q in recorded if q > 0]
    if not met:
        return None
    if len(met) < 2:
        return met[0] * (1 - MOVED)
    from dossier.measure.timing import process_stats

    st = process_stats([math.log(q) for q in met], confidence)
    return math.exp(st.predict_low)


def replay(source: str, decision: ScenarioDecision, *, search: bool,
           verify: dict[str, Any] | None = None, work: Path | None = None) -> Replay:
    """Replay ``decision``'s scenario on the bundle at ``source``: one LoadGen run at the
    lowest rate the shipped configuration met in the recorded repetitions (``search`` false),
    or the bounded search from their median."""
    scenario = decision.scenario
    recorded = _shipped(decision)
    met = [q for q in recorded if q > 0]
    # the search starts from the median; the smoke test runs where every repetition held
    rate = (statistics.median(met) if search else min(met)) if met \
        else (scenario.target_qps or 100.0)
    req = ScenarioRequest(source="bundle", path=str(source), sessions=0,
                          verify=dict(verify or {}),
                          settings=RunSettings(kind="server", qps=1, duration_s=1,
                                               max_duration_s=1))
    run_scenario = scenario if search else scenario.model_copy(update={"search_steps": 1})
    with tempfile.TemporaryDirectory(prefix="dossier-scenario-") as tmp:
        here = serve_configuration(req, run_scenario, work or Path(tmp), start_qps=rate)
    low = predict_low(recorded)
    probe = here.probes[0]
    lg = f"LoadGen's own result: {probe.run.loadgen_result}" if probe.run else probe.reason
    if scenario.kind == "offline":
        regression = low is not None and here.metric_qps < low
        text = (f"offline: {here.metric_qps:.4g} samples/s here (recorded "
                f"{', '.join(f'{q:.4g}' for q in recorded)}); {lg}")
    elif not search:
        p = probe.run.latency_ms(f"{scenario.percentile:.2f}") if probe.run else None
        regression = not probe.met
        text = (f"{scenario.describe()}: at {rate:.4g} QPS (the lowest rate the release met in "
                f"its {len(recorded)} repetitions) "
                + (f"p{scenario.percentile:g} {p:.3g} ms, " if p is not None else "")
                + ("met" if probe.met else "NOT met") + f" here; {lg}")
    else:
        regression = low is not None and here.metric_qps < low
        text = (f"{scenario.describe()}: highest rate met here {here.metric_qps:.4g} QPS "
                f"(recorded {', '.join(f'{q:.4g}' for q in recorded)}"
                + (f"; a new repetition expected at {low:.4g} or above" if low else "")
                + f"): {'regression' if regression else 'holds'}")
    return Replay(scenario=scenario.describe(), recorded_qps=recorded, here=here,
                  predict_low=low, regression=regression, text=text)


REBENCH_LIMITS = {"duration_s": 30.0, "run_timeout_s": 120.0, "search_steps": 8, "processes": 1}
"""What ``verify --rebench`` takes at most of a recorded scenario's settings (an unsigned
bundle's decision is anyone's)."""


def rebench_scenario(bundle: Any) -> Replay | None:
    """``verify --rebench`` of a bundle released under a server or offline scenario: the
    bounded search again here, judged against the recorded repetitions (None for a
    single-stream bundle). Its settings are clamped to :data:`REBENCH_LIMITS`."""
    decision = recorded(bundle)
    if decision is None:
        return None
    s = decision.scenario
    clamped = s.model_copy(update={k: min(getattr(s, k), type(getattr(s, k))(v))
                                   for k, v in REBENCH_LIMITS.items()})
    return replay(str(bundle.source), decision.model_copy(update={"scenario": clamped}),
                  search=True, verify={"on_suboptimal": "ignore"})
