"""Every record of a tuning cache, checked against its header and the knob database before use.

A tuning cache is read back from disk, so it is untrusted: ``tune --continue`` reuses its
engines and its decision, ``bundle`` ships the engine it names. :func:`check_cache` refuses,
with :class:`~dossier.errors.CacheMismatchError` naming the line, a cache where:

- a trial's index is not its position (a duplicated or missing trial line), a route is tried
  twice, or there is not exactly one baseline, at index 0, on the header's baseline route;
- a route names a knob the knob database does not have, a value it does not allow, or lies
  outside the header's selection (a knob not selected, a pinned knob moved, a value not listed);
- an engine path is absolute, has ``..``, or resolves outside the run folder (through a
  symbolic link), an admissible trial has no engine digest, or an engine file no longer has
  the digest its record gives (recomputed here, streamed);
- the header's ``inferences_per_sample`` is not what its validation set and
  ``timing.inputs`` give (every latency divides by it);
- a trial says it raced out (``raced``) and is not a search trial, or timed every round;
- a trial's losses name validation pairs or outputs the header's validation set does not have,
  or a trial recorded ``ok`` lacks the loss of one of its pairs' outputs;
- a confirmation re-measures a route that was not an admissible trial before it, or another
  engine;
- a decision line comes before the trials it decides, or names a shipped trial or baseline
  that does not match the trials (a stale or forged decision is never reused).

A hold-out record (or the decision's copy of one) that does not follow from its own numbers
and the header's rule (marked passed with a loss at or above the threshold, NaN, or no
losses; marked failed with every loss below it; a worst loss that is not the largest of its
losses; a pair count that is not its losses' or the header's hold-out set's) is refused with
:class:`~dossier.errors.TuneError` (exit 4) naming the line: the search did not produce a
hold-out result that can be trusted, and it is re-run in a new search.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from dossier.cache import CacheHeader, DecisionRecord, HoldoutRecord, TuningCache
from dossier.errors import CacheMismatchError, SelectionError, TuneError
from dossier.hashing import digest_file
from dossier.knobs import KnobDatabase
from dossier.routes import Route, Selection
from dossier.trial import TrialRecord
from dossier.validation import ValidationSet

_HINT = ("the run folder was edited or mixed with another search; use the folder dossier tune "
         "wrote, unchanged, or start a new search")


def check_cache(cache: TuningCache, db: KnobDatabase, run_dir: Path, *,
                vset: ValidationSet | None = None, digests: bool = True) -> None:
    """Refuse (CacheMismatchError naming the line) any record of ``cache`` that does not fit its
    header, ``db`` (the knob database the header's digest names) and the run folder ``run_dir``.
    With ``vset``, losses must name its pairs and outputs; with ``digests``, every engine file
    present is hashed and must match its record."""
    h = cache.header
    where = cache.path
    selection = _selection(h.selection, db, where)
    run_root = Path(os.path.realpath(run_dir))
    trials: list[TrialRecord] = []
    tried: dict[str, int] = {}
    decision_line: int | None = None
    single_stream: DecisionRecord | None = None
    holdouts: dict[str, HoldoutRecord] = {}

    def refuse(line: int, why: str) -> CacheMismatchError:
        return CacheMismatchError(f"{where} line {line}: {why}", hint=_HINT)

    if vset is not None and h.inferences_per_sample is not None:
        groups = len(vset.timing_groups(h.spec.timing.inputs))
        if h.inferences_per_sample != groups:
            raise refuse(1, f"the header says a timed sample is {h.inferences_per_sample} "
                         f"inference(s); with timing.inputs = {h.spec.timing.inputs!r} its "
                         f"validation set gives {groups}")

    for line, record in zip(cache.lines, cache.records, strict=True):
        if isinstance(record, DecisionRecord):
            if decision_line is not None:
                if single_stream is None or single_stream.scenario or not record.scenario:
                    raise refuse(line, f"a second decision (the first is on line "
                                 f"{decision_line})")
                _check_scenario(record, single_stream, trials,
                                functools.partial(refuse, line))
            elif record.scenario:
                raise refuse(line, "a scenario's decision without the single-stream decision "
                             "it follows")
            decision_line, single_stream = line, record
            _check_decision(record, trials, h.baseline_route, functools.partial(refuse, line))
            if record.holdout is not None:
                _check_holdout(record.holdout, h, line, where)
            failed = holdouts.get(record.shipped_route)
            if record.gain and failed is not None and not failed.passed:
                raise refuse(line, f"the decision ships {record.shipped_route!r}, which failed "
                             "the hold-out set")
            continue
        if isinstance(record, HoldoutRecord):
            if decision_line is not None:
                raise refuse(line, f"a hold-out check of {record.route!r} after the decision on "
                             f"line {decision_line}")
            checked = trials[record.trial_index] if 0 <= record.trial_index < len(trials) \
                else None
            if checked is None or checked.route != record.route or not checked.admissible:
                raise refuse(line, f"a hold-out check of {record.route!r} as trial "
                             f"{record.trial_index}, which is not an admissible trial of that "
                             "route before it")
            if h.holdout is None:
                raise refuse(line, "a hold-out check, and the header names no hold-out set")
            _check_holdout(record, h, line, where)
            holdouts[record.route] = record
            continue
        if not isinstance(record, TrialRecord):
            continue  # a session record: times and counts only
        t = record
        if decision_line is not None:
            raise refuse(line, f"trial {t.index} comes after the decision on line {decision_line} "
                         "(a stale decision)")
        if t.index != len(trials):
            raise refuse(line, f"trial index {t.index} where {len(trials)} was expected "
                         "(a duplicated or missing trial line)")
        if (t.index == 0) != (t.role == "baseline"):
            raise refuse(line, "the baseline must be trial 0, and only trial 0" if t.index
                         else f"trial 0 is a {t.role} trial, not the baseline")
        try:
            route = Route.parse(t.route, db)
        except SelectionError as exc:
            raise refuse(line, f"route {t.route!r}: {exc}") from None
        if t.role == "baseline" and route.text() != h.baseline_route:
            raise refuse(line, f"the baseline route {t.route!r} is not the header's "
                         f"{h.baseline_route!r}")
        outside = _outside(route, selection, db)
        if outside:
            raise refuse(line, f"route {t.route!r} lies outside the selection ({outside})")
        if t.role == "confirm":
            first = tried.get(route.text())
            earlier = trials[first] if first is not None else None
            if earlier is None or not earlier.admissible or earlier.engine != t.engine:
                raise refuse(line, f"confirmation of {t.route!r}, which is not an admissible "
                             "trial before it with the same engine")
        elif route.text() in tried:
            raise refuse(line, f"route {t.route!r} was tried already as trial "
                         f"{tried[route.text()]} (a duplicated trial line)")
        else:
            tried[route.text()] = t.index
        why = _engine_problem(t, run_root, digests and t.role != "confirm") or _raced_problem(
            t, h.spec.timing.rounds)
        if why:
            raise refuse(line, why)
        if vset is not None and (t.losses or t.admissible):
            why = _losses_problem(t, vset)
            if why:
                raise refuse(line, why)
        trials.append(t)


def _check_holdout(r: HoldoutRecord, h: CacheHeader, line: int, where: Path) -> None:
    """TuneError (exit 4) naming ``line`` when the hold-out record ``r`` does not follow from
    its own numbers and the header's rule (every loss of every pair below the threshold)."""
    why = _holdout_problem(r, h)
    if why is not None:
        raise TuneError(f"{where} line {line}: the hold-out check of {r.route!r} {why}",
                        hint="the record does not follow from its own losses and the spec's "
                             "rule; run the search again into a new --out, which re-runs the "
                             "hold-out check")


def _holdout_problem(r: HoldoutRecord, h: CacheHeader) -> str | None:
    if h.holdout is not None and r.pairs != h.holdout.size:
        return f"counts {r.pairs} pairs; the header's hold-out set has {h.holdout.size}"
    values = [v for per in (r.losses or {}).values() for v in per.values()]
    finite = [v for v in values if v is not None]
    if any(not math.isfinite(v) for v in finite) or (
            r.worst_loss is not None and not math.isfinite(r.worst_loss)):
        return "holds a loss that is not a finite number"
    if r.losses is not None:
        if len(r.losses) != r.pairs:
            return f"has the losses of {len(r.losses)} pairs and counts {r.pairs}"
        worst = max(finite) if finite else None
        if r.worst_loss != worst:
            return (f"gives a worst loss of {r.worst_loss!r}; the largest of its losses is "
                    f"{worst!r}")
    below = bool(values) and all(v is not None and v < h.threshold for v in values)
    if r.passed and not below:
        return ("is marked passed with no losses" if not values else
                f"is marked passed with a {h.metric} loss of {r.worst_loss!r}, not below the "
                f"threshold {h.threshold:g}" if all(v is not None for v in values) else
                "is marked passed with a NaN or Inf output")
    if not r.passed and below:
        return f"is marked failed with every {h.metric} loss below the threshold {h.threshold:g}"
    return None


def _selection(text: str, db: KnobDatabase, where: Path) -> Selection:
    try:
        return Selection.parse(text, db)
    except SelectionError as exc:
        raise CacheMismatchError(f"{where} line 1: the selection does not fit the knob "
                                 f"database ({exc})", hint=_HINT) from None


def _outside(route: Route, selection: Selection, db: KnobDatabase) -> str:
    items = {i.knob: i for i in selection.items}
    for knob, value in route.values:
        item = items.get(knob)
        if item is None:
            return f"-{knob} is not selected"
        if item.pinned and value != item.values[0]:
            return f"-{knob} is pinned to {item.values[0]!r}"
        if value not in item.values and value != db.get(knob).default:
            return f"{value!r} is not listed for -{knob}"
    return ""


def _engine_problem(t: TrialRecord, run_root: Path, digest: bool) -> str:
    if t.engine is None:
        return "" if not t.engine_digest else "an engine digest without an engine"
    rel = PurePosixPath(t.engine)
    if rel.is_absolute() or "\\" in t.engine or ".." in rel.parts or not rel.parts:
        return f"engine path {t.engine!r} is not a plain path inside the run folder"
    path = run_root.joinpath(*rel.parts)
    real = Path(os.path.realpath(path))
    if real != run_root and run_root not in real.parents:
        return f"engine {t.engine!r} leads out of the run folder (to {real})"
    if not t.engine_digest:
        return f"engine {t.engine!r} has no digest"
    if digest and path.is_file():
        try:
            got, _ = digest_file(path)
        except OSError as exc:
            return f"engine {t.engine!r} cannot be read ({exc.strerror})"
        if got != t.engine_digest:
            return (f"engine {t.engine!r} changed since the search (xxh3-128 {got}, its record "
                    f"says {t.engine_digest})")
    return ""


def _raced_problem(t: TrialRecord, rounds: int) -> str:
    """Why a trial's ``raced`` does not fit it (empty when it does): only a search trial races
    (the baseline's A/A times every round), and a raced one stopped before its last round."""
    if t.raced is None:
        return ""
    if t.role != "search":
        return f"trial {t.index} is a {t.role} trial and says it raced out; only search trials race"
    timed = len(set(t.sample_rounds or ()))
    if timed >= rounds:
        return (f"trial {t.index} says it raced out, yet timed {timed} rounds of "
                f"{rounds}: every one")
    return ""


def _losses_problem(t: TrialRecord, vset: ValidationSet) -> str:
    outputs = {p.name: set(p.references) for p in vset.pairs}
    for pair, losses in (t.losses or {}).items():
        if pair not in outputs:
            return f"losses of trial {t.index} name pair {pair!r}, not in the validation set"
        odd = sorted(set(losses) - outputs[pair])
        if odd:
            return (f"losses of trial {t.index} name output {odd[0]!r}, which pair {pair!r} of "
                    "the validation set does not have (trials of another model?)")
    if t.admissible and t.role != "confirm":  # ok means every pair's every output was judged
        for pair, names in outputs.items():
            lacking = sorted(names - set((t.losses or {}).get(pair, {})))
            if lacking:
                return (f"trial {t.index} is recorded ok without the loss of output "
                        f"{lacking[0]!r} on pair {pair!r} (an edited record)")
    return ""


def _check_scenario(d: DecisionRecord, single: DecisionRecord, trials: list[TrialRecord],
                    refuse: Callable[[str], CacheMismatchError]) -> None:
    """A scenario's decision ships another serving configuration of the engine the
    single-stream decision before it chose: the same engine file, the same baseline."""
    if not 0 <= d.shipped_index < len(trials) or not 0 <= single.shipped_index < len(trials):
        raise refuse(f"the scenario's decision ships trial {d.shipped_index}, which comes after "
                     "it or does not exist")
    mine, theirs = trials[d.shipped_index], trials[single.shipped_index]
    if not mine.engine_digest or mine.engine_digest != theirs.engine_digest \
            or d.baseline_route != single.baseline_route:
        raise refuse(f"the scenario's decision ships {d.shipped_route!r}, which is not a "
                     f"serving configuration of the engine the decision before it chose "
                     f"({single.shipped_route!r})")


def _check_decision(d: DecisionRecord, trials: list[TrialRecord], baseline_route: str,
                    refuse: Callable[[str], CacheMismatchError]) -> None:
    if not trials:
        raise refuse("a decision before any trial (a stale decision)")
    if d.baseline_route != baseline_route:
        raise refuse(f"the decision's baseline {d.baseline_route!r} is not the header's")
    if not 0 <= d.shipped_index < len(trials):
        raise refuse(f"the decision ships trial {d.shipped_index}, which comes after it or "
                     "does not exist (a stale decision)")
    shipped = trials[d.shipped_index]
    if shipped.route != d.shipped_route or not shipped.admissible:
        raise refuse(f"the decision ships {d.shipped_route!r} as trial {d.shipped_index}, "
                     f"which is {shipped.route!r} ({shipped.outcome.value})")
