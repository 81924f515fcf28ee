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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dossier.cache import DataSetIdentity
from dossier.errors import InputError, OutputError, ValidationSetError
from dossier.files import write_new_folder
from dossier.hashing import digest_bytes, digest_json
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
        for key, arr in inputs.items():
            if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
                raise ValidationSetError(f"calibration sample {name}: input {key!r} holds NaN "
                                         "or Inf", hint="calibration inputs must be finite")
        samples.append((name, inputs))
    return CalibrationSet(path, tuple(samples))


def check_apart(validation: ValidationSet, calibration: CalibrationSet | None,
                holdout: ValidationSet | None) -> None:
    """Raise ValidationSetError when a sample's inputs are in two of the sets, naming the first
    few by digest: calibrating on validation or hold-out data, or holding out a validation
    pair, would let the data that judges a route shape it."""
    seen: dict[str, str] = {}
    for pair in validation.pairs:
        seen.setdefault(inputs_digest(pair.inputs), f"validation pair {pair.name}")
    sets: list[tuple[str, Sequence[tuple[str, Mapping[str, np.ndarray]]]]] = []
    if holdout is not None:
        sets.append(("hold-out pair", [(p.name, p.inputs) for p in holdout.pairs]))
    if calibration is not None:
        sets.append(("calibration sample", calibration.samples))
    for what, samples in sets:
        clashes = []
        for name, inputs in samples:
            d = inputs_digest(inputs)
            if d in seen:
                clashes.append(f"{what} {name} = {seen[d]} (inputs {d[:12]})")
            else:
                seen[d] = f"{what} {name}"
        if clashes:
            more = f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
            raise ValidationSetError(
                f"the data sets overlap: {'; '.join(clashes[:3])}{more}",
                hint="calibration, validation and hold-out samples must be distinct; "
                     "`dossier validation split` makes disjoint sets from one set")


@dataclass(frozen=True)
class SplitResult:
    """What :func:`split` wrote."""

    out: Path
    validation: list[str]
    holdout: list[str]
    calibration: list[str]
    seed: int


def _count(share: float, total: int, what: str) -> int:
    if share < 0:
        raise InputError(f"--{what} must not be negative (got {share:g})")
    n = int(round(share * total)) if share < 1 else int(share)
    if share >= 1 and share != int(share):
        raise InputError(f"--{what} {share:g}: give a share below 1 or a whole number of pairs")
    return n


def split(source: Path, out: Path, *, holdout: float, calibration: float,
          seed: int) -> SplitResult:
    """Split the validation set ``source`` into ``out/validation``, ``out/holdout`` (pairs) and
    ``out/calibration`` (inputs only): ``holdout`` and ``calibration`` are shares (below 1) or
    counts of pairs, drawn at random with ``seed``; the rest validates. ``out/split.json``
    records the source's digest, the seed and where each pair went. Written whole or not at
    all (staged beside ``out``); OutputError when ``out`` exists, InputError when a set would
    be empty."""
    out = Path(out)
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
    order = np.random.default_rng(seed).permutation(total)
    hold = sorted(int(i) for i in order[:n_hold])
    cal = sorted(int(i) for i in order[n_hold:n_hold + n_cal])
    val = sorted(int(i) for i in order[n_hold + n_cal:])
    names = [p.name for p in vset.pairs]
    record = {
        "tool": "dossier validation split",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": {"path": str(Path(source).resolve()), "digest": vset.digest(),
                   "pairs": total},
        "seed": seed,
        "validation": [names[i] for i in val],
        "holdout": [names[i] for i in hold],
        "calibration": [names[i] for i in cal],
    }
    def fill(stage: Path) -> None:
        for role, picked in (("validation", val), ("holdout", hold)):
            (stage / role).mkdir()
            for k, i in enumerate(picked):
                folder = stage / role / f"pair-{k:03d}"
                folder.mkdir()
                pair = vset.pairs[i]
                write_tensors(folder / "inputs.arrow", pair.inputs)
                write_tensors(folder / "references.arrow", pair.references)
            if vset.provenance:
                (stage / role / "provenance.json").write_text(
                    json.dumps(vset.provenance, indent=2) + "\n", encoding="utf-8")
        if cal:
            (stage / "calibration").mkdir()
        for k, i in enumerate(cal):
            folder = stage / "calibration" / f"sample-{k:03d}"
            folder.mkdir()
            write_tensors(folder / "inputs.arrow", vset.pairs[i].inputs)
        (stage / SPLIT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    write_new_folder(out, fill, "split")
    return SplitResult(out, record["validation"], record["holdout"],  # type: ignore[arg-type]
                       record["calibration"], seed)  # type: ignore[arg-type]
