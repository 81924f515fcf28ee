"""The tuning cache: an append-only JSON Lines record of a search.

Line 1 is a :class:`CacheHeader` (what was searched, with digests of every input); each later
line is a :class:`~dossier.trial.TrialRecord`, a :class:`SessionRecord` (one per run of
``tune`` or ``tune --continue``, with its wall time), or the final :class:`DecisionRecord`.
Each line is written whole, flushed and fsynced before the search goes on, so a killed search
loses at most the trial in flight. A torn last line (the process died mid-write) is dropped on
resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from dossier.diskfull import host_io
from dossier.errors import CacheMismatchError, InputError
from dossier.spec import DeploymentSection, ShapeEntry
from dossier.timing import TimingSettings
from dossier.trial import Reading, TrialRecord

CACHE_FORMAT = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class FileIdentity(_Model):
    """A file by name, size and content digest."""

    path: str
    """Path as given (absolute at tuning time)."""
    size: int
    """Size in bytes."""
    digest: str
    """xxh3-128 of the content."""


class CacheHeader(_Model):
    """First line of a tuning cache: everything the search depends on."""

    kind: Literal["header"] = "header"
    """Record type tag."""
    cache_format: int = CACHE_FORMAT
    """Format version of this file."""
    tool_version: str
    """dossier version that started the search."""
    created_at: str
    """UTC time the search started, ISO 8601."""
    release: str
    """Release name from the spec."""
    release_version: int
    """Release version from the spec."""
    backend: str
    """Backend name."""
    tuner_version: str
    """Version of the knob source (ORT / torch / TensorRT tuner)."""
    knob_db_digest: str
    """xxh3-128 of the knob database."""
    selection: str
    """The selection, canonical trtexec syntax."""
    strategy: str
    """Strategy name."""
    metric: str
    """Loss metric."""
    threshold: float
    """A route is admissible when every loss is below this."""
    atol: float
    """Absolute tolerance (l0 only)."""
    rtol: float
    """Relative tolerance (l0 only)."""
    timing: TimingSettings
    """How trials are timed and compared."""
    model: FileIdentity
    """The model tuned."""
    validation_path: str
    """The validation set folder."""
    validation_digest: str
    """xxh3-128 over every tensor of the validation set."""
    validation_pairs: int
    """Number of validation pairs."""
    baseline_route: str
    """The baseline route (pinned knobs pinned, varied knobs at default)."""
    description: str = ""
    """Release description from the spec."""
    shapes: list[ShapeEntry] = Field(default_factory=list)
    """Shape distribution the release is tuned for."""
    deployment: DeploymentSection = DeploymentSection()
    """Expected use (for the cost/benefit estimate)."""
    builder: dict[str, Any] = Field(default_factory=dict)
    """Backend builder options (kept apart from knobs)."""
    warm_start: list[str] = Field(default_factory=list)
    """Routes measured first, before the strategy's own (a re-tune starts from the last
    release's best routes)."""
    parent: str | None = None
    """Dossier id of the bundle a re-tune started from."""
    spec_path: str | None = None
    """The release spec the search came from."""
    host: dict[str, str] = Field(default_factory=dict)
    """Summary of the tuning host (hostname, CPU, backend stack)."""


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


class DecisionRecord(_Model):
    """The outcome of the search: which route ships and why."""

    kind: Literal["decision"] = "decision"
    """Record type tag."""
    rule: str
    """The decision rule applied, in words."""
    baseline_route: str
    """The baseline route."""
    shipped_route: str
    """The route whose engine ships (the baseline when there is no significant gain)."""
    shipped_index: int
    """Trial index of the shipped engine."""
    gain: bool
    """True when a route other than the baseline ships: it beat the baseline significantly and
    by the minimum effect; or, in a search dossier did not run (a trtexec import, result "not
    statistically checked"), the other tool's rule chose it and nothing was shown."""
    speedup: float | None
    """Shipped route's speedup over the baseline (confirmation measurement), None for baseline."""
    speedup_ci_low: float | None
    """Lower end of its confidence interval."""
    speedup_ci_high: float | None
    """Upper end of its confidence interval."""
    p_value: float | None
    """Rank-test p-value of the confirmation measurement."""
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
    """The same check in the independent confirmation (None when it did not run)."""


Record = Annotated[TrialRecord | SessionRecord | DecisionRecord, Field(discriminator="kind")]
_RECORD = TypeAdapter(Record)


class TuningCache:
    """Read and append to a tuning cache file."""

    def __init__(self, path: Path, header: CacheHeader,
                 records: list[TrialRecord | SessionRecord | DecisionRecord],
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
    def open(cls, path: Path, *, repair: bool = False) -> TuningCache:
        """Read a cache. A torn last line is ignored (and cut off when ``repair``)."""
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read tuning cache {path}: {exc.strerror}") from exc
        lines = raw.split(b"\n")
        complete = lines[:-1]  # text after the last newline is a torn write
        torn = lines[-1]
        if not complete:
            raise CacheMismatchError(f"{path} is not a dossier tuning cache (no header line)")
        try:
            header = CacheHeader.model_validate_json(complete[0])
        except ValidationError as exc:
            raise CacheMismatchError(f"{path} is not a dossier tuning cache of format "
                                     f"{CACHE_FORMAT} ({_first(exc)})") from exc
        records = []
        numbers = []
        for number, line in enumerate(complete[1:], start=2):
            if not line.strip():
                continue
            try:
                records.append(_RECORD.validate_json(line))
                numbers.append(number)
            except ValidationError as exc:
                raise CacheMismatchError(f"{path} line {number} is corrupt ({_first(exc)})") from exc
        if torn and repair:
            with open(path, "r+b") as f:
                f.truncate(len(raw) - len(torn))
        return cls(path, header, records, numbers)

    def append(self, record: TrialRecord | SessionRecord | DecisionRecord) -> None:
        """Append one record, flushed and fsynced. A full disk raises DiskFullError and leaves
        at most a torn last line, which the next ``--continue`` cuts off."""
        with host_io(self.path, "appending to the tuning cache"), \
                open(self.path, "a", encoding="utf-8") as f:
            f.write(record.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)
        self.lines.append(self.lines[-1] + 1 if self.lines else 2)


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "line"
    return f"{where}: {err.get('msg', 'invalid')}"


def read_header_json(path: Path) -> dict:
    """The header line of a cache as plain JSON (for tools that only peek)."""
    with open(path, encoding="utf-8") as f:
        return json.loads(f.readline())
