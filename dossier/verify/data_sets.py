"""The bundle's data-set records, cross-checked: ``datasets.json`` against the search record
(the tuning cache's header and decision) and against the files the bundle carries.

The integrity check proves that each file is the one the manifest lists; it cannot see a
bundle whose manifest was rewritten after its ``holdout/`` folder was removed, or whose records
contradict each other. These do, each one a finding (INVALID: the bundle is not the release it
says it is):

- a data set the search used that ``datasets.json`` does not record, or the reverse, or the
  two with different digests or sizes;
- a recorded set whose folder is missing, holds another number of pairs, or whose tensors
  have another digest than the one recorded;
- hold-out checks that contradict each other (``datasets.json`` and the tuning cache's
  decision), a check of another route than the shipped one, or a check marked passed whose own
  loss is at or above the threshold (or NaN/Inf).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dossier.cache import DataSetIdentity, HoldoutRecord
from dossier.errors import DossierError
from dossier.files import read_small
from dossier.host.policy import Finding, Verdict

if TYPE_CHECKING:
    from dossier.bundle import Bundle

DATASETS_JSON = "datasets.json"
_MAX = 1 << 24


class _Record(BaseModel):
    """``datasets.json`` as the writer writes it (fields a newer writer adds are ignored)."""

    model_config = ConfigDict(extra="ignore")

    sets: list[DataSetIdentity] = []
    holdout_check: HoldoutRecord | None = None
    holdout_rejected: list[str] = []


def _finding(field: str, recorded: object, found: object, reason: str) -> Finding:
    return Finding(field=f"datasets.{field}", bundle_value=_text(recorded),
                   host_value=_text(found), verdict=Verdict.INVALID, reason=reason)


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)[:200]


def dataset_findings(bundle: Bundle) -> list[Finding]:
    """What does not fit in the bundle's data-set records (empty: they agree)."""
    table = bundle.manifest.table()
    try:
        cache = bundle.tuning_cache()
    except DossierError:
        return []  # the search record is unreadable: other steps say so in their words
    record = _Record()
    if DATASETS_JSON in table:
        try:
            record = _Record.model_validate_json(read_small(bundle.file(DATASETS_JSON), _MAX,
                                                            follow=False))
        except (OSError, ValidationError, DossierError) as exc:
            return [_finding("record", DATASETS_JSON, None,
                             f"{DATASETS_JSON} cannot be read ({str(exc).splitlines()[0]})")]
    header, decision = cache.header, cache.decision
    threshold = bundle.manifest.summary.threshold
    out: list[Finding] = []
    recorded = {s.role: s for s in record.sets}
    for role, used in (("holdout", header.holdout), ("calibration", header.calibration)):
        rec = recorded.get(role)
        if used is None and rec is None:
            continue
        if rec is None or used is None:
            out.append(_finding(role, rec and rec.digest, used and used.digest,
                                f"the search {'used' if used else 'did not use'} a {role} set "
                                f"and {DATASETS_JSON} {'does not record' if used else 'records'}"
                                " one"))
            continue
        if (rec.digest, rec.size) != (used.digest, used.size):
            out.append(_finding(role, [rec.digest, rec.size], [used.digest, used.size],
                                f"{DATASETS_JSON} and the search record disagree on the {role} "
                                "set (digest, size)"))
        out += _files(bundle, table, role, rec)
    out += _holdout_checks(record, decision, header.holdout is not None,
                           bundle.manifest.summary.shipped_route, threshold)
    return out


def _files(bundle: Bundle, table: dict[str, Any], role: str,
           rec: DataSetIdentity) -> list[Finding]:
    """The set's folder against its record: present, as many samples, the same digest."""
    from dossier.datasets import load_calibration_set
    from dossier.validation import load_validation_set

    folder = role
    names = {rel.split("/")[1] for rel in table if rel.startswith(f"{folder}/")
             and rel.count("/") >= 2}
    if not names:
        return [_finding(role, f"{rec.size} sample(s)", "no files",
                         f"the bundle records a {role} set of {rec.size} but its {folder}/ "
                         "folder is gone")]
    if any(rel in bundle.absent for rel in table if rel.startswith(f"{folder}/")):
        return []  # not copied for this command: the integrity check read each file already
    try:
        path = bundle.folder(folder)
        data = load_validation_set(path) if role == "holdout" else load_calibration_set(path)
    except DossierError as exc:
        return [_finding(role, rec.digest, None, f"the {folder}/ folder cannot be read as a "
                         f"{role} set ({str(exc).splitlines()[0]})")]
    size = len(data.pairs) if role == "holdout" else len(data.samples)  # type: ignore[union-attr]
    digest = data.digest()
    if (digest, size) != (rec.digest, rec.size):
        return [_finding(role, [rec.digest, rec.size], [digest, size],
                         f"the {folder}/ folder is not the {role} set the bundle records "
                         "(digest, size)")]
    return []


def _holdout_checks(record: _Record, decision: Any, had_holdout: bool, shipped: str,
                    threshold: float) -> list[Finding]:
    out: list[Finding] = []
    cached = decision.holdout if decision is not None else None
    mine = record.holdout_check
    if had_holdout and cached is None:
        out.append(_finding("holdout_check", None, None, "the search had a hold-out set but "
                            "records no hold-out check of the shipped route"))
    if (mine is None) != (cached is None) or (
            mine is not None and cached is not None
            and mine.model_dump(mode="json") != cached.model_dump(mode="json")):
        out.append(_finding("holdout_check", mine and mine.model_dump(mode="json"),
                            cached and cached.model_dump(mode="json"),
                            f"contradictory hold-out records: {DATASETS_JSON} and the tuning "
                            "cache's decision disagree"))
    if decision is not None and record.holdout_rejected != list(decision.holdout_rejected) \
            and (record.sets or mine is not None):
        out.append(_finding("holdout_rejected", record.holdout_rejected,
                            list(decision.holdout_rejected),
                            f"contradictory hold-out records: {DATASETS_JSON} and the tuning "
                            "cache's decision name other routes that failed the hold-out set"))
    for where, check in ((DATASETS_JSON, mine), ("the tuning cache", cached)):
        if check is None:
            continue
        if check.route != shipped:
            out.append(_finding("holdout_check.route", check.route, shipped,
                                f"the hold-out check in {where} is of another route than the "
                                "shipped one"))
        if check.passed:
            worst = _worst(check)
            if worst is None or worst >= threshold:
                out.append(_finding("holdout_check.passed", "passed",
                                    "NaN/Inf" if worst is None else f"{worst:g}",
                                    f"the hold-out check in {where} is marked passed, but its "
                                    f"loss {'NaN/Inf' if worst is None else f'{worst:g}'} is "
                                    f"at or above the threshold {threshold:g}"))
    return out


def _worst(check: HoldoutRecord) -> float | None:
    """The largest loss a check records (its ``worst_loss`` and every per-pair loss); None
    when one is NaN/Inf (recorded as null), 0 when none is recorded."""
    values: list[float | None] = [check.worst_loss] if check.worst_loss is not None else []
    for per_output in (check.losses or {}).values():
        values += list(per_output.values())
    if any(v is None for v in values):
        return None
    return max((float(v) for v in values if v is not None), default=0.0)
