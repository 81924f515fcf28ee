"""The bundle's Parquet tables: every trial, every raw timing sample, the shape distribution.

Columns are fixed per format version (see :data:`ROUTES_COLUMNS`, :data:`TIMINGS_SCHEMA`,
:data:`SHAPES_SCHEMA`) except the ``knob:<name>`` columns of ``routes.parquet``: one per knob of
the selection, holding the route's effective value (the default where the route does not name
the knob). The tables are plain Parquet (pyarrow writes them; pandas, duckdb and polars read
them); no pickle, no pandas metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dossier.knobs import KnobDatabase
from dossier.routes import Route
from dossier.spec import ShapeEntry
from dossier.trial import TrialRecord

ROUTES = "routes.parquet"
TIMINGS = "timings.parquet"
SHAPES = "shapes.parquet"
KNOB_PREFIX = "knob:"
"""Prefix of the per-knob columns of routes.parquet."""

LOSS_TYPE = pa.list_(pa.struct([("pair", pa.string()), ("output", pa.string()),
                                ("loss", pa.float64())]))
"""One loss per validation pair and output tensor (null loss: the output held NaN/Inf)."""

_F64, _I64, _STR, _BOOL = pa.float64(), pa.int64(), pa.string(), pa.bool_()
ROUTES_HEAD = [("index", _I64), ("role", _STR), ("route", _STR)]
ROUTES_TAIL = [
    ("outcome", _STR), ("reason", _STR), ("worst_loss", _F64), ("losses", LOSS_TYPE),
    ("median_ms", _F64), ("ci_low_ms", _F64), ("ci_high_ms", _F64), ("mean_ms", _F64),
    ("p10_ms", _F64), ("p90_ms", _F64), ("n", _I64), ("warmup_runs", _I64),
    ("baseline_median_ms", _F64), ("speedup", _F64), ("speedup_ci_low", _F64),
    ("speedup_ci_high", _F64), ("p_value", _F64), ("faster", _BOOL), ("slower", _BOOL),
    ("build_s", _F64), ("trial_s", _F64), ("rank", _I64), ("shipped", _BOOL),
    ("engine_digest", _STR), ("started_at", _STR),
]
"""routes.parquet columns: ROUTES_HEAD, one ``knob:<name>`` string column per selected knob,
then these. ``rank`` is the position among admissible search routes by screened speedup
(1 = fastest), null for every other trial."""
ROUTES_COLUMNS = [name for name, _ in ROUTES_HEAD + ROUTES_TAIL]

TIMINGS_SCHEMA = pa.schema([("trial", _I64), ("role", _STR), ("route", _STR), ("series", _STR),
                            ("sample", _I64), ("ms", _F64)])
"""timings.parquet: long format, one row per raw sample; ``series`` is ``candidate`` (the
trial's engine) or ``baseline`` (the baseline timed interleaved with it)."""

SHAPES_SCHEMA = pa.schema([("entry", _I64), ("weight", _F64), ("input", _STR),
                           ("dims", pa.list_(_I64))])
"""shapes.parquet: one row per input of each shape entry of the release spec."""


def ranks(trials: Sequence[TrialRecord]) -> dict[int, int]:
    """Trial index -> rank among admissible search trials by screened speedup (1 = best)."""
    ok = [t for t in trials if t.role == "search" and t.admissible and t.comparison is not None]
    ok.sort(key=lambda t: (-t.comparison.speedup, t.index))  # type: ignore[union-attr]
    return {t.index: i for i, t in enumerate(ok, start=1)}


def routes_table(trials: Sequence[TrialRecord], knobs: Sequence[str], db: KnobDatabase,
                 shipped_index: int) -> pa.Table:
    """One row per trial."""
    rank = ranks(trials)
    cols: dict[str, list[Any]] = {name: [] for name, _ in ROUTES_HEAD + ROUTES_TAIL}
    knob_cols: dict[str, list[Any]] = {KNOB_PREFIX + k: [] for k in knobs}
    for t in trials:
        effective = Route.parse(t.route).effective(db)
        for k in knobs:
            knob_cols[KNOB_PREFIX + k].append(effective.get(k))
        tm, c = t.timing, t.comparison
        row = {
            "index": t.index, "role": t.role, "route": t.route, "outcome": t.outcome.value,
            "reason": t.reason, "worst_loss": t.worst_loss,
            "losses": None if t.losses is None else [
                {"pair": p, "output": o, "loss": v}
                for p, per in sorted(t.losses.items()) for o, v in sorted(per.items())],
            "median_ms": tm and tm.median_ms, "ci_low_ms": tm and tm.ci_low_ms,
            "ci_high_ms": tm and tm.ci_high_ms, "mean_ms": tm and tm.mean_ms,
            "p10_ms": tm and tm.p10_ms, "p90_ms": tm and tm.p90_ms, "n": tm and tm.n,
            "warmup_runs": tm and tm.warmup_runs,
            "baseline_median_ms": c and c.baseline.median_ms, "speedup": c and c.speedup,
            "speedup_ci_low": c and c.speedup_ci_low, "speedup_ci_high": c and c.speedup_ci_high,
            "p_value": c and c.p_value, "faster": c and c.faster, "slower": c and c.slower,
            "build_s": t.build_s, "trial_s": t.trial_s, "rank": rank.get(t.index),
            "shipped": t.index == shipped_index, "engine_digest": t.engine_digest,
            "started_at": t.started_at,
        }
        for name, value in row.items():
            cols[name].append(value)
    fields = ROUTES_HEAD + [(n, _STR) for n in knob_cols] + ROUTES_TAIL
    data = {**{n: cols[n] for n, _ in ROUTES_HEAD}, **knob_cols,
            **{n: cols[n] for n, _ in ROUTES_TAIL}}
    schema = pa.schema(fields)
    return pa.table({n: pa.array(data[n], type=schema.field(n).type) for n in schema.names},
                    schema=schema)


def timings_table(trials: Sequence[TrialRecord]) -> pa.Table:
    """Every raw timing sample, long format."""
    cols: dict[str, list[Any]] = {n: [] for n in TIMINGS_SCHEMA.names}
    for t in trials:
        for series, samples in (("candidate", t.samples_ms), ("baseline", t.baseline_samples_ms)):
            for i, ms in enumerate(samples or ()):
                for name, value in zip(TIMINGS_SCHEMA.names,
                                       (t.index, t.role, t.route, series, i, ms)):
                    cols[name].append(value)
    return pa.table(cols, schema=TIMINGS_SCHEMA)


def shapes_table(shapes: Sequence[ShapeEntry]) -> pa.Table:
    """The shape distribution, one row per (entry, input)."""
    cols: dict[str, list[Any]] = {n: [] for n in SHAPES_SCHEMA.names}
    for i, entry in enumerate(shapes):
        for name, dims in sorted(entry.inputs.items()):
            for col, value in zip(SHAPES_SCHEMA.names, (i, entry.weight, name, list(dims))):
                cols[col].append(value)
    return pa.table(cols, schema=SHAPES_SCHEMA)


def write_table(table: pa.Table, path: Path) -> None:
    """Write ``table`` as Parquet, deterministically (same table, same bytes)."""
    pq.write_table(table, str(path), compression="zstd")


def read_table(path: Path) -> pa.Table:
    """Read a bundle table."""
    return pq.read_table(str(path))
