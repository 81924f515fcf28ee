"""How a budgeted search (strategy ``budget`` or ``random``) spent its budget: the order of its
routes, which were screened out and why, and why it stopped (:class:`SearchBudget`, the
``search_budget`` part of ``dossier explain``).

Everything comes from the tuning cache, read with the rule the search itself applied
(:func:`dossier.strategies.spend.account`), so the account cannot drift from what happened. A
stop the records cannot show (the sampler proposing only measured routes) is read from the
study journal in the run folder when it is at hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dossier.cache import CacheHeader
from dossier.routes import Route, Selection
from dossier.strategies.budget import ascends, ascent, fastest_values, start_size
from dossier.strategies.spend import DEFAULT_PATIENCE, Limits, account, speedup
from dossier.trial import TrialRecord

BUDGETED = ("budget", "random")
"""The strategies that spend a budget."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Spent(_Model):
    """One route of a budgeted search, in measuring order."""

    index: int
    """Its trial index."""
    route: str
    """Its route."""
    phase: Literal["baseline", "start", "combination", "proposal"]
    """The baseline; the structured start (one knob off the baseline, or a step of the ascent
    when the build budget is small: :func:`dossier.strategies.budget.ascent`); the one-knob
    values that helped, together; or a proposal (of the model, or a random draw)."""
    outcome: str
    """How its trial ended."""
    speedup: float | None
    """Its screening speedup (admissible routes but the baseline)."""
    new_best: bool
    """It beat every earlier route by the minimum effect."""
    screened_out: str | None
    """Why it went no further: infeasible (its outcome), or not among the routes the
    confirmation re-timed. None for the baseline and the routes the confirmation re-timed."""


class SearchBudget(_Model):
    """How a budgeted search spent its budget."""

    strategy: str
    """budget or random."""
    max_builds: int | None
    """The build budget."""
    max_search_s: float | None
    """The time budget (seconds of trials)."""
    builds: int
    """Routes measured."""
    search_s: float
    """Their trials' wall time, summed."""
    start: int
    """Routes of the structured start (the baseline included)."""
    ascent: bool = False
    """The start was an ascent (each knob's values tried from the best route so far), as it is
    under a build budget below twice the structured start."""
    infeasible: int
    """Routes that failed to build, crashed, timed out or broke accuracy (told to the model as
    infeasible)."""
    best_speedup: float
    """The best screening speedup."""
    best_route: str | None
    """Its route."""
    stopped: str
    """Why the search stopped."""
    routes: list[Spent]
    """Every route in measuring order."""


def search_budget(header: CacheHeader, trials: Sequence[TrialRecord],
                  run_dir: Path | None = None) -> SearchBudget | None:
    """The account of a budgeted search (None for other strategies)."""
    tune = header.spec.tune
    if tune.strategy not in BUDGETED:
        return None
    main = [t for t in trials if t.role != "confirm"]
    confirmed = {t.route for t in trials if t.role == "confirm"}
    base = Route.parse(header.baseline_route).as_dict()

    min_effect = header.timing.min_effect
    varied = Selection.recorded(tune.selection).varied
    ascending = tune.strategy == "budget" and ascends(start_size(Route.of(base), varied),
                                                      tune.max_builds)
    combined = _combination(main, base, min_effect) \
        if tune.strategy == "budget" and not ascending else None

    def phase(t: TrialRecord) -> Literal["baseline", "start", "combination", "proposal"]:
        if t.role == "baseline":
            return "baseline"
        if t.route == combined:
            return "combination"
        differs = sum(v != base.get(k) for k, v in Route.parse(t.route).as_dict().items())
        return "start" if tune.strategy == "budget" and differs <= 1 else "proposal"

    def climbed(i: int, t: TrialRecord) -> Literal["baseline", "start", "proposal"]:
        if t.role == "baseline":
            return "baseline"
        step = ascent(Route.of(base), varied, {m.route: m for m in main[:i]}, min_effect)
        return "start" if step is not None and step.text() == t.route else "proposal"

    phases = [climbed(i, t) for i, t in enumerate(main)] if ascending else \
        [phase(t) for t in main]
    start = next((i for i, ph in enumerate(phases) if ph in ("combination", "proposal")),
                 len(phases))
    limits = Limits(max_builds=tune.max_builds, max_search_s=tune.max_search_s,
                    min_effect=min_effect,
                    patience=(tune.patience or DEFAULT_PATIENCE) if tune.strategy == "budget"
                    else 2**31)
    acc = account(main, limits, start)
    stopped = acc.stop or _journal_stop(run_dir) or (
        "every route of the selection is measured" if tune.strategy == "budget"
        else "every route of the selection is drawn")
    improved = set(acc.improved_at)
    routes = [Spent(index=t.index, route=t.route, phase=ph, outcome=t.outcome.value,
                    speedup=speedup(t) if i > 0 else None, new_best=i in improved and i > 0,
                    screened_out=None if t.route in confirmed or t.role == "baseline"
                    else (f"infeasible: {t.outcome.value}" if not t.admissible
                          else "not among the routes the confirmation re-timed"))
              for i, (t, ph) in enumerate(zip(main, phases))]
    return SearchBudget(strategy=tune.strategy, max_builds=tune.max_builds,
                        max_search_s=tune.max_search_s, builds=acc.builds,
                        search_s=round(acc.search_s, 3), start=start, ascent=ascending,
                        infeasible=sum(not t.admissible for t in main),
                        best_speedup=acc.best, best_route=acc.best_route, stopped=stopped,
                        routes=routes)


def _combination(main: Sequence[TrialRecord], base: dict[str, str],
                 min_effect: float) -> str | None:
    """The route setting together each knob's fastest one-knob value that was at least
    ``min_effect`` faster (what the budget strategy measures after its start)."""
    one_knob = []
    for t in main[1:]:
        changed = [(k, v) for k, v in Route.parse(t.route).as_dict().items() if v != base.get(k)]
        if len(changed) == 1:
            one_knob.append((*changed[0], speedup(t)))
    best = fastest_values(one_knob, min_effect)
    return Route.of({**base, **best}).text() if len(best) >= 2 else None


def _journal_stop(run_dir: Path | None) -> str | None:
    """Why the study journal in ``run_dir`` says the search stopped (None: no journal, or it
    says nothing readable)."""
    from dossier.strategies.budget import STOPPED_ATTR, STUDY_NAME, BudgetStrategy

    if run_dir is None or not (Path(run_dir) / STUDY_NAME).is_file():
        return None
    try:
        study = BudgetStrategy.open_study(Path(run_dir) / STUDY_NAME)
        stop = study.user_attrs.get(STOPPED_ATTR)
    except Exception:  # an unreadable journal: the account goes without it
        return None
    return stop if isinstance(stop, str) else None


def lines(b: SearchBudget) -> list[str]:
    """The account for people (``dossier explain``)."""
    budget = " and ".join([*([f"{b.max_builds} builds"] if b.max_builds else []),
                           *([f"{b.max_search_s:g} s"] if b.max_search_s else [])])
    out = [f"{b.strategy}: {b.builds} routes measured in {b.search_s:.1f} s of trials (budget "
           f"{budget}); {b.start} in the structured start"
           + (" (an ascent: each knob tried from the best route so far)" if b.ascent else "")
           + f", {b.builds - b.start} after it; "
           f"{b.infeasible} infeasible",
           f"best screening speedup {b.best_speedup:.3f}x ({b.best_route or 'the baseline'})",
           f"stopped: {b.stopped}"]
    for r in b.routes:
        mark = " new best" if r.new_best else ""
        s = f" {r.speedup:.3f}x" if r.speedup is not None else ""
        why = f"; {r.screened_out}" if r.screened_out else "; re-timed by the confirmation" \
            if r.phase != "baseline" else ""
        out.append(f"  [{r.index}] {r.phase:<11} {r.outcome}{s}{mark}{why}: {r.route}")
    return out
