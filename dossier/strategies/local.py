"""The budget strategy's search around the best route: one-knob moves of the best route, and
repairs of settings that fail on their own.

A model of the whole space (TPE) spreads its proposals over the space. In a space where most
knobs do nothing and the few that matter interact in small groups, most of the gain lies one
knob away from the best route so far, and TPE, which draws each knob from its own density, seldom
proposes exactly that. So after the structured start the search moves the best route one knob
at a time, the move expected to gain most first: a setting's effect is read from its one-knob
route of the structured start until the same move has been made in context, and a move that a
measured failure says will fail is skipped. Once no move promises the minimum effect, each
setting of the best route that helped alone is checked once in context (two settings that help
alone may conflict together), and then the remaining proposals alternate between repairs, small
moves and the model's proposals.

A setting that fails on its own (breaks accuracy, fails to build) may be fast and need a partner
setting (a guard) that no one-knob route shows, and that TPE, having seen the setting fail and
the partner do nothing or slow down, does not propose with it. A repair tries the setting on the
best route together with a few settings drawn at random from the knobs the best route leaves at
the baseline's value: one build tests several partners at once (group testing). When the route
fails as the setting's one-knob route did, none of those partners repairs it, and they are not
drawn for it again (when it fails otherwise, they come at most one to a group). A repair that
works and is faster becomes the best route, from which the moves take out what it does not
need; one that works but is slower is first moved towards the best route.

Everything here is a pure function of the routes measured, in measuring order, and a seed, so a
search resumed after a kill proposes what an uninterrupted one would.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from dossier.knobs import KnobDatabase
from dossier.measure.reading import log_effect
from dossier.routes import Route, Selection
from dossier.strategies.interface import Judged
from dossier.strategies.spend import Scored, speedup
from dossier.trial import Outcome

Setting = tuple[str, str]
"""A knob and a value other than the baseline's."""

GROUP = 4
"""Partners a repair tries at once: one partner a build finds a guard slowly, many at once often
fail for a reason of their own (a conflict among them, or with the best route)."""
CYCLE = ("repair", "repair", "small", "model")
"""What the proposals are, in turn, once no move promises the minimum effect and every knob the
best route sets has been moved once: a repair (when a setting is left to repair), a move
expected to gain less than the minimum effect (when one is left), or the model's proposal
(whenever the kind in turn has nothing to propose)."""
SEED_STRIDE = 1_000_003
"""Keeps the random draws of different seeds apart."""


@dataclass
class Evidence:
    """What the routes measured so far say, relative to the baseline."""

    base: dict[str, str]
    """The baseline's value of every knob of the route."""
    values: dict[str, tuple[str, ...]]
    """Each varied knob's values."""
    effect: dict[Setting, float] = field(default_factory=dict)
    """Log speedup of each setting's admissible one-knob route."""
    alone: dict[Setting, Outcome] = field(default_factory=dict)
    """How the one-knob route of each setting that failed alone failed, in measuring order."""
    failures: list[frozenset[Setting]] = field(default_factory=list)
    """The settings of every failed route."""
    feasible: list[frozenset[Setting]] = field(default_factory=list)
    """The settings of every admissible route."""
    admissible: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    """Every admissible route and its log speedup."""
    best: dict[str, str] = field(default_factory=dict)
    """The admissible route with the highest measured speedup (the baseline before any)."""
    best_log: float = 0.0
    """Its log speedup."""
    measured: set[str] = field(default_factory=set)
    """Every measured route's text."""
    moved: dict[Setting, float | None] = field(default_factory=dict)
    """What each one-knob move of the best route gained over the best route of the time, the
    last time it was made (log speedup; None: it failed)."""
    attempts: dict[Setting, int] = field(default_factory=dict)
    """Repairs tried of each setting that failed alone."""
    ruled_out: dict[Setting, set[Setting]] = field(default_factory=dict)
    """Partners that did not repair a setting: they came with it in a route that failed as its
    one-knob route did."""
    suspects: dict[Setting, set[Setting]] = field(default_factory=dict)
    """Partners that came with a setting in a route that failed otherwise than its one-knob
    route did (one of them, or the setting with one of them, may conflict with the best
    route)."""
    _live_failures: list[frozenset[Setting]] = field(default_factory=list, repr=False)
    _live_at: int = field(default=-1, repr=False)

    @classmethod
    def read(cls, selection: Selection, db: KnobDatabase,
             results: Mapping[str, Judged]) -> Evidence:
        """The evidence of ``results`` (keyed by route text, in measuring order)."""
        base = selection.baseline(db).as_dict()
        e = cls(base, {i.knob: tuple(i.values) for i in selection.varied}, best=dict(base))
        for text, r in results.items():
            e.add(text, r)  # type: ignore[arg-type]
        return e

    def add(self, text: str, r: Scored) -> None:
        """Take in one more measured route (its knobs outside the selection left out)."""
        self.measured.add(text)
        route = {**self.base, **{k: v for k, v in Route.parse(text).values if k in self.base}}
        mine = self.settings(route)
        moved = [(k, v) for k, v in route.items() if self.best.get(k) != v]
        s = speedup(r)
        log = None if s is None else math.log(s) if s > 0 else -math.inf
        if len(moved) == 1 and len(mine) > 1:
            self.moved[moved[0]] = None if log is None else log - self.best_log
        elif len(moved) > 1:
            self._repair_tried(moved, r.outcome)
        if log is None:
            self.failures.append(mine)
            if len(mine) == 1:
                self.alone.setdefault(next(iter(mine)), r.outcome)
            return
        self.feasible.append(mine)
        self.admissible.append((log, route))
        if len(mine) == 1:
            self.effect[next(iter(mine))] = log
        if log > self.best_log:
            self.best, self.best_log = route, log

    def _repair_tried(self, moved: list[Setting], outcome: Outcome) -> None:
        """Count a route that moved the best route by several knobs, one of them a setting that
        failed alone, as a repair of it; when it failed as the setting alone did, none of the
        other settings moved repairs it (with two such settings the route says nothing)."""
        open_ = [s for s in moved if s in self.alone and not self.repaired(s)]
        if len(open_) != 1:
            return
        s = open_[0]
        self.attempts[s] = self.attempts.get(s, 0) + 1
        if outcome == self.alone[s]:
            self.ruled_out.setdefault(s, set()).update(m for m in moved if m != s)
        elif outcome is not Outcome.OK:
            self.suspects.setdefault(s, set()).update(m for m in moved if m != s)

    def settings(self, route: Mapping[str, str]) -> frozenset[Setting]:
        """The settings of ``route`` that differ from the baseline."""
        return frozenset((k, v) for k, v in route.items() if self.base.get(k) != v)

    def repaired(self, s: Setting) -> bool:
        """Whether an admissible route holds the setting ``s``."""
        return any(s in ok for ok in self.feasible)

    def fails(self, route: Mapping[str, str], but: Setting | None = None) -> bool:
        """Whether a measured failure predicts that ``route`` fails: every setting of a failed
        route is in it, and no admissible route holds them all (a failure that an admissible
        route contains lacked something, as an unguarded setting lacks its guard). Failures
        holding ``but`` are left out (a repair of ``but`` adds what they lacked)."""
        mine = self.settings(route)
        return any(f <= mine and (but is None or but not in f) for f in self._live())

    def _live(self) -> list[frozenset[Setting]]:
        """The failures that no admissible route contains (read once per route measured)."""
        if self._live_at != len(self.measured):
            self._live_failures = [f for f in self.failures
                                   if not any(f <= ok for ok in self.feasible)]
            self._live_at = len(self.measured)
        return self._live_failures

    def gain(self, knob: str, value: str) -> float | None:
        """Expected log gain of moving the best route's ``knob`` to ``value``: what the same move
        gained the last time it was made, else the difference of the two values' one-knob routes
        (None when the move failed, or a one-knob route of either value failed)."""
        if (knob, value) in self.moved:
            return self.moved[(knob, value)]
        return self.change(knob, self.best[knob], value)

    def change(self, knob: str, old: str, new: str) -> float | None:
        """Expected log gain of setting ``knob`` from ``old`` to ``new``, from the one-knob
        routes (None when one of them failed or is not measured)."""
        def of(v: str) -> float | None:
            return 0.0 if v == self.base[knob] else self.effect.get((knob, v))

        a, b = of(old), of(new)
        return None if a is None or b is None else b - a


def propose(e: Evidence, k: int, seed: int, min_effect: float) -> Route | None:
    """Proposal ``k`` (counted from the first after the structured start and its combination):
    the move expected to gain the minimum effect; else a setting of the best route that helped
    alone, checked in context for the first time; else the kind of :data:`CYCLE` in turn (a
    repair: a repair that worked but is slower moved towards the best route first). None: the
    model proposes."""
    helps = log_effect(min_effect)
    route = step(e, helps) or step(e, -math.inf, untried=helps)
    if route is not None:
        return route
    kind = CYCLE[k % len(CYCLE)]
    if kind == "repair":
        route = settle(e)
        if route is not None:
            return route
        rng = random.Random((seed * SEED_STRIDE + k) % 2**32)
        for s in repairable(e):
            route = repair(e, s, rng, GROUP)
            if route is not None:
                return route
    if kind in ("repair", "small"):
        return step(e, 0.0)
    return None


def step(e: Evidence, floor: float, untried: float | None = None) -> Route | None:
    """The unmeasured one-knob move of the best route with the largest expected gain above
    ``floor`` that no measured failure predicts to fail (None: there is none).

    With ``untried`` (the log speedup of a one-knob route that marks its setting as helping
    alone): the moves never made that take out a setting of the best route that helped alone,
    or set one of its knobs to another value that helped alone, whatever their expected gain.
    A setting's effect alone can differ from its effect among the others (two that help alone
    may conflict, or help more together); a setting that did nothing alone is not checked."""
    moves: list[tuple[float, int, int, Route]] = []
    for i, (knob, values) in enumerate(e.values.items()):
        if untried is not None and e.best[knob] == e.base[knob]:
            continue
        for j, value in enumerate(values):
            if value == e.best[knob]:
                continue
            g = e.gain(knob, value)
            if g is None:
                continue
            if untried is not None:
                helped = e.effect.get((knob, e.best[knob] if value == e.base[knob] else value))
                if (knob, value) in e.moved or helped is None or helped < untried:
                    continue
            elif g <= floor:
                continue
            route = {**e.best, knob: value}
            if Route.of(route).text() not in e.measured and not e.fails(route):
                moves.append((-g, i, j, Route.of(route)))
    return min(moves, key=lambda m: m[:3])[3] if moves else None


def settle(e: Evidence) -> Route | None:
    """A repair that worked but is not the best route moved one knob towards the best route:
    the fastest admissible route holding a setting that failed alone (and that the best route
    lacks), with one of its other differences from the best route undone, the one expected to
    gain most (a partner that slows it down, or a gain of the best route it lacks). None when
    no such move is expected to gain, is unmeasured, and is not predicted to fail."""
    have = e.settings(e.best)
    moves: list[tuple[float, int, Route]] = []
    for i, s in enumerate(e.alone):
        if s in have:
            continue
        holding = [(log, r) for log, r in e.admissible if r.get(s[0]) == s[1]]
        if not holding:
            continue
        _, route = max(holding, key=lambda h: h[0])
        for knob, value in route.items():
            if knob == s[0] or value == e.best[knob] or knob not in e.values:
                continue
            g = e.change(knob, value, e.best[knob])
            moved = {**route, knob: e.best[knob]}
            if g is not None and g > 0 and Route.of(moved).text() not in e.measured \
                    and not e.fails(moved):
                moves.append((-g, i, Route.of(moved)))
    return min(moves, key=lambda m: m[:2])[2] if moves else None


def repairable(e: Evidence) -> list[Setting]:
    """Settings whose one-knob route failed and that no admissible route holds yet, the least
    tried first (then in measuring order)."""
    left = [s for s in e.alone if not e.repaired(s)]
    return sorted(left, key=lambda s: e.attempts.get(s, 0))


def partners(e: Evidence, setting: Setting) -> list[Setting]:
    """The settings that may still repair ``setting``: values of the knobs the best route leaves
    at the baseline's (when none is left: other values of the knobs it sets), less those that
    failed alone or as a move of the best route, and those ruled out."""
    free: list[Setting] = []
    taken: list[Setting] = []
    gone = e.ruled_out.get(setting, set())
    for knob, values in e.values.items():
        if knob == setting[0]:
            continue
        for v in values:
            s = (knob, v)
            if v in (e.base[knob], e.best[knob]) or s in e.alone or s in gone \
                    or (s in e.moved and e.moved[s] is None):
                continue
            (free if e.best[knob] == e.base[knob] else taken).append(s)
    return free or taken


def repair(e: Evidence, setting: Setting, rng: random.Random, group: int = GROUP,
           tries: int = 20) -> Route | None:
    """The best route with ``setting`` and up to ``group`` of its :func:`partners` (one value a
    knob, at most one of them a suspect: a group that failed otherwise is not drawn together
    again) drawn at random; a draw already measured, or that a measured failure not involving
    ``setting`` predicts to fail, is drawn again (None after ``tries``, or when no partner is
    left)."""
    pool = partners(e, setting)
    suspects = e.suspects.get(setting, set())
    for _ in range(tries if pool else 0):
        rng.shuffle(pool)
        picked: dict[str, str] = {}
        suspect = False
        for knob, v in pool:
            if len(picked) < group and knob not in picked and not (
                    suspect and (knob, v) in suspects):
                picked[knob] = v
                suspect = suspect or (knob, v) in suspects
        route = {**e.best, setting[0]: setting[1], **picked}
        if Route.of(route).text() not in e.measured and not e.fails(route, but=setting):
            return Route.of(route)
    return None
