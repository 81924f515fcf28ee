"""The tuning cache: an append-only JSON Lines record of a search.

Line 1 is a :class:`CacheHeader` (what was searched, with digests of every input); each later
line is a :class:`~dossier.trial.TrialRecord`, a :class:`SessionRecord` (one per run of
``tune`` or ``tune --continue``, with its wall time), or the final :class:`DecisionRecord`.
Each line is written whole, flushed and fsynced before the search goes on, so a killed search
loses at most the trial in flight. A torn last line (the process died mid-write) is dropped on
resume.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from dossier.diskfull import host_io
from dossier.errors import CacheMismatchError, InputError
from dossier.measure.figure import speedup_text
from dossier.measure.timing import TimingSettings
from dossier.spec import DeploymentSection, ReleaseSpec, ShapeEntry
from dossier.trial import Reading, Shipped, TrialRecord
from dossier.version import __version__

CACHE_FORMAT: Literal[2] = 2
"""Format of the caches written now; format 1 caches are read too (:class:`CacheHeader`)."""
READ_FORMATS = (1, 2)
"""Cache formats this version reads."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileIdentity(_Model):
    """A file by name, size and content digest."""

    path: str
    """Path as given (absolute at tuning time)."""
    size: int
    """Size in bytes."""
    digest: str
    """xxh3-128 of the content."""


class DataSetIdentity(_Model):
    """What a search records of one of its data sets: enough to name it and to notice that it
    changed."""

    role: str
    """``calibration``, ``validation`` or ``holdout``."""
    digest: str
    """xxh3-128 over its tensors (:meth:`CalibrationSet.digest`, :meth:`ValidationSet.digest`)."""
    size: int
    """Samples (calibration) or pairs."""
    path: str
    """Where it was read from."""


def _pairs_before_inputs(data: Any) -> Any:
    """A header written before ``[timing] inputs`` (it has no ``inferences_per_sample``) timed
    a pass over every pair a sample: read its spec as ``inputs = "pairs"``, so a resume, a
    re-timing and every latency divide and time as the samples were taken."""
    if not isinstance(data, dict) or "inferences_per_sample" in data \
            or not isinstance(data.get("spec"), dict):
        return data
    spec = dict(data["spec"])
    timing = spec.get("timing", {})
    if isinstance(timing, dict) and "inputs" not in timing:
        spec["timing"] = {**timing, "inputs": "pairs"}
    return {**data, "spec": spec}


class CacheHeader(_Model):
    """First line of a tuning cache: everything the search depends on.

    Format 2 keeps the release spec the search ran (:meth:`ReleaseSpec.resolved`) as one model,
    ``spec``; format 1 spread its settings over the header. A format 1 header is read into
    the format 2 model (:func:`_from_format_1`), so old caches resume and old bundles read; the
    file itself keeps its bytes."""

    kind: Literal["header"] = "header"
    """Record type tag."""
    cache_format: Literal[2] = CACHE_FORMAT
    """Format version of this file (a format 1 header reads as 2)."""
    tool_version: str
    """dossier version that started the search."""
    created_at: str
    """UTC time the search started, ISO 8601."""
    spec: ReleaseSpec
    """The release spec as the search runs it: absolute paths, the selection canonical."""
    tuner_version: str
    """Version of the knob source (ORT / torch / TensorRT tuner)."""
    knob_db_digest: str
    """xxh3-128 of the knob database."""
    model: FileIdentity
    """The model tuned."""
    validation_digest: str
    """xxh3-128 over every tensor of the validation set."""
    validation_pairs: int
    """Number of validation pairs."""
    inferences_per_sample: int | None = Field(None, ge=1)
    """Inferences in one timed sample (``spec.timing.inputs``: one per input shape, or one per
    pair); None in records from before the setting, whose samples ran every pair
    (:attr:`per_sample`)."""
    baseline_route: str
    """The baseline route (pinned knobs pinned, varied knobs at default)."""
    calibration: DataSetIdentity | None = None
    """The calibration set builds read (None: the spec names none)."""
    holdout: DataSetIdentity | None = None
    """The hold-out set the route about to ship is checked on (None: the spec names none)."""
    warm_start: list[str] = Field(default_factory=list)
    """Routes measured first, before the strategy's own (a re-tune starts from the last
    release's best routes)."""
    parent: str | None = None
    """Dossier id of the bundle a re-tune started from."""
    spec_path: str | None = None
    """The release spec the search came from."""
    host: dict[str, str] = Field(default_factory=dict)
    """Summary of the tuning host (hostname, CPU, backend stack)."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("cache_format") == 1:
            data = _from_format_1(data)
        return _pairs_before_inputs(data)

    @property
    def per_sample(self) -> int:
        """Inferences in one timed sample: every latency is a sample divided by them."""
        return self.inferences_per_sample or self.validation_pairs

    # Read-only shortcuts into ``spec`` for the fields readers use most.
    @property
    def release(self) -> str:
        """Release name."""
        return self.spec.release.name

    @property
    def release_version(self) -> int:
        """Release version."""
        return self.spec.release.version

    @property
    def description(self) -> str:
        """Release description."""
        return self.spec.release.description

    @property
    def backend(self) -> str:
        """Backend name."""
        return self.spec.tune.backend

    @property
    def strategy(self) -> str:
        """Strategy name."""
        return self.spec.tune.strategy

    @property
    def selection(self) -> str:
        """The selection, canonical trtexec syntax."""
        return self.spec.tune.selection

    @property
    def metric(self) -> str:
        """Loss metric."""
        return self.spec.tune.metric

    @property
    def threshold(self) -> float:
        """A route is admissible when every loss is below this."""
        return self.spec.tune.threshold

    @property
    def atol(self) -> float:
        """Absolute tolerance (l0 only)."""
        return self.spec.tune.atol

    @property
    def rtol(self) -> float:
        """Relative tolerance (l0 only)."""
        return self.spec.tune.rtol

    @property
    def timing(self) -> TimingSettings:
        """How trials are timed and compared."""
        return self.spec.timing

    @property
    def validation_path(self) -> str:
        """The validation set folder."""
        return self.spec.validation.path

    @property
    def shapes(self) -> list[ShapeEntry]:
        """Shape distribution the release is tuned for."""
        return self.spec.shapes

    @property
    def deployment(self) -> DeploymentSection:
        """Expected use (for the cost/benefit estimate)."""
        return self.spec.deployment

    @property
    def builder(self) -> dict[str, Any]:
        """Backend builder options (kept apart from knobs)."""
        return self.spec.builder


_FORMAT_1_SPEC = {"release": "release.name", "release_version": "release.version",
                  "description": "release.description", "validation_path": "validation.path",
                  "backend": "tune.backend", "strategy": "tune.strategy",
                  "selection": "tune.selection", "metric": "tune.metric",
                  "threshold": "tune.threshold", "atol": "tune.atol", "rtol": "tune.rtol",
                  "timing": "timing", "shapes": "shapes", "deployment": "deployment",
                  "builder": "builder"}
"""Where each settings field of a format 1 header lives in the format 2 ``spec``."""


def _from_format_1(flat: dict[str, Any]) -> dict[str, Any]:
    """A format 1 header (the spec's settings as flat fields) as format 2 data."""
    data = {k: v for k, v in flat.items() if k not in _FORMAT_1_SPEC}
    spec: dict[str, Any] = {}
    for key, where in _FORMAT_1_SPEC.items():
        if key in flat:
            *parents, last = where.split(".")
            node = spec
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = flat[key]
    model = flat.get("model")
    if isinstance(model, dict) and "path" in model:
        spec["model"] = {"path": model["path"]}
    data["spec"] = spec
    data["cache_format"] = CACHE_FORMAT
    return data


class SessionRecord(_Model):
    """One run of ``tune`` or ``tune --continue`` over this cache."""

    kind: Literal["session"] = "session"
    """Record type tag."""
    started_at: str
    """UTC start, ISO 8601."""
    wall_s: float
    """Wall time of this run."""
    trials_run: int
    """Trials this run finished."""
    interrupted: bool
    """True when the run stopped early (Ctrl-C); the next --continue picks up from here."""
    recovered: bool = False
    """True for a run killed before it wrote this record (kill -9, a power cut): the next
    --continue wrote it from the times of the trials it finished (:func:`lost_session`), so
    its time after the last of them (the trial in flight) is not counted."""


def lost_session(cache: TuningCache, now: dt.datetime | None = None) -> SessionRecord | None:
    """The record of a run that finished trials but was killed before it wrote its own: the
    trials after the last session record, from the first one's start (the header's time when
    no session came before it) to the last one's end, at most ``now``. None when every trial
    belongs to a recorded session. Times that do not parse are left out; a crafted time moves
    at most this record's wall time (never below 0, never past now)."""
    last = max((i for i, r in enumerate(cache.records) if isinstance(r, SessionRecord)),
               default=-1)
    lost = [r for r in cache.records[last + 1:] if isinstance(r, TrialRecord)]
    if not lost:
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    timed = [(t, r.trial_s) for r in lost if (t := _when(r.started_at)) is not None]
    starts = [t for t, _ in timed]
    ends = [t + dt.timedelta(seconds=_seconds(s)) for t, s in timed]
    begun = (_when(cache.header.created_at) if last < 0 else None) or min(starts, default=None)
    if begun is None:
        return None
    begun = min(begun, now)
    end = min(max(ends, default=begun), now)
    return SessionRecord(started_at=begun.isoformat(timespec="seconds"),
                         wall_s=max((end - begun).total_seconds(), 0.0),
                         trials_run=sum(1 for r in lost if r.role != "confirm"),
                         interrupted=True, recovered=True)


def _seconds(value: float | None) -> float:
    """A record's duration as a timedelta takes it: 0 for none, a negative or a non-finite
    one, at most a year (a crafted 1e300 would overflow)."""
    if value is None or not math.isfinite(value) or value < 0:
        return 0.0
    return min(value, 366 * 86400.0)


def _when(text: str) -> dt.datetime | None:
    """An ISO 8601 time as an aware datetime (UTC when it names no zone); None when it is
    not one."""
    try:
        t = dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.timezone.utc)


class HoldoutRecord(_Model):
    """A route checked on the hold-out set, once the search had chosen it to ship (or, for the
    baseline, beside it): pairs the search never saw."""

    kind: Literal["holdout"] = "holdout"
    """Record type tag."""
    route: str
    """The route checked."""
    trial_index: int
    """The trial whose engine was checked."""
    passed: bool
    """Every loss of every hold-out pair below the threshold, no NaN or Inf."""
    reason: str | None = None
    """Why it failed (the first loss at or above the threshold, or the engine's failure)."""
    losses: dict[str, dict[str, float | None]] | None = None
    """Per hold-out pair, per output: the loss."""
    worst_loss: float | None = None
    """The largest finite loss."""
    pairs: int
    """Hold-out pairs."""


class DecisionRecord(Shipped):
    """The outcome of the search: which route ships and why."""

    # baseline_route, shipped_route, shipped_index, gain: declared by Shipped

    kind: Literal["decision"] = "decision"
    """Record type tag."""
    rule: str
    """The decision rule applied, in words."""
    speedup: float | None
    """Shipped route's speedup over the baseline (confirmation measurement), None for baseline."""
    speedup_ci_low: float | None
    """Lower end of its confidence interval."""
    speedup_ci_high: float | None
    """Upper end of its confidence interval."""
    p_value: float | None
    """p-value of the measurement that decided (the confirmation's test over processes)."""
    reason: str
    """Why this route ships, in a sentence."""
    runner_up_route: str | None = None
    """The next-best admissible candidate."""
    runner_up_speedup: float | None = None
    """Its speedup over the baseline."""
    candidates: list[str] = Field(default_factory=list)
    """Routes that were re-timed in the confirmation round."""
    aa: Reading | None = None
    """The run's calibration: the baseline against a second load of itself (trial 0)."""
    confirm_aa: Reading | None = None
    """The same check in the confirmation's measuring processes (None when it did not run)."""
    k: int | None = None
    """Candidates the confirmation tested (Bonferroni's k); None when it did not run."""
    level: float | None = None
    """The level each look first tested a candidate at: alpha / (k x looks); a candidate tested
    after others were confirmed was judged at a higher one (Holm's step-down), which its
    confirmation record keeps."""
    looks: list[int] | None = None
    """The process counts at which the confirmation could decide."""
    processes: int | None = None
    """Measuring processes the confirmation ran."""
    stopped: str | None = None
    """Why the confirmation stopped (every candidate decided, or the cap)."""
    aa_stops: bool = True
    """Whether a significant A/A reading stopped the release under the rule this decision was
    taken by: True in older records; today's confirmation tests each candidate against the A/A
    load instead, and no A/A reading stops a release."""
    holdout: HoldoutRecord | None = None
    """The shipped route's check on the hold-out set (None: the spec names no hold-out set)."""
    holdout_rejected: list[str] = Field(default_factory=list)
    """Confirmed routes that failed the hold-out set, and so did not ship."""
    estimator: Literal["median", "p10"] | None = None
    """What the shipped figure's per-round ratios were taken of (the reading that decided):
    block medians, or the blocks' 10th percentiles when a measurement was busier than the
    target declares (:mod:`dossier.measure.target`). None in older records (medians)."""
    busier_than_declared: int | None = None
    """Of the measurements the decision rests on, how many were busier than the target
    declares (None: not recorded)."""
    conditional_held: list[str] = Field(default_factory=list)
    """Confirmed routes held back as conditional: confirmed only busier than declared, and
    differing from the baseline only in knobs whose effect depends on the load."""
    conditional: bool = False
    """The shipped route is such a route, shipped because the spec opts in
    (``[target] conditional = "ship"``)."""
    scenario: bool = False
    """This decision is a server or offline scenario's: it follows the single-stream decision
    (the line before it that is a decision) and ships another serving configuration of the
    same engine file (routes that differ in load-time knobs only); the reader takes the last."""

    @property
    def comparable(self) -> bool:
        """Whether the figures hold for the declared target: no measurement the decision rests
        on was busier than declared, and no conditional route shipped."""
        return not self.busier_than_declared and not self.conditional

    def result_text(self) -> str:
        """``1.234x [1.100, 1.380] (p=0.0001)`` for a gain, else ``no significant gain``."""
        if not self.gain or self.speedup is None:
            return "no significant gain"
        figure = speedup_text(self.speedup, self.speedup_ci_low or 0.0,
                              self.speedup_ci_high or 0.0)
        return f"{figure} (p={self.p_value or 0.0:.2g})"


AnyRecord = TrialRecord | SessionRecord | DecisionRecord | HoldoutRecord
"""Every record a tuning cache holds after its header."""
Record = Annotated[AnyRecord, Field(discriminator="kind")]
_RECORD = TypeAdapter(Record)


R = TypeVar("R", bound=AnyRecord)


def resolve_levels(records: Sequence[R], alpha: float) -> list[R]:
    """``records`` with every speed reading's level resolved, once, as the tuning cache is read
    (records written before the level was kept hold none): a screening reading (the search's
    trials and the A/A of trial 0) and the confirmation's A/A were judged at ``alpha``; a
    confirmation candidate at alpha / k, k the routes the confirmation re-measured (the A/A not
    among them), as the rule of that time judged them. A reading that records its level keeps
    it; nothing else changes."""
    trials = [r for r in records if isinstance(r, TrialRecord)]
    if all(t.comparison is None or t.comparison.level is not None for t in trials):
        return list(records)
    base = next((t.route for t in trials if t.role == "baseline"), None)
    k = max(len({t.route for t in trials if t.role == "confirm" and t.route != base
                 and t.comparison is not None}), 1)

    def resolved(r: R) -> R:
        if not isinstance(r, TrialRecord) or r.comparison is None \
                or r.comparison.level is not None:
            return r
        level = alpha / k if r.role == "confirm" and r.route != base else alpha
        return cast(R, r.model_copy(update={"comparison": r.comparison.model_copy(
            update={"level": level})}))

    return [resolved(r) for r in records]



CACHE_MAX_BYTES = 1 << 30
"""The largest tuning cache read (1 GiB; a search of 100,000 trials writes about 200 MB)."""
CACHE_MAX_LINE = 16 << 20
"""The longest line of a tuning cache (16 MiB: a trial record with the losses of every pair)."""
CACHE_MAX_LINES = 1_000_000
"""The most lines a tuning cache holds (its header included)."""


class TuningCache:
    """Read and append to a tuning cache file."""

    def __init__(self, path: Path, header: CacheHeader,
                 records: list[AnyRecord],
                 lines: list[int] | None = None):
        self.path = Path(path)
        self.header = header
        self.records = records
        self.lines = list(lines) if lines is not None else list(range(2, len(records) + 2))
        """The line number (from 1, the header) of each record, for messages that name one."""

    @property
    def trials(self) -> list[TrialRecord]:
        """Finished trials in order."""
        return [r for r in self.records if isinstance(r, TrialRecord)]

    @property
    def sessions(self) -> list[SessionRecord]:
        """Runs of tune over this cache."""
        return [r for r in self.records if isinstance(r, SessionRecord)]

    @property
    def holdouts(self) -> list[HoldoutRecord]:
        """Hold-out checks, in order."""
        return [r for r in self.records if isinstance(r, HoldoutRecord)]

    @property
    def decision(self) -> DecisionRecord | None:
        """The decision, once the search has finished."""
        found = [r for r in self.records if isinstance(r, DecisionRecord)]
        return found[-1] if found else None

    @classmethod
    def create(cls, path: Path, header: CacheHeader) -> TuningCache:
        """Start a new cache file (refuses to overwrite one)."""
        path = Path(path)
        if path.exists():
            raise InputError(f"tuning cache {path} exists already",
                             hint="use --continue to resume it, or another --out")
        # written aside and linked into place: a kill never leaves a torn header behind
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with host_io(path, "writing the tuning cache header"), open(tmp, "w", encoding="utf-8") as f:
                f.write(header.model_dump_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # fails if another process created the cache meanwhile
        except FileExistsError:
            raise InputError(f"tuning cache {path} exists already",
                             hint="use --continue to resume it, or another --out") from None
        finally:
            tmp.unlink(missing_ok=True)
        return cls(path, header, [])

    @classmethod
    def open(cls, path: Path, *, repair: bool = False, whole: bool = False) -> TuningCache:
        """Read a cache, streamed within :data:`CACHE_MAX_BYTES`, :data:`CACHE_MAX_LINE` and
        :data:`CACHE_MAX_LINES`; opened without blocking (a FIFO is refused, never waited
        on). A torn last line is ignored (and cut off when ``repair``); with ``whole`` (a
        bundle's cache: a finished record) any byte after the last record is refused, a NUL
        tail included."""
        import stat

        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise InputError(f"cannot read tuning cache {path}: {exc.strerror}") from exc
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CacheMismatchError(f"{path} is not a regular file")
            if info.st_size > CACHE_MAX_BYTES:
                raise CacheMismatchError(f"{path} holds {info.st_size} bytes, more than the "
                                         f"{CACHE_MAX_BYTES >> 20} MiB a tuning cache may")
            first = f.readline(CACHE_MAX_LINE + 1)
            if not first.endswith(b"\n"):
                raise CacheMismatchError(
                    f"{path} is not a dossier tuning cache (no header line)"
                    if len(first) <= CACHE_MAX_LINE else
                    f"{path} line 1 is longer than {CACHE_MAX_LINE >> 20} MiB")
            header = _read_header(path, first)
            records: list[AnyRecord] = []
            numbers = []
            torn = b""
            for number, line in enumerate(iter(lambda: f.readline(CACHE_MAX_LINE + 1), b""),
                                          start=2):
                if len(line) > CACHE_MAX_LINE:
                    raise CacheMismatchError(f"{path} line {number} is longer than "
                                             f"{CACHE_MAX_LINE >> 20} MiB")
                if not line.endswith(b"\n"):  # text after the last newline: a torn write
                    torn = line
                    break
                if number > CACHE_MAX_LINES:
                    raise CacheMismatchError(f"{path} holds more than {CACHE_MAX_LINES} lines")
                if not line.strip():
                    continue
                try:
                    records.append(_RECORD.validate_json(line))
                    numbers.append(number)
                except ValidationError as exc:
                    raise CacheMismatchError(f"{path} line {number} is corrupt ({_first(exc)})") \
                        from exc
            end = f.tell()
        if torn and whole:
            raise CacheMismatchError(f"{path} holds {len(torn)} bytes after its last record "
                                     f"(line {len(numbers) + 2} has no end)",
                                     hint="a bundle's tuning cache is a finished record: "
                                     "dossier verify --integrity-only BUNDLE says what changed")
        if torn and repair:
            with open(path, "r+b") as f:
                f.truncate(end - len(torn))
        return cls(path, header, resolve_levels(records, header.timing.alpha), numbers)

    def append(self, record: AnyRecord) -> None:
        """Append one record, flushed and fsynced. A full disk raises DiskFullError and leaves
        at most a torn last line, which the next ``--continue`` cuts off."""
        with host_io(self.path, "appending to the tuning cache"), \
                open(self.path, "a", encoding="utf-8") as f:
            f.write(record.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)
        self.lines.append(self.lines[-1] + 1 if self.lines else 2)


def _read_header(path: Path, line: bytes) -> CacheHeader:
    """The header line, validated; one line naming the problem otherwise (a format this version
    does not read is named as such, before its fields are looked at)."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise CacheMismatchError(f"{path} is not a dossier tuning cache (its first line is not "
                                 f"JSON: {exc})") from exc
    found = data.get("cache_format") if isinstance(data, dict) else None
    if isinstance(found, int) and not isinstance(found, bool) and found not in READ_FORMATS \
            and data.get("kind") == "header":
        raise CacheMismatchError(
            f"{path} is a dossier tuning cache of format {found}; this dossier {__version__} "
            f"reads formats {', '.join(map(str, READ_FORMATS))}",
            hint="use the dossier version that wrote it, or a newer one")
    try:
        return CacheHeader.model_validate(data)
    except ValidationError as exc:
        if exc.errors()[0].get("loc", ())[:1] == ("spec",):
            raise CacheMismatchError(f"the header of tuning cache {path} does not hold a valid "
                                     f"release spec ({_first(exc)})") from exc
        raise CacheMismatchError(f"{path} is not a dossier tuning cache of format "
                                 f"{' or '.join(map(str, READ_FORMATS))} ({_first(exc)})") from exc


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "line"
    return f"{where}: {err.get('msg', 'invalid')}"


def read_header(path: Path) -> CacheHeader:
    """The header line of a cache, validated, without reading the records after it."""
    try:
        with open(path, "rb") as f:
            line = f.readline(CACHE_MAX_LINE + 1)
    except OSError as exc:
        raise InputError(f"cannot read tuning cache {path}: {exc.strerror}") from exc
    if not line.endswith(b"\n"):  # a torn first line, as TuningCache.open reads it
        raise CacheMismatchError(f"{path} is not a dossier tuning cache (no header line)")
    return _read_header(path, line)
