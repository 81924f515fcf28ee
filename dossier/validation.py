"""Validation sets, accuracy metrics and the admissibility decision.

A validation set is a folder of pairs ``pair-NNN/inputs.arrow`` + ``pair-NNN/references.arrow``
(see :mod:`dossier.tensors`), plus an optional ``provenance.json`` saying how the references
were made. Losses follow trtexec's definitions, per output tensor (lower is better):

- ``l0``: fraction of elements with ``|a - r| > atol + rtol * |r|``
- ``l1``: mean absolute error
- ``l2``: mean squared error
- ``linf``: maximum absolute error
- ``cos``: ``1 - cosine similarity``, scale-free (0 for two all-zero tensors, 1 for one)

A route is admissible when every loss of every pair is below the threshold (trtexec fails at
``loss >= threshold``) and no output holds NaN or Inf. Every pair's losses are kept (trtexec
keeps only the last pair's).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from dossier.errors import ValidationSetError
from dossier.files import read_small
from dossier.hashing import digest_json
from dossier.tensors import read_tensors

Metric = Literal["l0", "l1", "l2", "linf", "cos"]
"""Loss metrics (see :func:`loss`)."""
METRICS: tuple[str, ...] = get_args(Metric)
_PAIR = re.compile(r"^pair-\d+$")


@dataclass(frozen=True)
class Pair:
    """One validation pair."""

    name: str
    inputs: dict[str, np.ndarray]
    references: dict[str, np.ndarray]


@dataclass(frozen=True)
class ValidationSet:
    """The pairs of a validation set, in name order."""

    path: Path
    pairs: tuple[Pair, ...]
    provenance: dict[str, object] = field(default_factory=dict)

    def digest(self) -> str:
        """xxh3-128 over every tensor's name, dtype, shape and bytes, pair by pair."""
        from dossier.hashing import digest_bytes

        parts = []
        for p in self.pairs:
            for role, tensors in (("in", p.inputs), ("ref", p.references)):
                for name in sorted(tensors):
                    a = np.ascontiguousarray(tensors[name])
                    parts.append([p.name, role, name, str(a.dtype), list(a.shape),
                                  digest_bytes(a.tobytes())])
        return digest_json(parts)


    def timing_groups(self, inputs: Literal["shapes", "pairs"]) -> tuple[tuple[Pair, ...], ...]:
        """The pairs a timed sample runs, grouped: one inference per group each sample, the
        pairs of a group taking turns (``TimingSettings.inputs``). ``shapes``: the pairs
        grouped by their inputs' names, shapes and dtypes, in order of first appearance;
        ``pairs``: every pair a group of its own."""
        if inputs == "pairs":
            return tuple((p,) for p in self.pairs)
        groups: dict[tuple[tuple[str, str, tuple[int, ...]], ...], list[Pair]] = {}
        for p in self.pairs:
            key = tuple(sorted((n, str(a.dtype), tuple(a.shape)) for n, a in p.inputs.items()))
            groups.setdefault(key, []).append(p)
        return tuple(tuple(g) for g in groups.values())


def set_folder(path: Path, what: str) -> bool:
    """Whether the data set folder ``path`` is a folder; ValidationSetError (exit 3, one line)
    when it cannot even be looked up: a name longer than NAME_MAX, a symbolic link loop."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        shown = str(path) if len(str(path)) <= 200 else str(path)[:200] + "..."
        raise ValidationSetError(f"{what} {shown}: {exc.strerror or exc}",
                                 hint="name a folder whose path the system can look up") \
            from None


def load_validation_set(path: Path, what: str = "validation set") -> ValidationSet:
    """Load and sanity-check a validation set folder (``what``: how a refusal of its folder
    names it, e.g. ``hold-out set``).

    Raises ValidationSetError when the folder is missing, has no pairs, a pair lacks a file,
    or a reference holds NaN or Inf.
    """
    path = Path(path)
    if not set_folder(path, what):
        raise ValidationSetError(f"{what} {path} is not a folder")
    names = sorted(p.name for p in path.iterdir() if p.is_dir() and _PAIR.match(p.name))
    if not names:
        raise ValidationSetError(f"validation set {path} has no pair-NNN folders")
    pairs = []
    for name in names:
        files = {role: path / name / f"{role}.arrow" for role in ("inputs", "references")}
        for role, f in files.items():
            if not f.is_file():
                raise ValidationSetError(f"validation pair {name} has no {role}.arrow ({f})")
        inputs, refs = read_tensors(files["inputs"]), read_tensors(files["references"])
        for out, ref in refs.items():
            if np.issubdtype(ref.dtype, np.inexact) and not np.all(np.isfinite(ref)):
                raise ValidationSetError(
                    f"validation pair {name}: reference {out!r} holds NaN or Inf",
                    hint="references must be finite; recompute them")
        pairs.append(Pair(name, inputs, refs))
    provenance: dict[str, object] = {}
    prov = path / "provenance.json"
    if prov.is_file():
        try:
            provenance = json.loads(read_small(prov, 1 << 20, follow=False).decode("utf-8"))
        except OSError as exc:
            raise ValidationSetError(f"{prov}: {exc.strerror or exc}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ValidationSetError(f"{prov}: not valid JSON ({exc})") from exc
        if not isinstance(provenance, dict):
            raise ValidationSetError(f"{prov}: not a JSON object")
    return ValidationSet(path, tuple(pairs), provenance)


def loss(metric: str, output: np.ndarray, reference: np.ndarray, *, atol: float = 1e-5,
         rtol: float = 1e-5) -> float | None:
    """The loss of one output tensor against its reference; None when the output holds NaN/Inf."""
    a = np.asarray(output, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        return None
    d = a - r
    if metric == "l0":
        return float(np.mean(np.abs(d) > atol + rtol * np.abs(r))) if d.size else 0.0
    if metric == "l1":
        return float(np.mean(np.abs(d))) if d.size else 0.0
    if metric == "l2":
        return float(np.mean(d * d)) if d.size else 0.0
    if metric == "linf":
        return float(np.max(np.abs(d))) if d.size else 0.0
    if metric == "cos":
        # scale-free: each side divided by its largest magnitude first, so outputs of 1e-9
        # are judged like outputs of 1; a zero vector has no direction: all-zero against
        # all-zero is equal (0), all-zero against anything else is as far as orthogonal (1)
        sa, sr = float(np.max(np.abs(a), initial=0.0)), float(np.max(np.abs(r), initial=0.0))
        if sa == 0.0 or sr == 0.0:
            return 0.0 if sa == sr else 1.0
        an, rn = a.ravel() / sa, r.ravel() / sr
        return float(1.0 - np.dot(an, rn) / (np.linalg.norm(an) * np.linalg.norm(rn)))
    raise ValidationSetError(f"unknown metric {metric!r}", hint=f"use one of: {', '.join(METRICS)}")


@dataclass(frozen=True)
class AccuracyResult:
    """Losses of one route over a validation set, and the verdict."""

    losses: dict[str, dict[str, float | None]]
    threshold: float
    metric: str
    failure: str | None
    """None when admissible; else which pair, which output, which loss (or NaN/Inf)."""

    def __bool__(self) -> bool:
        return self.failure is None

    @property
    def worst(self) -> float | None:
        """The largest finite loss, or None if there is none."""
        vals = [v for per in self.losses.values() for v in per.values() if v is not None]
        return max(vals) if vals else None


def worst_by_output(losses: Mapping[str, Mapping[str, float | None]] | None
                    ) -> dict[str, tuple[str, float | None]]:
    """Per output tensor, the pair with the largest loss and that loss (None: NaN/Inf, which
    counts as the worst), outputs in name order."""
    worst: dict[str, tuple[str, float | None]] = {}
    for pair in sorted(losses or {}):
        for out, value in (losses or {})[pair].items():
            seen = worst.get(out)
            if seen is None or (seen[1] is not None and (value is None or value > seen[1])):
                worst[out] = (pair, value)
    return dict(sorted(worst.items()))


def judge(outputs: Mapping[str, Mapping[str, np.ndarray]], vset: ValidationSet, metric: str,
          threshold: float, *, atol: float = 1e-5, rtol: float = 1e-5) -> AccuracyResult:
    """Compare ``outputs`` (per pair name, per output name) with the references."""
    losses: dict[str, dict[str, float | None]] = {}
    failure = None
    for pair in vset.pairs:
        got = outputs[pair.name]
        per: dict[str, float | None] = {}
        for out, ref in pair.references.items():
            if out not in got:
                raise ValidationSetError(f"the engine produced no output {out!r} "
                                         f"(reference in {pair.name})")
            if tuple(got[out].shape) != tuple(ref.shape):
                raise ValidationSetError(
                    f"{pair.name}: output {out!r} has shape {tuple(got[out].shape)}, "
                    f"reference has {tuple(ref.shape)}")
            value = loss(metric, got[out], ref, atol=atol, rtol=rtol)
            per[out] = value
            if failure is None:
                if value is None:
                    failure = f"{pair.name}: output {out!r} holds NaN or Inf"
                elif value >= threshold:
                    failure = (f"{pair.name}: output {out!r} {metric} loss {value:.3g} "
                               f">= threshold {threshold:.3g}"
                               + (_zero_note(got[out], ref) if metric == "cos" else ""))
        losses[pair.name] = per
    return AccuracyResult(losses, threshold, metric, failure)


def _zero_note(output: np.ndarray, reference: np.ndarray) -> str:
    """Why a cos loss is 1 when one side is all zeros (a zero vector has no direction)."""
    zero_out, zero_ref = not np.any(output), not np.any(reference)
    if zero_out and not zero_ref:
        return " (the output is all zeros, the reference is not)"
    if zero_ref and not zero_out:
        return (" (the reference is all zeros, the output is not: cos cannot judge an all-zero "
                "reference; use linf or l1 for it)")
    return ""
