"""``budget``: the best admissible route of a large space within a budget of builds or seconds.

A structured start (the baseline and every one-knob route, as ``fast``), the one-knob values that
helped set together, then proposals of two kinds. When the build budget is less than twice the
one-knob routes, the start would spend half of it or more on routes that each vary the baseline
alone: then it is an ascent instead (:func:`ascent`), the same number of one-knob steps, each
knob's values tried from the best route found so far, so that what helped is already combined
when the budget runs out. Around the best route so far
(:mod:`dossier.strategies.local`): one-knob moves of it by expected gain, each knob it sets moved
once in context, and repairs of settings that fail on their own (tried with a few partner
settings at once). And routes proposed by Optuna's TPE sampler (multivariate, with constraints),
which take every turn the search around the best route leaves. Every route, whoever proposed
it, is a trial of the study: a route that fails to build, crashes, times out or breaks accuracy
is told to the sampler as infeasible (a violated constraint), never as a slow route; an
admissible one as log(speedup over the baseline timed alongside). Every route is screened once,
as in every strategy; the confirmation that follows the search is, as always, the only gate to
shipping.

The study lives in the run folder (``search-study.jsonl``, Optuna's journal storage). The
proposals around the best route are a pure function of the routes measured and the seed, and
each of the sampler's is drawn by a sampler seeded from the strategy's seed and the number of
proposals so far, so a search resumed with ``tune --continue`` (after Ctrl-C or kill -9) makes
the same proposals as one that was never stopped. The search stops when the budget is spent, or
earlier when no proposal is expected to beat the best route by the minimum effect
(:mod:`dossier.strategies.spend`), or when the sampler keeps proposing routes already measured.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier.errors import InputError, TuneError
from dossier.knobs import KnobDatabase
from dossier.measure.reading import reaches_effect
from dossier.routes import Route, Selection, SelectionItem
from dossier.strategies import local
from dossier.strategies.fast import FastStrategy
from dossier.strategies.interface import Judged, Strategy
from dossier.strategies.spend import DEFAULT_PATIENCE, Account, Limits, Scored, account, speedup
from dossier.trial import Outcome

if TYPE_CHECKING:
    import optuna

    from dossier.spec import ReleaseSpec

STUDY_NAME = "search-study.jsonl"
"""The study's journal in the run folder."""
REPEATS_TO_STOP = 50
"""Proposals in a row of routes already measured after which the sampler has converged."""
STOPPED_ATTR = "stopped"
"""Study attribute that records why the search stopped."""


def build_limit(max_builds: int | None, max_search_s: float | None) -> None:
    """Refuse a budget strategy without a budget (InputError)."""
    if max_builds is None and max_search_s is None:
        raise InputError("strategy 'budget' needs a budget",
                         hint="set max_builds and/or max_search_s in [tune], or give "
                              "--max-builds / --max-search-s")


class BudgetStrategy(Strategy):
    """Structured start, then moves and repairs around the best route and constrained TPE
    proposals, within ``max_builds`` / ``max_search_s``."""

    name = "budget"
    summary = ("the baseline and one-knob routes, then moves and repairs around the best route "
               "and routes proposed by a model of the space (Optuna TPE, failures as "
               "constraints) until the budget is spent or no gain is expected")
    plans_ahead = False

    def __init__(self, limits: Limits | None = None, seed: int = 0) -> None:
        self.limits = limits or Limits()
        self.seed = seed
        self.storage_path: Path | None = None
        self.stopped: str | None = None
        """Why the last walk stopped."""

    def configure(self, spec: ReleaseSpec) -> None:
        """Take the budget, seed and patience from ``[tune]``, the minimum effect from
        ``[timing]``; InputError when there is no budget."""
        t = spec.tune
        build_limit(t.max_builds, t.max_search_s)
        self.limits = Limits(max_builds=t.max_builds, max_search_s=t.max_search_s,
                             min_effect=spec.timing.min_effect,
                             patience=t.patience or DEFAULT_PATIENCE)
        self.seed = t.seed

    def open(self, run_dir: Path | None) -> None:
        """Keep the study in ``run_dir`` (None: in memory, for replays)."""
        self.storage_path = run_dir / STUDY_NAME if run_dir is not None else None

    def notes(self) -> list[str]:
        """Why the search stopped."""
        return [f"search stopped: {self.stopped}"] if self.stopped else []

    def start(self, selection: Selection, db: KnobDatabase) -> list[Route]:
        """The structured start: the baseline and every one-knob route (``fast``'s routes)."""
        return list(FastStrategy().routes(selection, db, {}))

    def ascends(self, selection: Selection, db: KnobDatabase) -> bool:
        """Whether the start is an :func:`ascent` (:func:`ascends`)."""
        return ascends(len(self.start(selection, db)), self.limits.max_builds)

    def ahead(self, selection: Selection, db: KnobDatabase,
              results: Mapping[str, Judged]) -> list[Route]:
        """The structured start, within the build budget (its builds may start at once); of an
        ascent, the baseline alone (each later step depends on the ones before)."""
        routes = self.start(selection, db)
        if self.ascends(selection, db):
            routes = routes[:1]
        if self.limits.max_builds is not None:
            routes = routes[: self.limits.max_builds]
        return routes

    def plan(self, selection: Selection, db: KnobDatabase) -> list[Route]:
        """The structured start; the proposals after it depend on what is measured."""
        return self.ahead(selection, db, {})

    def count(self, selection: Selection, db: KnobDatabase) -> int:
        """The build budget, or the size of the space when that is smaller (without a build
        budget: the size of the space, an upper bound)."""
        space = math.prod(len(i.values) for i in selection.varied)
        return min(space, self.limits.max_builds) if self.limits.max_builds else space

    def routes(self, selection: Selection, db: KnobDatabase,
               results: Mapping[str, Judged]) -> Iterator[Route]:
        import optuna

        base = selection.baseline(db).as_dict()
        dists: dict[str, Any] = {i.knob: optuna.distributions.CategoricalDistribution(i.values)
                                 for i in selection.varied}
        start = [r.as_dict() for r in self.start(selection, db)]
        ascending = self.ascends(selection, db)
        space = math.prod(len(i.values) for i in selection.varied)
        study = self._study(dists)

        def route_of(params: Mapping[str, Any]) -> Route:
            why = _outside(params, dists)
            if why is not None:  # the sampler's own proposals never are: a crafted journal
                raise TuneError(f"the search's study journal proposed a route outside the "
                                f"selection ({why})", hint=_SET_ASIDE_HINT)
            return Route.of({**base, **{k: str(v) for k, v in params.items()}})

        def tell(trial: optuna.trial.FrozenTrial | optuna.trial.Trial, route: Route) -> None:
            value, violation = _observation(results[route.text()])
            if isinstance(trial, optuna.trial.FrozenTrial):  # asked by a search that was killed
                trial = optuna.trial.Trial(study, trial._trial_id)
            trial.set_constraint("admissible", violation)
            study.tell(trial, value)

        def spent() -> Account:
            # every trial of the search in measuring order (results keeps the tuner's order)
            return account(list(results.values()), self.limits, len(start))  # type: ignore[arg-type]

        # replay the study: trials told, and the one asked but not told when the search stopped
        pending: optuna.trial.FrozenTrial | None = None
        for ft in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if route_of(ft.params).text() in results:
                tell(ft, route_of(ft.params))
            else:
                pending = ft
        if pending is not None:
            yield route_of(pending.params)
            tell(pending, route_of(pending.params))
        repeats = 0
        while True:
            acc = spent()
            self.stopped = acc.stop or _space_done(len(results), space) or \
                (f"the sampler proposed {REPEATS_TO_STOP} measured routes in a row: it has "
                 "converged" if repeats >= REPEATS_TO_STOP else None)
            if self.stopped:
                if study.user_attrs.get(STOPPED_ATTR) != self.stopped:
                    study.set_user_attr(STOPPED_ATTR, self.stopped)
                return
            trials = study.get_trials(deepcopy=False)
            waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
            n = len(trials) - waiting
            if not waiting:
                nxt = self._next_start(selection, db, results, start, n, ascending)
                if nxt is None:  # a move or a repair around the best route, or the model's
                    nxt = local.propose(local.Evidence.read(selection, db, results),
                                        max(0, n - len(start) - 1), self.seed,
                                        self.limits.min_effect)
                if nxt is not None:
                    study.enqueue_trial({k: v for k, v in nxt.as_dict().items() if k in dists})
            study.sampler = _sampler(self.seed, n)
            trial = study.ask(dists)
            route = route_of(trial.params)
            if route.text() in results:
                repeats += 1 if n >= len(start) else 0
                tell(trial, route)
                continue
            repeats = 0
            yield route
            if route.text() not in results:
                raise TuneError(f"the budget strategy proposed {route} but got no result for it")
            tell(trial, route)

    def _next_start(self, selection: Selection, db: KnobDatabase,
                    results: Mapping[str, Judged], start: list[dict[str, str]], n: int,
                    ascending: bool) -> Route | None:
        """Proposal ``n`` of the structured start (the ascent's next step, or ``start[n]``,
        then the one-knob values that helped, together); None once the start is done."""
        if ascending:
            return ascent(selection.baseline(db), selection.varied, results,  # type: ignore[arg-type]
                          self.limits.min_effect) if n < len(start) else None
        if n < len(start):
            return Route.of(start[n])
        if n == len(start):
            return helpful(selection, db, results, self.limits.min_effect)
        return None

    def _study(self, dists: Mapping[str, Any]) -> optuna.Study:
        """The study: in memory, or read from the run folder's journal like the tuning cache
        (:func:`_journal_problem`: not followed if a link, a regular file only, bounded, every
        line a journal operation; then every trial's parameters, told or enqueued, within the
        selection ``dists``). A journal that fails is set aside (renamed, never followed or
        written) and TuneError (exit 4) names the line: the next ``tune --continue`` starts a
        new study, which replays the trials of the tuning cache, the record of truth."""
        if self.storage_path is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)  # the library never prints
            return optuna.create_study(direction="maximize")
        path = self.storage_path
        problem = _journal_problem(path)
        study = None
        if problem is None:
            _repair(path)
            try:
                study = self.open_study(path)
            except Exception as exc:  # noqa: BLE001 - Optuna's parser: whatever a bad line raises
                problem = f"Optuna cannot replay it ({type(exc).__name__}: {exc})"
        if study is not None:
            problem = _trials_outside(study, dists)
        if problem is None and study is not None:
            return study
        aside = _set_aside(path)
        raise TuneError(f"the search's study journal {path} is refused: {problem}; set aside "
                        f"as {aside.name}", hint=_SET_ASIDE_HINT)

    @staticmethod
    def open_study(path: Path) -> optuna.Study:
        """The study kept in the journal ``path`` (created when missing)."""
        import optuna
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the library never prints
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.JournalStorage(
                JournalFileBackend(str(path), lock_obj=_run_folder_lock()))
        return optuna.create_study(storage=storage, study_name="search", direction="maximize",
                                   load_if_exists=True)


def helpful(selection: Selection, db: KnobDatabase, results: Mapping[str, Judged],
            min_effect: float) -> Route:
    """The baseline with every knob at the value whose one-knob route was admissible and
    fastest, when at least ``min_effect`` faster than the baseline (``mixed``'s insight, as
    one route)."""
    from dossier.strategies.fast import one_offs

    def measured(knob: str, route: Route) -> tuple[str, str, float | None]:
        r = results.get(route.text())
        return knob, route.as_dict()[knob], speedup(r) if r is not None else None  # type: ignore[arg-type]

    best = fastest_values((measured(k, r) for k, r in one_offs(selection, db)), min_effect)
    return Route.of({**selection.baseline(db).as_dict(), **best})


def fastest_values(one_knob: Iterable[tuple[str, str, float | None]],
                   min_effect: float) -> dict[str, str]:
    """Per knob, the value whose one-knob route was fastest, among those at least
    ``min_effect`` faster than the baseline (``one_knob``: knob, value, speedup or None)."""
    best: dict[str, tuple[float, str]] = {}
    for knob, value, s in one_knob:
        if s is not None and reaches_effect(s, min_effect) and s > best.get(knob, (0.0, ""))[0]:
            best[knob] = (s, value)
    return {k: v for k, (_, v) in best.items()}


def start_size(base: Route, varied: Sequence[SelectionItem]) -> int:
    """Routes of the structured start: the baseline and its one-knob routes (``fast``'s)."""
    values = base.as_dict()
    return 1 + sum(v != values.get(i.knob) for i in varied for v in i.values)


def ascends(start: int, max_builds: int | None) -> bool:
    """Whether the start is an :func:`ascent`: a build budget under twice the ``start``
    routes."""
    return max_builds is not None and 2 * start > max_builds


def ascent(base: Route, varied: Sequence[SelectionItem], results: Mapping[str, Scored],
           min_effect: float) -> Route | None:
    """The next route of the ascent start, None when every knob has had its turn.

    From the baseline ``base``, knob by knob in ``fast``'s order (right to left), each of the
    knob's other values is tried in the route the ascent stands on; the ascent then moves to the
    fastest admissible of them when it is at least ``min_effect`` faster than where it stands.
    As many routes as ``fast``'s (fewer when a value tried is one already measured), and a pure
    function of the routes measured, so a resumed search takes the same steps and ``explain``
    can tell them from the proposals."""
    def measured(route: Route) -> float:
        return speedup(results[route.text()]) or 0.0

    here = base
    if here.text() not in results:
        return here
    for item in reversed(varied):
        tried = [Route.of({**here.as_dict(), item.knob: v}) for v in item.values]
        tried = [r for r in tried if r.text() != here.text()]
        for route in tried:
            if route.text() not in results:
                return route
        best = max(tried, key=measured, default=here)
        if reaches_effect(measured(best), min_effect, over=measured(here)):
            here = best
    return None


def _observation(r: Judged) -> tuple[float, float]:
    """What the sampler is told about a trial: (log speedup, constraint violation). A failed
    route is infeasible (violation 1; a rejected one by how far its worst loss is over)."""
    scored: Scored = r  # type: ignore[assignment]
    if scored.outcome is Outcome.OK:
        c = scored.comparison
        return (math.log(c.speedup) if c is not None and c.speedup > 0 else 0.0), -1.0
    return 0.0, 1.0


def _space_done(measured: int, space: int) -> str | None:
    return f"every one of the {space} routes is measured" if measured >= space else None


def _sampler(seed: int, n: int) -> optuna.samplers.BaseSampler:
    """The sampler for proposal ``n``: seeded from the search's seed and ``n``, so that a resumed
    search draws what an uninterrupted one would."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=(seed * 1_000_003 + n) % 2**32, multivariate=True,
                                          group=True, n_startup_trials=0)


JOURNAL_MAX_BYTES = 256 << 20
"""The largest study journal read (a search of 10,000 proposals writes about 20 MB)."""
JOURNAL_MAX_LINE = 1 << 20
"""The longest line of a study journal."""
_SET_ASIDE_HINT = ("run tune --continue again: the study is rebuilt from the trials of the "
                   "tuning cache")


def _journal_problem(path: Path) -> str | None:
    """What is wrong with the journal at ``path`` as a file (None: nothing, or there is none
    yet): a link, not a regular file, larger than :data:`JOURNAL_MAX_BYTES`, a line longer
    than :data:`JOURNAL_MAX_LINE`, or a line that is not a JSON object holding a known
    operation (its number named). Never follows a link, never blocks on a FIFO."""
    import json
    import os
    import stat

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link (never followed)"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "it is not a regular file"
        if st.st_size > JOURNAL_MAX_BYTES:
            return f"it holds {st.st_size} bytes, more than {JOURNAL_MAX_BYTES >> 20} MiB"
        for number, line in enumerate(iter(lambda: f.readline(JOURNAL_MAX_LINE + 1), b""),
                                      start=1):
            if len(line) > JOURNAL_MAX_LINE:
                return f"line {number} is longer than {JOURNAL_MAX_LINE >> 20} MiB"
            if not line.endswith(b"\n"):
                break  # a torn last line: cut off by _repair
            try:
                op = json.loads(line)
            except (ValueError, RecursionError) as exc:
                return f"line {number} is not JSON ({type(exc).__name__})"
            code = op.get("op_code") if isinstance(op, dict) else None
            if type(code) is not int or not 0 <= code <= _MAX_OP_CODE:
                return f"line {number} is not a journal operation"
            if not isinstance(op.get("worker_id"), str):
                return f"line {number} has no worker id"
    return None


_MAX_OP_CODE = 10
"""The last operation code of Optuna's journal (``JournalOperation.DISCARD_TRIALS``)."""


def _outside(params: Mapping[str, Any], dists: Mapping[str, Any]) -> str | None:
    """How ``params`` leave the selection's varied knobs and values (None: they do not)."""
    if not isinstance(params, Mapping):
        return "parameters that are not a mapping"
    for name, value in params.items():
        if name not in dists:
            return f"-{name} is not a varied knob"
        if str(value) not in dists[name].choices:
            return f"-{name}={value} is not a value of the selection"
    return None


def _trials_outside(study: optuna.Study, dists: Mapping[str, Any]) -> str | None:
    """The first trial of ``study`` whose parameters, told or enqueued, leave the selection."""
    for t in study.get_trials(deepcopy=False):
        why = _outside(t.params, dists) or _outside(t.system_attrs.get("fixed_params", {}),
                                                    dists)
        if why is not None:
            return f"trial {t.number}: {why}"
    return None


def _set_aside(path: Path) -> Path:
    """Rename the journal (whatever it is: the entry itself, never what a link names) to a
    free ``NAME.refused-N`` beside it; that name."""
    import os

    for n in range(1, 10_000):
        aside = path.with_name(f"{path.name}.refused-{n}")
        if not os.path.lexists(aside):
            os.rename(path, aside)
            return aside
    raise TuneError(f"cannot set the study journal {path} aside: too many refused ones",
                    hint=f"remove {path.name}.refused-* from the run folder")


def _repair(path: Path) -> None:
    """Cut a journal line a kill left half-written (what it recorded before stays)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def _run_folder_lock() -> Any:
    """The journal's lock: none of its own. The run folder's lock already keeps every other
    search out, and a lock file of Optuna's left by a kill would stall ``--continue``."""
    from optuna.storages.journal._file import BaseJournalFileLock

    class RunFolderLock(BaseJournalFileLock):
        def acquire(self) -> bool:
            return True

        def release(self) -> None:
            return None

    return RunFolderLock()
