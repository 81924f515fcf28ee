"""The three data sets of a release, kept apart: calibration, validation and hold-out.

- The **calibration set** (``[calibration]`` in a spec): inputs only, read by the builds of
  routes that need data to build (static quantization computes its activation ranges on it).
- The **validation set** (``[validation]``): pairs of inputs and reference outputs; it gates
  every route during the search (:mod:`dossier.validation`).
- The **hold-out set** (``[holdout]``): pairs never seen during the search; the route about to
  ship is checked on it once more (selection picks the route that passes by luck, the hold-out
  catches it).

No input may be in two of them: calibrating on the data that judges a route, or holding out
data the search already saw, is refused before anything runs (:func:`check_apart`), naming the
samples by the digest of their inputs. :func:`split` makes the three from one validation set,
with a recorded seed.

A calibration set is a folder of ``sample-NNN/inputs.arrow`` (or ``pair-NNN/inputs.arrow``: a
validation set's folder serves too, its references unread), the tensors format of
:mod:`dossier.tensors`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dossier.cache import DataSetIdentity, DecisionRecord
from dossier.errors import InputError, OutputError, ValidationSetError
from dossier.files import write_new_folder
from dossier.hashing import digest_bytes, digest_json
from dossier.knobs import KnobDatabase
from dossier.routes import Route
from dossier.tensors import read_tensors, write_tensors
from dossier.validation import ValidationSet, load_validation_set, set_folder

_SAMPLE = re.compile(r"^(sample|pair)-\d+$")
SPLIT_RECORD = "split.json"
"""What :func:`split` writes beside the three sets: the source, the seed, who went where."""


def inputs_digest(inputs: Mapping[str, np.ndarray]) -> str:
    """xxh3-128 of one sample's inputs (names, dtypes, shapes, bytes): the identity by which
    overlapping samples are found and named."""
    parts = []
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        parts.append([name, str(a.dtype), list(a.shape), digest_bytes(a.tobytes())])
    return digest_json(parts)


@dataclass(frozen=True)
class CalibrationSet:
    """The inputs of a calibration set, in name order."""

    path: Path
    samples: tuple[tuple[str, dict[str, np.ndarray]], ...]
    """(sample name, inputs) each."""

    def digest(self) -> str:
        """xxh3-128 over every sample's inputs, in order."""
        return digest_json([[name, inputs_digest(x)] for name, x in self.samples])

    def feeds(self) -> list[dict[str, np.ndarray]]:
        """The inputs of every sample, in order (what a calibration reader hands out)."""
        return [dict(x) for _, x in self.samples]


def identity(role: str, data: CalibrationSet | ValidationSet) -> DataSetIdentity:
    """The recorded identity of ``data`` in ``role``."""
    size = len(data.samples) if isinstance(data, CalibrationSet) else len(data.pairs)
    return DataSetIdentity(role=role, digest=data.digest(), size=size, path=str(data.path))


def load_calibration_set(path: Path) -> CalibrationSet:
    """Read a calibration set folder; ValidationSetError (exit 3) when it is missing, empty, or
    holds NaN or Inf (ranges computed over them would be meaningless)."""
    path = Path(path)
    if not set_folder(path, "calibration set"):
        raise ValidationSetError(f"calibration set {path} is not a folder")
    names = sorted(p.name for p in path.iterdir() if p.is_dir() and _SAMPLE.match(p.name))
    if not names:
        raise ValidationSetError(f"calibration set {path} is empty: it has no sample-NNN (or "
                                 "pair-NNN) folders",
                                 hint="`dossier validation split` makes one from a validation set")
    samples = []
    for name in names:
        f = path / name / "inputs.arrow"
        if not f.is_file():
            raise ValidationSetError(f"calibration sample {name} has no inputs.arrow ({f})")
        inputs = read_tensors(f)
        check_finite("calibration sample", [(name, inputs)])
        samples.append((name, inputs))
    return CalibrationSet(path, tuple(samples))


def _canonical(arr: np.ndarray, dtype: str | None) -> np.ndarray:
    """``arr`` as the model reads it: cast to the model's input ``dtype`` (when known and the
    cast is possible), floating point widened to float64 with the sign of zero dropped, integers
    and booleans widened to int64. Equal values give equal bytes, whatever dtype they came in."""
    a = np.asarray(arr)
    if dtype is not None and dtype != str(a.dtype):
        try:
            a = a.astype(np.dtype(dtype))
        except (TypeError, ValueError):
            pass
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(np.float64) + 0.0  # -0.0 + 0.0 == +0.0
    if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        return a.astype(np.int64)
    return a


def batch_rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    """How many rows a sample has along its batch dimension (axis 0): the length every input
    shares there; None when an input is a scalar or the inputs disagree (the sample is then
    one row)."""
    lengths = {int(a.shape[0]) if a.ndim else -1 for a in inputs.values()}
    return lengths.pop() if len(lengths) == 1 and -1 not in lengths and inputs else None


def row_digests(inputs: Mapping[str, np.ndarray],
                dtypes: Mapping[str, str] | None = None) -> list[str]:
    """One digest per row of a sample along its batch dimension (:func:`batch_rows`; the whole
    sample when it has none), over every input's canonical values (:func:`_canonical`: the
    dtype the model takes, no sign of zero) and shape: rows equal in value have equal digests,
    however they were batched, ordered or typed. Linear in the sample's size."""
    names = sorted(inputs)
    canon = {n: np.ascontiguousarray(_canonical(inputs[n], (dtypes or {}).get(n)))
             for n in names}
    rows = batch_rows(inputs)
    if rows is None:
        return [digest_json([[n, list(canon[n].shape), digest_bytes(canon[n].tobytes())]
                             for n in names])]
    return [digest_json([[n, list(canon[n].shape[1:]), digest_bytes(canon[n][i].tobytes())]
                         for n in names]) for i in range(rows)]


def check_apart(validation: ValidationSet, calibration: CalibrationSet | None,
                holdout: ValidationSet | None, dtypes: Mapping[str, str] | None = None) -> None:
    """Raise ValidationSetError when inputs are in two of the sets, naming the first few
    samples (and rows) and the digest: calibrating on validation or hold-out data, or holding
    out a validation pair, would let the data that judges a route shape it.

    Samples are compared row by row along the batch dimension and by value
    (:func:`row_digests`, with ``dtypes`` the model's input dtypes by name): a calibration batch
    that concatenates validation inputs, a hold-out pair batched with a validation input, a
    reordered or sliced batch, a ``-0.0`` copy or a copy at another dtype that the model's
    dtype makes equal all overlap. One pass over the data, one dictionary look-up per row."""
    seen: dict[str, tuple[str, str, int, int]] = {}
    clashes: list[str] = []
    sets: list[tuple[str, str, Sequence[tuple[str, Mapping[str, np.ndarray]]]]] = [
        ("validation", "validation pair", [(p.name, p.inputs) for p in validation.pairs])]
    if holdout is not None:
        sets.append(("hold-out", "hold-out pair", [(p.name, p.inputs) for p in holdout.pairs]))
    if calibration is not None:
        sets.append(("calibration", "calibration sample", calibration.samples))
    for role, what, samples in sets:
        for name, inputs in samples:
            digests = row_digests(inputs, dtypes)
            here = f"{what} {name}"
            hits = []
            for i, d in enumerate(digests):
                first = seen.setdefault(d, (role, here, i, len(digests)))
                if first[0] != role:
                    hits.append((i, first, d))
            if not hits:
                continue
            whole = [h for h in hits if h[1][1] == hits[0][1][1] and h[1][2] == h[0]]
            if len(whole) == len(digests) == hits[0][1][3]:  # the same sample, row for row
                clashes.append(f"{here} = {hits[0][1][1]} (inputs {hits[0][2][:12]})")
                continue
            for i, (_, there, row, rows), d in hits:
                clashes.append(f"{here}{f' row {i}' if len(digests) > 1 else ''} = "
                               f"{there}{f' row {row}' if rows > 1 else ''} (inputs {d[:12]})")
    if clashes:
        more = f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
        raise ValidationSetError(
            f"the data sets overlap: {'; '.join(clashes[:3])}{more}",
            hint="calibration, validation and hold-out samples must be distinct, row by row "
                 "along the batch dimension and by value; `dossier validation split` makes "
                 "disjoint sets from one set")


def check_finite(role: str, samples: Sequence[tuple[str, Mapping[str, np.ndarray]]]) -> None:
    """ValidationSetError naming the set, the sample and the input when a floating-point
    input of ``samples`` holds NaN or Inf: a loss computed on it means nothing, and a search
    would run for nothing (checked before the first build)."""
    for name, inputs in samples:
        for key in sorted(inputs):
            arr = inputs[key]
            if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
                raise ValidationSetError(f"{role} {name}: input {key!r} holds NaN or Inf",
                                         hint="every input of the validation, hold-out and "
                                              "calibration sets must be finite")


def check_sets(validation: ValidationSet, calibration: CalibrationSet | None,
               holdout: ValidationSet | None, dtypes: Mapping[str, str] | None = None) -> None:
    """Every input finite (:func:`check_finite`), then the sets apart (:func:`check_apart`):
    what a search checks before its first build."""
    check_finite("validation pair", [(p.name, p.inputs) for p in validation.pairs])
    if holdout is not None:
        check_finite("hold-out pair", [(p.name, p.inputs) for p in holdout.pairs])
    if calibration is not None:
        check_finite("calibration sample", calibration.samples)
    check_apart(validation, calibration, holdout, dtypes)


HOLDOUT_REJECTED = "the faster route failed the hold-out set; the baseline ships"
"""The result of a search whose confirmed-faster route(s) failed the hold-out set."""


def decision_result(d: DecisionRecord) -> str:
    """The decision's result in words: the speedup, :data:`HOLDOUT_REJECTED` when the faster
    route failed the hold-out set (it was faster: "no significant gain" would say otherwise),
    else "no significant gain"."""
    if not d.gain and d.holdout_rejected:
        return HOLDOUT_REJECTED
    return d.result_text()


def numeric_changes(route: str, baseline: str, db: KnobDatabase) -> list[str]:
    """``knob=value`` of ``route`` that differ from ``baseline`` and change the numbers
    (quantization, reduced precision, another execution provider: the knob database says
    which); empty for a route that computes what the baseline does, or routes that cannot be
    read against ``db``."""
    from dossier.errors import DossierError

    try:
        mine = Route.parse(route).effective(db)
        base = Route.parse(baseline).effective(db)
    except DossierError:
        return []
    numeric = {k.name for k in db.knobs if k.changes_numerics}
    return [f"{k}={v}" for k, v in sorted(mine.items()) if k in numeric and base.get(k) != v]


def no_holdout_warning(changes: Sequence[str]) -> str:
    """The warning a release gets when its shipped route changes the numbers (``changes``,
    :func:`numeric_changes`) and no hold-out set checked it."""
    return (f"the shipped route changes the numbers ({', '.join(changes)}) and no hold-out set "
            "checked it: its accuracy was judged only on the validation set that selected it; "
            "name a [holdout] set in the spec (`dossier validation split` makes one)")


@dataclass(frozen=True)
class SplitResult:
    """What :func:`split` wrote."""

    out: Path
    validation: list[str]
    holdout: list[str]
    calibration: list[str]
    seed: int
    kept_together: list[list[str]]
    """Source pairs that share inputs, each group sent to one set."""


def _check_share(share: float, what: str) -> None:
    """InputError unless ``share`` is a finite share below 1 or a whole count, not negative."""
    if not math.isfinite(share):
        raise InputError(f"--{what} {share}: give a share below 1 or a whole number of pairs")
    if share < 0:
        raise InputError(f"--{what} must not be negative (got {share:g})")
    if share >= 1 and share != int(share):
        raise InputError(f"--{what} {share:g}: give a share below 1 or a whole number of pairs")


def _count(share: float, total: int, what: str) -> int:
    _check_share(share, what)
    n = int(round(share * total)) if share < 1 else int(share)
    if share > 0 and n == 0:
        raise InputError(f"--{what} {share:g} of {total} pair(s) rounds to no pair at all",
                         hint=f"give a larger share, a count (--{what} 1), or 0 for none")
    return n


def _groups(vset: ValidationSet) -> list[list[int]]:
    """The pairs of ``vset`` in groups that share inputs (a row equal in value,
    :func:`row_digests`), in order of first appearance: copies of one input go to one set
    together, or the same data would be in two."""
    parent = list(range(len(vset.pairs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, pair in enumerate(vset.pairs):
        for d in row_digests(pair.inputs):
            j = owner.setdefault(d, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(vset.pairs)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def _draw(groups: list[list[int]], seed: int, n_hold: int, n_cal: int
          ) -> tuple[list[int], list[int], list[int]]:
    """Hold-out, calibration and validation pair indices: the groups in a random order (seeded),
    the first ones held out until ``n_hold`` pairs are, the next ones calibrate until ``n_cal``
    do, the rest validate. Without duplicates (every group one pair) this is a plain seeded
    permutation of the pairs."""
    hold: list[int] = []
    cal: list[int] = []
    val: list[int] = []
    for g in np.random.default_rng(seed).permutation(len(groups)):
        group = groups[int(g)]
        if len(hold) < n_hold:
            hold += group
        elif len(cal) < n_cal:
            cal += group
        else:
            val += group
    return sorted(hold), sorted(cal), sorted(val)


_REFERENCE_KEYS = ("method", "reference", "versions", "model")
"""What of a source set's provenance still describes a part of it: how its references were
made. Its file lists and per-pair records describe the source's files, not the part's."""


def split(source: Path, out: Path, *, holdout: float, calibration: float,
          seed: int) -> SplitResult:
    """Split the validation set ``source`` into ``out/validation``, ``out/holdout`` (pairs) and
    ``out/calibration`` (inputs only): ``holdout`` and ``calibration`` are shares (below 1) or
    counts of pairs, drawn at random with ``seed``; the rest validates. Pairs that share inputs
    (equal in value, row by row) go to one set together. ``out/split.json`` records the source's
    digest, the seed and where each pair went; each set's ``provenance.json`` keeps how the
    references were made and adds the split (seed, source digest, which source pairs), so the
    bundle that carries the validation set says where it came from. Written whole or not at
    all (staged beside ``out``); OutputError when ``out`` exists, InputError for a share that
    is not a finite share or count, rounds to no pair, or leaves none to validate, or a
    negative seed."""
    out = Path(out)
    if seed < 0:
        raise InputError(f"--seed {seed}: a seed is a whole number from 0 up")
    _check_share(holdout, "holdout")
    _check_share(calibration, "calibration")
    if out.exists():
        raise OutputError(f"{out} exists already", hint="choose a new folder for the split")
    vset = load_validation_set(Path(source))
    total = len(vset.pairs)
    n_hold = _count(holdout, total, "holdout")
    n_cal = _count(calibration, total, "calibration")
    if n_hold + n_cal >= total:
        raise InputError(f"{source} has {total} pair(s): {n_hold} for the hold-out set and "
                         f"{n_cal} for the calibration set leave none to validate",
                         hint="give smaller shares, or a larger set")
    groups = _groups(vset)
    hold, cal, val = _draw(groups, seed, n_hold, n_cal)
    if not val:
        raise InputError(f"{source}: its pairs share inputs in {len(groups)} group(s) that go "
                         "to one set each, and none is left to validate",
                         hint="give smaller shares, or a larger set")
    names = [p.name for p in vset.pairs]
    together = [[names[i] for i in g] for g in groups if len(g) > 1]
    source_record = {"path": str(Path(source).resolve()), "digest": vset.digest(),
                     "pairs": total}
    record = {
        "tool": "dossier validation split",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source_record,
        "seed": seed,
        "validation": [names[i] for i in val],
        "holdout": [names[i] for i in hold],
        "calibration": [names[i] for i in cal],
        "kept_together": together,
    }

    def provenance(role: str, picked: list[int]) -> dict[str, object]:
        kept = {k: vset.provenance[k] for k in _REFERENCE_KEYS if k in vset.provenance}
        return {**kept, "tool": "dossier validation split", "created_at": record["created_at"],
                "split": {"role": role, "seed": seed, "source": source_record,
                          "from": [names[i] for i in picked]}}

    def fill(stage: Path) -> None:
        for role, picked in (("validation", val), ("holdout", hold)):
            if not picked:
                continue
            (stage / role).mkdir()
            for k, i in enumerate(picked):
                folder = stage / role / f"pair-{k:03d}"
                folder.mkdir()
                pair = vset.pairs[i]
                write_tensors(folder / "inputs.arrow", pair.inputs)
                write_tensors(folder / "references.arrow", pair.references)
            (stage / role / "provenance.json").write_text(
                json.dumps(provenance(role, picked), indent=2) + "\n", encoding="utf-8")
        if cal:
            (stage / "calibration").mkdir()
        for k, i in enumerate(cal):
            folder = stage / "calibration" / f"sample-{k:03d}"
            folder.mkdir()
            write_tensors(folder / "inputs.arrow", vset.pairs[i].inputs)
        (stage / SPLIT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    write_new_folder(out, fill, "split")
    return SplitResult(out, record["validation"], record["holdout"],  # type: ignore[arg-type]
                       record["calibration"], seed, together)  # type: ignore[arg-type]
